"""A small reference block store for the DFSIO suite (HDFS-shaped, not HDFS-compatible).

- ``metaservice``: the namenode role -- namespace, block allocation and placement, persisted as JSON.
- ``datanode``: one per cluster node; stores blocks as files with a CRC per chunk, serves reads, and
  forwards writes down a replication pipeline over a reference transport (``tcp`` or ``shm``).
- ``client``: ``DfsClient`` -- create/append/open/truncate/delete; writes go through the pipeline with
  acknowledgements flowing back up and recover around a failed datanode; reads verify checksums.
- ``store``: ``BlockStore`` -- starts the metadata service and the datanodes on a cluster's nodes.

Checksums are CRC-32 (zlib's, the IEEE polynomial; Hadoop's ``CRC32`` checksum type) over every
``BYTES_PER_CHECKSUM`` = 512 bytes, HDFS's default chunk. HDFS defaults to CRC-32C, which the Python
standard library lacks; the chunking and verification points are the same.
"""

from .errors import ChecksumError, DfsError, DfsWriteError, NoSuchFile, ProtocolError  # noqa: F401
