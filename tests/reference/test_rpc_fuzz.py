"""Seeded fuzzing: >= 10,000 malformed connections and frames at a server process while a good client
keeps calling. The server must not crash, must answer every good call, and its memory must stay
bounded (VmRSS from /proc, measured after a warm-up and at the end). Both implementations: the Python
server and the native core's (skipped, with the reason, where it is not built)."""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.rpc import RpcClient
from pytest_hpcnet.reference.rpc import wire

MALFORMED = 10_000
WARMUP = 1_000
MAX_DATA_LENGTH = 1 << 20


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(params=["python", "native"])
def server_process(request):
    if request.param == "native" and not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_hpcnet.reference.rpc.cli", "serve", "--port", "0", "--handlers", "4",
         "--max-data-length", str(MAX_DATA_LENGTH), "--impl", request.param],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on tcp "), line
        host, port = line.split()[3].rsplit(":", 1)
        yield proc, (host, int(port))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _context(rng) -> bytes:
    body = b"".join(wire.delimited(wire.request_header(-3, rng.randbytes(16)),
                                   wire.connection_context("fuzz", wire.ECHO_PROTOCOL)))
    return struct.pack(">I", len(body)) + body


def _call(rng, call_id: int) -> bytes:
    rh = wire.RequestHeaderProto(methodName="echo", declaringClassProtocolName=wire.ECHO_PROTOCOL,
                                 clientProtocolVersion=1)
    body = b"".join(wire.delimited(wire.request_header(call_id, rng.randbytes(16)), rh,
                                   wire.EchoRequestProto(payload=rng.randbytes(rng.randrange(64)))))
    return struct.pack(">I", len(body)) + body


def _mutate(rng, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def _malformed(rng) -> tuple[bytes, int]:
    """One malformed connection's bytes, and how many malformed frames/preambles it carries."""
    kind = rng.randrange(8)
    if kind == 0:   # random preamble
        return rng.randbytes(rng.randrange(0, 16)), 1
    if kind == 1:   # right magic, wrong version or auth
        return b"hrpc" + bytes([rng.choice([0, 7, 8, 10, 255]), 0, rng.choice([0, 0xDF, 81])]), 1
    if kind == 2:   # garbage frame instead of the context
        return wire.PREAMBLE + struct.pack(">I", 20) + rng.randbytes(20), 1
    if kind == 3:   # garbage packet after a good context
        n = rng.randrange(1, 200)
        return wire.PREAMBLE + _context(rng) + struct.pack(">I", n) + rng.randbytes(n), 1
    if kind == 4:   # announced length over the limit
        return wire.PREAMBLE + _context(rng) + struct.pack(">I", rng.randrange(MAX_DATA_LENGTH + 1, 1 << 32)), 1
    if kind == 5:   # truncated packet, then the client goes away
        return wire.PREAMBLE + _context(rng) + _call(rng, 0)[:-rng.randrange(1, 10)], 1
    if kind == 6:   # several mutated calls on one connection (some are ERRORs that keep it open)
        calls = [_mutate(rng, _call(rng, i)) for i in range(rng.randrange(2, 6))]
        return wire.PREAMBLE + _context(rng) + b"".join(calls), len(calls)
    return _mutate(rng, wire.PREAMBLE + _context(rng) + _call(rng, 0)), 1   # mutated anywhere


def _fuzz(address, seed: int, budget: int, counter: list) -> None:
    rng = random.Random(seed)
    while counter[0] < budget:
        data, frames = _malformed(rng)
        try:
            with socket.create_connection(address, timeout=5) as s:
                s.sendall(data)
                if rng.random() < 0.5:   # sometimes read what the server says, sometimes just leave
                    s.shutdown(socket.SHUT_WR)
                    s.settimeout(2)
                    try:
                        while s.recv(65536):
                            pass
                    except (socket.timeout, OSError):
                        pass
        except OSError:
            pass
        counter[0] += frames


def test_fuzzed_server_keeps_answering_and_memory_stays_bounded(server_process):
    proc, address = server_process
    good = {"calls": 0, "failures": []}
    stop = threading.Event()

    def good_client():
        rng = random.Random(1)
        with RpcClient(address, timeout=10) as c:
            while not stop.is_set():
                payload = rng.randbytes(rng.randrange(1, 4096))
                try:
                    if c.echo(payload) != payload:
                        good["failures"].append("wrong echo")
                except Exception as e:   # noqa: BLE001 -- every failure is a test failure
                    good["failures"].append(repr(e))
                    return
                good["calls"] += 1
                time.sleep(0.001)   # a steady caller, not one that starves the fuzzers of the GIL

    counter = [0]
    _fuzz(address, 0, WARMUP, counter)        # warm-up: thread stacks, pools, caches
    rss_warm = _rss_kib(proc.pid)
    caller = threading.Thread(target=good_client)
    caller.start()
    fuzzers = [threading.Thread(target=_fuzz, args=(address, seed, MALFORMED, counter))
               for seed in range(1, 5)]
    for t in fuzzers:
        t.start()
    for t in fuzzers:
        t.join(120)
    stop.set()
    caller.join(30)
    time.sleep(0.5)   # let the server finish closing what the fuzzers left
    rss_end = _rss_kib(proc.pid)

    assert counter[0] >= MALFORMED
    assert proc.poll() is None, "server process died"
    assert good["failures"] == [] and good["calls"] > 0
    with RpcClient(address, timeout=10) as c:
        assert c.echo(b"after the storm") == b"after the storm"
    growth_mib = (rss_end - rss_warm) / 1024
    print(f"fuzz: {counter[0]} malformed, {good['calls']} good calls, RSS {rss_warm} -> {rss_end} KiB")
    assert growth_mib < 32, f"server RSS grew by {growth_mib:.1f} MiB"
