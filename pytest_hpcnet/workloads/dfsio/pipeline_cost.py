"""What the block store's write path costs in CPU, the measures its local claims gate on.

CPU time, not wall time: on a shared 2-core box a write's wall time measures the neighbours as much
as the pipeline (issue 13: wall-clock ratios moved by more than 20% between an idle and a loaded
box), while the CPU seconds a process spends per MB are what the design decides -- how many copies,
system calls and interpreter steps each packet takes.

- ``pipeline_cpu_ms_per_mb``: one file written through a pipeline of ``replication`` datanodes; the
  CPU milliseconds per MiB of the client (this process) plus every datanode (each reports its own
  ``time.process_time()``, every thread included, through the ``cpu`` op).
- ``checksum_cpu_ns_per_kib``: per-chunk checksums of a buffer computed in this thread, CPU ns per KiB.
"""

from __future__ import annotations

import os
import time

from ...reference.dfs import checksums
from ...reference.dfs.client import DfsClient

BUFFER = 1_000_000      # TestDFSIO's default -bufferSize


def datanode_cpu_s(client: DfsClient) -> dict[str, float]:
    """CPU seconds each datanode process has used so far (name -> seconds)."""
    out = {}
    for name, address in client.meta("datanodes")["datanodes"].items():
        reply = client._dn_request({"name": name, "address": address}, {"op": "cpu"})
        out[name] = float(reply["cpu_s"])
    return out


def pipeline_cpu_ms_per_mb(client: DfsClient, path: str, size_mb: int, replication: int) -> float:
    """Write ``size_mb`` MiB to ``path`` (then delete it); CPU ms per MiB of client and datanodes."""
    data = memoryview(os.urandom(BUFFER))
    before_dn, before = datanode_cpu_s(client), time.process_time()
    left = size_mb << 20
    with client.create(path, replication=replication) as out:
        while left:
            n = min(left, BUFFER)
            out.write(data[:n])
            left -= n
    spent = time.process_time() - before
    after_dn = datanode_cpu_s(client)
    spent += sum(after_dn[n] - before_dn.get(n, 0.0) for n in after_dn)
    client.delete(path)
    return spent * 1000 / size_mb


def checksum_cpu_ns_per_kib(kind: str, impl: str | None, size: int = 4 << 20, repeat: int = 4) -> float:
    """CPU ns per KiB of per-512-byte checksums of ``size`` random bytes (best of ``repeat``: the
    least disturbed pass; this thread's CPU time only)."""
    data = os.urandom(size)
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time_ns()
        checksums.chunk_sums(data, 512, kind, impl=impl)
        best = min(best, time.thread_time_ns() - start)
    return best / (size / 1024)
