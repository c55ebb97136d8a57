"""Barrier-sync latency: the Naiad latency test's measurement, as one small process per node.

Every process connects to every other (a full TCP mesh, Nagle off). A round: send one small message to
each peer, then wait for each peer's message of the same round; the round's latency is the time from
the start of sending until the last peer's message arrived. Rounds run back to back, so all processes
move in lockstep, and a message held up anywhere delays the round for everyone, as in Naiad.

    python -m pytest_hpcnet.workloads.qjump.barrier --rank 0 --peers 10.199.0.1:2101,10.199.0.2:2101 \
        --rounds 10001 --out node0.bs [--priority 7] [--size 64] [--warmup 0]

``--priority LEVEL`` puts every socket (listener, accepted and connected) at that QJump level (see
``cluster.shaping``). Output: a ``.bs`` file, one latency in milliseconds per round.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

from ...cluster.nodeprogram import announce, node_main
from ...cluster.shaping import check_level, priority_value
from ...errors import ConfigError
from ...report.bsfile import DEFAULT_SAMPLES, write_bs
from ...sockets import recv_exact

_HELLO = struct.Struct(">I")
_ROUND = struct.Struct(">Q")
MIN_SIZE = _ROUND.size


def parse_peers(text: str) -> list[tuple[str, int]]:
    peers = []
    for item in text.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"peer {item!r} is not HOST:PORT", "--peers")
        peers.append((host, int(port)))
    if len(peers) < 2:
        raise ConfigError("a barrier needs at least two peers", "--peers")
    return peers


def _tune(sock: socket.socket, priority: int | None, timeout: float) -> None:
    sock.settimeout(timeout)
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if priority is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, priority)


def connect_mesh(rank: int, peers: list[tuple[str, int]], priority: int | None = None,
                 timeout: float = 30.0) -> dict[int, socket.socket]:
    """Rank i accepts from higher ranks and connects to lower ones; returns peer rank -> socket."""
    deadline = time.monotonic() + timeout
    listener = socket.socket(socket.AF_INET6 if ":" in peers[rank][0] else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _tune(listener, priority, timeout)
    listener.bind(peers[rank])
    listener.listen(len(peers))
    conns: dict[int, socket.socket] = {}
    try:
        for other in range(rank):
            conns[other] = _connect(peers[other], deadline, priority, timeout)
            conns[other].sendall(_HELLO.pack(rank))
        while len(conns) < len(peers) - 1:
            listener.settimeout(max(0.01, deadline - time.monotonic()))
            conn, _ = listener.accept()
            _tune(conn, priority, timeout)
            hello = bytearray(_HELLO.size)
            recv_exact(conn, memoryview(hello))
            (other,) = _HELLO.unpack(hello)
            if not rank < other < len(peers) or other in conns:
                conn.close()  # a stray or duplicate connection: not part of this barrier
                continue
            conns[other] = conn
    except BaseException:
        for c in conns.values():
            c.close()
        raise
    finally:
        listener.close()
    return conns


def _connect(address, deadline: float, priority: int | None, timeout: float) -> socket.socket:
    delay = 0.01
    while True:
        sock = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_STREAM)
        _tune(sock, priority, timeout)  # before connect: the handshake already runs at the level
        try:
            sock.connect(address)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def run_rounds(conns: dict[int, socket.socket], rounds: int, size: int = 64, warmup: int = 0) -> list[float]:
    """Barrier rounds over an established mesh; latencies in milliseconds (warm-up rounds dropped)."""
    peers = [conns[k] for k in sorted(conns)]
    message = bytearray(max(size, MIN_SIZE))
    reply = bytearray(len(message))
    view = memoryview(reply)
    out = []
    clock = time.perf_counter_ns
    for r in range(warmup + rounds):
        _ROUND.pack_into(message, 0, r)
        t0 = clock()
        for s in peers:
            s.sendall(message)
        for s in peers:
            recv_exact(s, view)
            if _ROUND.unpack_from(reply)[0] != r:
                raise ConnectionError(f"round {r}: a peer sent round {_ROUND.unpack_from(reply)[0]}")
        t1 = clock()
        if r >= warmup:
            out.append((t1 - t0) / 1e6)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--peers", required=True, help="HOST:PORT of every rank, in rank order")
    parser.add_argument("--rounds", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--size", type=int, default=64, help=f"message bytes (at least {MIN_SIZE})")
    parser.add_argument("--priority", type=int, default=None, metavar="LEVEL", help="QJump level 0..7")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a peer")
    parser.add_argument("--out", required=True, help="the .bs file to write")
    return node_main(parser, _run, argv, label="barrier")


def _run(args) -> int:
    peers = parse_peers(args.peers)
    if not 0 <= args.rank < len(peers):
        raise ConfigError(f"rank {args.rank} is not in 0..{len(peers) - 1}", "--rank")
    if args.rounds < 1 or args.warmup < 0:
        raise ConfigError("rounds must be >= 1 and warmup >= 0", "--rounds/--warmup")
    priority = None if args.priority is None else priority_value(check_level(args.priority, "--priority"))
    conns = connect_mesh(args.rank, peers, priority, args.timeout)
    announce("connected")
    try:
        latencies = run_rounds(conns, args.rounds, args.size, args.warmup)
    finally:
        for c in conns.values():
            c.close()
    write_bs(args.out, latencies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
