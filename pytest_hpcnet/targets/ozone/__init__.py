"""Apache Ozone beside HDFS on separate daemons (issue 20, in progress): ``deployment`` starts HDFS, YARN
and one Ozone per layout as JVMs of their own on a cluster's nodes. Not registered as a target yet."""
