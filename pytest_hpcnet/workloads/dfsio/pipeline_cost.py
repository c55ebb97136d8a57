"""What the block store's write and read paths cost in CPU, the measures its local claims gate on.

CPU time, not wall time: on a shared 2-core box a write's wall time measures the neighbours as much
as the pipeline (issue 13: wall-clock ratios moved by more than 20% between an idle and a loaded
box), while the CPU seconds a process spends per MB are what the design decides -- how many copies,
system calls and interpreter steps each packet takes.

- ``pipeline_cpu_ms_per_mb``: one file written through a pipeline of ``replication`` datanodes; the
  CPU milliseconds per MiB of the client (this process) plus every datanode (each reports its own
  ``time.process_time()``, every thread included, through the ``cpu`` op).
- ``floor_cpu_ms_per_mb``: the same for the native core's block-write floor (``block_write_floor``:
  the design's copies and checksum passes, no protocol), both its threads.
- ``read_cpu_ms_per_mb``: one file read back whole by this process; CPU ms per MiB of it and every
  datanode. ``read_cost``: the same read by a fresh process (``timed_read``); the CPU of that process
  plus every datanode. ``read_floor_cpu_ms_per_mb``: the core's block-read floor (``block_read_floor``:
  checksums and ``sendfile`` one way, receive and verify the other), both its threads.
- ``pipeline_on_one_core``: this thread and every datanode process of the store on one CPU, so a
  write's CPU is the work of its ends and not the wake-ups between two CPUs.
- ``interleaved_checksum_cost``: per-chunk checksums of a buffer computed in this thread under two
  settings taking turns, CPU ns per KiB.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ...cluster.reaper import controller_id
from ...measure import Paired, floor_round, on_one_core, paired_in_processes
from ...reference.dfs import checksums
from ...reference.dfs import timed_read
from ...reference.dfs.client import DfsClient
from ...reference.dfs.errors import DfsError

BUFFER = 1_000_000      # TestDFSIO's default -bufferSize


def datanode_cpu_s(client: DfsClient) -> dict[str, float]:
    """CPU seconds each datanode process has used so far (name -> seconds)."""
    out = {}
    for name, address in client.meta("datanodes")["datanodes"].items():
        reply = client._dn_request({"name": name, "address": address}, {"op": "cpu"})
        out[name] = float(reply["cpu_s"])
    return out


def datanode_cpu_since(client: DfsClient, before: dict[str, float]) -> float:
    """CPU seconds every datanode has used since ``before`` (a ``datanode_cpu_s``)."""
    after = datanode_cpu_s(client)
    return sum(after[n] - before.get(n, 0.0) for n in after)


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
    spent = time.process_time() - before + datanode_cpu_since(client, before_dn)
    client.delete(path)
    return spent * 1000 / size_mb


def read_cpu_ms_per_mb(client: DfsClient, path: str, buffer: memoryview, size_mb: int) -> float:
    """Read ``path`` (``size_mb`` MiB) back whole into ``buffer``, again and again (``readinto``);
    CPU ms per MiB of this process and every datanode."""
    before_dn, before = datanode_cpu_s(client), time.process_time()
    got = 0
    with client.open(path) as src:
        while n := src.readinto(buffer):
            got += n
    spent = time.process_time() - before + datanode_cpu_since(client, before_dn)
    if got != size_mb << 20:
        raise DfsError(f"{path}: read {got} bytes of {size_mb << 20}")
    return spent * 1000 / size_mb


def read_cost(client: DfsClient, path: str, impl: str) -> tuple[int, float, float]:
    """(bytes, wall seconds, CPU seconds of the reading process and every datanode) of reading
    ``path`` back whole in a fresh process with an ``impl`` client (``timed_read``, as a TestDFSIO map
    task reads), on ``client``'s node and in this thread's CPU affinity."""
    before_dn = datanode_cpu_s(client)
    got, took, cpu, _ = timed_read.in_child(client.meta_address, client.transport_name, path, impl,
                                            node=client.node)
    return got, took, cpu + datanode_cpu_since(client, before_dn)


def read_floor_cpu_ms_per_mb(directory: Path, size_mb: int, packet: int) -> float:
    """The block-read floor reading ``size_mb`` MiB of a replica it writes into ``directory`` first, in
    ``packet``-byte packets; CPU ms per MiB of its two threads (its files are removed)."""
    from ...reference.native import core
    _, sender, receiver = core.block_read_floor(str(directory), size_mb << 20, packet)
    return (sender + receiver) * 1000 / size_mb


def floor_cpu_ms_per_mb(directory: Path, size_mb: int, packet: int) -> float:
    """The block-write floor writing ``size_mb`` MiB into ``directory`` in ``packet``-byte packets;
    CPU ms per MiB of its two threads (its files are removed)."""
    from ...reference.native import core
    _, sender, receiver = core.block_write_floor(str(directory), size_mb << 20, packet)
    return (sender + receiver) * 1000 / size_mb


def _datanode_processes(client: DfsClient) -> list[int] | None:
    """The pids of the store's datanode processes, or None unless every one runs on this host (its
    boot id, pid and start time as the datanode reports them, checked against /proc here)."""
    pids = []
    for name, address in client.meta("datanodes")["datanodes"].items():
        reply = client._dn_request({"name": name, "address": address}, {"op": "cpu"})
        process = str(reply.get("process", ""))
        pid = process.split(":")[1] if process.count(":") == 2 else ""
        if not pid.isdigit() or controller_id(int(pid)) != process:
            return None
        pids.append(int(pid))
    return pids


def _pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads it starts later inherit their creator's set)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):    # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


@contextlib.contextmanager
def pipeline_on_one_core(client: DfsClient) -> Iterator[bool]:
    """This thread (``on_one_core``) and every thread of each of ``client``'s datanodes on one CPU for
    the block; yields False, pinning nothing, where a datanode is on another host or the platform
    cannot pin. After, the datanodes get back the CPUs they had.

    Why: unpinned, a replication-1 write's CPU per MiB rose by a quarter beside two busy loops (run
    medians of its ratio to the floor 1.62-1.63 idle, 2.0 loaded), since each packet and its ack cost
    a wake-up on the other CPU and what that costs is the box's state; on one CPU the two ends take
    turns and the same runs measured 1.74-1.77 and 1.66."""
    pids = _datanode_processes(client) if hasattr(os, "sched_setaffinity") else None
    if not pids:
        yield False
        return
    before = {pid: os.sched_getaffinity(pid) for pid in pids}
    with on_one_core() as cpu:
        try:
            for pid in pids:
                _pin_process(pid, {cpu})
            yield True
        finally:
            for pid, cpus in before.items():
                with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                    _pin_process(pid, cpus)


CHECKSUM_METRIC = "dfsio.checksum.cpu_ns_per_kib"


def interleaved_checksum_cost(baseline: tuple[str, str], candidate: tuple[str, str], *, rounds: int,
                              processes: int = 6, size: int = 256 << 10, passes: int = 40) -> Paired:
    """Per-512-byte-chunk checksums of a ``size``-byte buffer under two ``(kind, impl)`` settings,
    taking turns pass by pass (A B, B A, ...): per round, the cheapest of ``passes`` passes of each, in
    CPU ns per KiB of the computing thread; the rounds are spread over ``processes`` fresh processes,
    run one after the other.

    Why this shape (measured on this project's 2-core VM):
    - long passes of each side in turn (4 MiB, the best of 4 of one, then of the other) gave
      native/Python ratios of 0.08 on an idle box and 0.11 at load 11-19: a neighbour's cache traffic
      and time slices land on a 4 ms Python pass far more often than on a 0.4 ms native one. Short
      passes over a buffer that stays in L2 (256 KiB), alternated so both sides see the same CPU
      state, each side's cheapest pass being one nothing disturbed, gave 0.064-0.072 from idle to
      load 12 (busy loops and a memory-copy loop beside it);
    - but about one process in ten kept its own ratio, 0.078-0.082, in every round (with a fresh
      buffer each round too): a state of the process (where its memory and threads landed), not of
      the moment. Spreading the rounds over processes keeps one such process from deciding a verdict.
    """
    return paired_in_processes(_checksum_rounds, ((baseline, candidate), size, passes), rounds=rounds,
                               processes=processes, baseline_name=checksum_config(*baseline),
                               candidate_name=checksum_config(*candidate), metric=CHECKSUM_METRIC)


def _checksum_rounds(first: int, rounds: int, sides, size: int, passes: int) -> list[tuple[float, float]]:
    """``rounds`` paired rounds in this process (see ``interleaved_checksum_cost``)."""
    data = memoryview(os.urandom(size))
    kib = size / 1024
    clock = time.thread_time_ns
    paths = [checksum_path(*side) for side in sides]
    for path in paths:   # warm-up: the buffer in cache, the code paths taken once
        path(data)

    def timed(path):
        def one() -> float:
            start = clock()
            path(data)
            return (clock() - start) / kib
        return one
    baseline, candidate = (timed(path) for path in paths)
    return [floor_round(baseline, candidate, passes, r) for r in range(first, first + rounds)]


def checksum_path(kind: str, impl: str):
    """The function computing a buffer's 512-byte-chunk checksums under one setting: ``impl`` is
    ``python`` or ``native`` (``checksums.chunk_sums``), or ``floor``, the CPU's bare CRC32C
    instruction loop (``crc32c_instruction_floor`` in the native core: CRC32C only)."""
    if impl != "floor":
        return lambda data: checksums.chunk_sums(data, 512, kind, impl=impl)
    if kind != "crc32c":
        raise ValueError(f"the instruction floor computes CRC32C, not {kind}")
    from ...reference.native import core
    return lambda data: core.crc32c_instruction_floor(data, 512)


def checksum_config(kind: str, impl: str) -> str:
    """The configuration name a checksum measurement is recorded under (``checksum=crc32c,impl=native``)."""
    return f"checksum={kind},impl={impl}"
