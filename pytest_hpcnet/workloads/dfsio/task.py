"""One DFSIO map task, run on a node: ``python -m pytest_hpcnet.workloads.dfsio.task '<json>'``.

Does the I/O of one file the way TestDFSIO's mappers do, times it from opening the file to closing it
(``perf_counter_ns``), and prints one JSON line: name, size (bytes processed), time_ms, node.

- write/append: ``-size`` bytes in ``-bufferSize`` writes of a buffer filled with '0' + i % 50.
- read: sequentially until ``-size`` bytes or the end of the file.
- random/backward/skip read: ``-bufferSize`` reads at positions chosen by TestDFSIO's rule until
  ``-size`` bytes were read: random = uniform in [0, file size); skip = 0, then previous +
  bufferSize + skipSize (stops at the end); backward = file size - bufferSize, then previous +
  skipSize (= -bufferSize), never below 0.
- truncate: to ``-size`` bytes; the size processed is what was cut off.
- ``verify`` (our addition): check read bytes against the write pattern, outside the timed section.
  Valid for files written by -write with the same -bufferSize.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from ...cluster.nodeprogram import node_main
from .fs import CompressedWriter, DecompressedReader, open_fs


class VerifyError(Exception):
    pass


def pattern(buffer_size: int) -> bytes:
    """TestDFSIO's write buffer: byte i is '0' + i % 50."""
    return (bytes(range(48, 98)) * (buffer_size // 50 + 1))[:buffer_size]


class _Verifier:
    """Checks read data against the pattern: the byte at file offset o was written as
    '0' + (o % bufferSize) % 50."""

    def __init__(self, buffer_size: int, enabled: bool, name: str):
        self.bs, self.enabled, self.name, self.ns = buffer_size, enabled, name, 0
        self.twice = pattern(buffer_size) * 2 if enabled else b""

    def check(self, pos: int, data: bytes) -> None:
        if not self.enabled or not data:
            return
        t0 = time.perf_counter_ns()
        for start in range(0, len(data), self.bs):      # compare bufferSize-long windows
            piece = data[start:start + self.bs]
            at = (pos + start) % self.bs
            want = self.twice[at:at + len(piece)]
            if piece != want:
                i = next(k for k in range(len(piece)) if piece[k] != want[k])
                raise VerifyError(f"{self.name}: byte {pos + start + i} is {piece[i]:#04x}, "
                                  f"written as {want[i]:#04x}")
        self.ns += time.perf_counter_ns() - t0


def run_task(spec: dict) -> dict:
    fs = open_fs(spec["fs"], os.environ.get("HPCNET_NODE"))
    op, name, size, bs = spec["op"], spec["name"], int(spec["size"]), int(spec["buffer_size"])
    codec = spec.get("compression")
    verifier = _Verifier(bs, bool(spec.get("verify")), name)
    try:
        t0 = time.perf_counter_ns()
        if op in ("write", "append"):
            done = _write(fs, op, name, size, bs, codec)
        elif op == "read":
            done = _read(fs, name, size, bs, codec, verifier)
        elif op in ("random read", "backward read", "skip read"):
            done = _random_read(fs, name, size, bs, int(spec.get("skip_size", 0)), verifier,
                                random.Random(spec.get("seed")))
        elif op == "truncate":
            before = fs.size(name)
            fs.truncate(name, size)
            done = before - size
        elif op == "clean":
            fs.clean()
            done = 0
        else:
            raise ValueError(f"unknown task op {op!r}")
        elapsed = time.perf_counter_ns() - t0 - verifier.ns
    finally:
        fs.close()
    return {"name": name, "size": done, "time_ms": elapsed / 1e6, "node": os.environ.get("HPCNET_NODE", "")}


def _write(fs, op: str, name: str, size: int, bs: int, codec) -> int:
    buf = memoryview(pattern(bs))
    out = fs.create(name) if op == "write" else fs.append(name)
    if codec:
        out = CompressedWriter(out, codec)
    try:
        remaining = size
        while remaining > 0:
            n = min(bs, remaining)
            out.write(buf[:n])
            remaining -= n
    except BaseException:
        getattr(out, "abort", lambda: None)()
        raise
    out.close()
    return size


def _read(fs, name: str, size: int, bs: int, codec, verifier: _Verifier) -> int:
    src = fs.open(name)
    if codec:
        src = DecompressedReader(src, codec, bs)
    # as TestDFSIO's read loop: one buffer of bufferSize, filled again and again (``readinto``) where the
    # source can; the block store's native client receives straight into it
    readinto = getattr(src, "readinto", None)
    buf = memoryview(bytearray(bs)) if readinto else None
    done = 0
    try:
        while done < size:
            data = buf[:readinto(buf)] if readinto else src.read(bs)
            if not data:
                break
            verifier.check(done, data)
            done += len(data)
    finally:
        src.close()
    return done


def _random_read(fs, name: str, size: int, bs: int, skip: int, verifier: _Verifier, rnd) -> int:
    file_size = fs.size(name)
    if file_size <= 0:
        raise ValueError(f"{name} is empty; nothing to read at random positions")

    def next_offset(current: int) -> int:
        if skip == 0:
            return rnd.randrange(file_size)
        if skip > 0:
            return 0 if current < 0 else current + bs + skip
        return max(0, file_size - bs) if current < 0 else max(0, current + skip)

    src = fs.open(name)
    done = 0
    try:
        pos = next_offset(-1)
        while done < size:
            data = src.pread(pos, bs)
            if not data:          # Hadoop's read returns -1 at the end of the file
                break
            verifier.check(pos, data)
            done += len(data)
            pos = next_offset(pos)
    finally:
        src.close()
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description="one DFSIO map task")
    parser.add_argument("spec", help="the task as JSON (op, name, size, buffer size, file system, ...)")
    return node_main(parser, _run, argv, label="dfsio task")


def _run(args) -> int:
    spec = json.loads(args.spec)
    try:
        result = run_task(spec)
    except Exception as e:  # one line for the job driver to show, not a traceback
        print(f"{spec.get('op')}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
