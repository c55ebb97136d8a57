"""Bulk TCP interference: sinks that discard what they receive, sources that send as fast as TCP lets them.

Stands in for the Naiad experiment's Hadoop shuffle until the reference MapReduce shuffle can run over a
cluster's nodes (it cannot yet, so several plain bulk flows play its role: same traffic shape, many
large transfers filling the bottleneck queue at the default level).

    python -m pytest_hpcnet.workloads.qjump.bulk sink --host 10.199.0.2 --port 0  # announces listening
    python -m pytest_hpcnet.workloads.qjump.bulk source --host 10.199.0.2 --port P [--seconds S] [--priority LEVEL]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import time

from ...cluster.nodeprogram import announce, node_main, serve_until_signalled
from ...cluster.shaping import check_level, priority_value
from ...sockets import accept_in_background

CHUNK = 256 * 1024


def _drain(conn: socket.socket) -> None:
    buf = bytearray(CHUNK)
    # A source that was killed resets its connection: that ends the drain like a clean close.
    with conn, contextlib.suppress(OSError):
        while conn.recv_into(buf):
            continue


def sink(host: str, port: int) -> None:
    """Accept any number of flows and discard their bytes, until SIGTERM/SIGINT."""
    listener = socket.create_server((host, port), backlog=64)
    accept_in_background(listener, _drain, thread_per_connection=True, name="bulk-sink-accept")
    serve_until_signalled(listener.close, ready=lambda: announce(
        "listening", transport="tcp", address=(host, listener.getsockname()[1]), role="sink"))


def source(host: str, port: int, seconds: float | None = None, priority: int | None = None) -> int:
    """Send zeros until killed (or for ``seconds``); return the bytes sent."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    if priority is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, priority)
    sock.connect((host, port))
    announce("sending")
    data = memoryview(bytes(CHUNK))
    sent = 0
    end = None if seconds is None else time.monotonic() + seconds
    with sock:
        while end is None or time.monotonic() < end:
            sock.sendall(data)
            sent += CHUNK
    return sent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sink")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, default=0)
    p = sub.add_parser("source")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--priority", type=int, default=None, metavar="LEVEL")
    return node_main(parser, _run, argv, label="bulk")


def _run(args) -> int:
    if args.cmd == "sink":
        sink(args.host, args.port)
        return 0
    level = None if args.priority is None else priority_value(check_level(args.priority, "--priority"))
    announce("sent", bytes=source(args.host, args.port, args.seconds, level))
    return 0


if __name__ == "__main__":
    sys.exit(main())
