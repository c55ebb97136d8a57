"""One whole read of a block-store file, timed, in a process of its own:

    python -m pytest_hpcnet.reference.dfs.timed_read '[[host, port], transport, path, impl, buffer, node]'

prints ``[bytes, seconds, CPU seconds, minor page faults]`` of reading ``path`` front to back into one
reused buffer of ``buffer`` bytes (TestDFSIO's read loop), every chunk verified. ``in_child`` runs it
and returns the four numbers; the block store's read benchmark and the native vs Python read-client
claims measure through it.

Why a process of its own: a TestDFSIO map task reads in a fresh process, and a read's cost depends
on the process's state -- one that has already moved megabytes allocates differently (glibc raises
its mmap threshold once a large block is freed), which hides most of what the Python client's
per-message buffers cost. Why this module imports only the client: a reading process that imported
the benchmark's module read about a third slower natively (why was not found), so the child carries
nothing a map task would not.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from .client import DfsClient

BUFFER = 1_000_000          # TestDFSIO's default buffer size


def timed_read(meta, transport: str, path: str, impl: str, buffer: int = BUFFER,
               node: str | None = None) -> list:
    """[bytes, seconds, CPU seconds, minor page faults of this process] of one whole read of ``path``
    (a fault is a page of memory the process touched for the first time: what fresh buffers cost)."""
    buf = memoryview(bytearray(buffer))
    with DfsClient(tuple(meta), transport, node=node, impl=impl) as client:
        start, cpu, faults = time.perf_counter(), time.process_time(), _minor_faults()
        src, got = client.open(path), 0
        while n := src.readinto(buf):
            got += n
        return [got, time.perf_counter() - start, time.process_time() - cpu, _minor_faults() - faults]


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def in_child(meta, transport: str, path: str, impl: str, buffer: int = BUFFER,
             node: str | None = None, timeout: float = 300.0) -> tuple[int, float, float, int]:
    """``timed_read`` in a fresh Python process; (bytes, seconds, CPU seconds, minor page faults). The
    child inherits this thread's CPU affinity (a caller pinned to one CPU reads on it)."""
    args = json.dumps([list(meta), transport, path, impl, buffer, node])
    child = subprocess.run([sys.executable, "-m", __name__, args], capture_output=True, text=True,
                           timeout=timeout)
    if child.returncode:
        lines = child.stderr.strip().splitlines() or [f"exit status {child.returncode}"]
        raise RuntimeError(f"timed read of {path} ({impl}) failed: {lines[-1]}")
    got, took, cpu, faults = json.loads(child.stdout)
    return int(got), float(took), float(cpu), int(faults)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    print(json.dumps(timed_read(*json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
