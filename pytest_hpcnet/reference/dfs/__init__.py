"""A small reference block store for the DFSIO suite (HDFS-shaped, not HDFS-compatible).

- ``metaservice``: the namenode role -- namespace, block allocation and placement, persisted as JSON.
- ``datanode``: one per cluster node; stores blocks as files with a CRC per chunk, serves reads, and
  forwards writes down a replication pipeline over a reference transport (``tcp`` or ``shm``).
- ``client``: ``DfsClient`` -- create/append/open/truncate/delete; writes go through the pipeline with
  acknowledgements flowing back up and recover around a failed datanode; reads verify checksums.
- ``store``: ``BlockStore`` -- starts the metadata service and the datanodes on a cluster's nodes.

Checksums are one CRC over every ``BYTES_PER_CHECKSUM`` = 512 bytes, HDFS's default chunk, of the
type the writer picks (``checksums``): CRC-32C by default (HDFS's ``dfs.checksum.type`` default) where
the native core computes it, else CRC-32 (zlib's; a pure-Python CRC-32C is far too slow to measure with). Each replica's meta file records its type. Datanodes run the packet pipeline in the
native core (``impl=native``, ``native.py``) or in Python (``impl=python``); both speak the same wire
format and mix in one pipeline.
"""

from .errors import ChecksumError, DfsError, DfsWriteError, NoSuchFile, ProtocolError  # noqa: F401
