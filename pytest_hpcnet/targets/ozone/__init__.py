"""Apache Ozone beside HDFS on separate Hadoop daemons (seed 002): the ``ozone`` target."""

from . import target  # noqa: F401  (registers "ozone")
