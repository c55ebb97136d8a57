"""Apache Hadoop as a target: jars or HADOOP_HOME (``runtime``), a one-box MiniCluster (``minicluster``),
its benchmark programs and their outputs (``jobs``), YARN application records (``yarn``), and the
registered ``hadoop`` target with ``-D`` configurations (``target``)."""

from . import target  # noqa: F401  (registers "hadoop")
