"""Raw TCP ping-pong between two nodes: the physical floor the RPC suite is compared against.

The server echoes fixed-size messages; the client times each round trip with ``perf_counter_ns`` and
prints the samples as JSON. Both ends run on cluster nodes through their launchers. Messages are
length-prefixed (4 bytes, big-endian) so one connection can sweep several payload sizes.

``transport="verbs"`` (native only) runs the same ping-pong over the native core's verbs endpoint
(eager sends, credits, the RPC's waits; metric ``verbs.pingpong.rtt``): between perftest's
``ib_send_lat`` and the native RPC echo, it says what the endpoint costs and what the RPC adds.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

from ..cluster.nodeprogram import announce, await_ready, node_main, serve_until_signalled
from ..cluster.pool import Launchers, finish
from ..errors import ConfigError
from ..measure import Measurement, measurement
from ..sockets import accept_in_background, recv_exact

METRIC = "socket.pingpong.rtt"
METRICS = {"tcp": METRIC, "verbs": "verbs.pingpong.rtt"}
DEFAULT_SIZES = (1, 64, 1024, 4096, 16384, 65536)
_LEN = struct.Struct(">I")
MAX_SIZE = 64 << 20


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _announce(host: str, port: int, impl: str, transport: str = "tcp") -> None:
    announce("listening", transport=transport, address=(host, port), impl=impl)


def serve(host: str, port: int) -> None:
    """Echo messages until SIGTERM/SIGINT; one connection at a time is all a ping-pong needs."""
    listener = socket.create_server((host, port))

    def handle(conn: socket.socket) -> None:
        with conn:
            _tune(conn)
            _echo(conn)

    accept_in_background(listener, handle, thread_per_connection=False, name="floor-accept")
    serve_until_signalled(listener.close, ready=lambda: _announce(host, listener.getsockname()[1], "python"))


def serve_native(host: str, port: int) -> None:
    """The same echo server from the native core (``impl=native``): no interpreter on the server side
    of a ping-pong; runs until SIGTERM/SIGINT."""
    from ..reference import native
    native.require("--impl")
    server = native.core.FloorServer(host, port)
    serve_until_signalled(server.stop, ready=lambda: _announce(host, server.address[1], "native"))


def serve_native_verbs(host: str, port: int) -> None:
    """The ping-pong over the native verbs endpoint, on this host's RDMA address."""
    from ..reference import native
    from ..reference.transport.verbs import rdma_host
    native.require("--transport verbs")
    server = native.core.VerbsFloorServer(rdma_host(host), port)
    serve_until_signalled(server.stop, ready=lambda: _announce(host, server.address[1], "native", "verbs"))


def _echo(conn: socket.socket) -> None:
    header = bytearray(4)
    buf = bytearray(65536)
    try:
        while True:
            recv_exact(conn, memoryview(header))
            (size,) = _LEN.unpack(header)
            if size > MAX_SIZE:
                return  # garbage or a hostile peer: drop the connection, keep serving
            if size > len(buf):
                buf = bytearray(size)
            view = memoryview(buf)[:size]
            recv_exact(conn, view)
            conn.sendall(header)
            conn.sendall(view)
    except (ConnectionError, OSError):
        return


def pingpong(host: str, port: int, sizes, iterations: int, warmup: int) -> dict[int, list[float]]:
    """Round-trip times in microseconds per payload size."""
    out: dict[int, list[float]] = {}
    with socket.create_connection((host, port), timeout=30) as sock:
        _tune(sock)
        for size in sizes:
            message = _LEN.pack(size) + bytes(size)
            reply = bytearray(4 + size)
            view = memoryview(reply)
            samples = []
            for i in range(warmup + iterations):
                t0 = time.perf_counter_ns()
                sock.sendall(message)
                recv_exact(sock, view)
                t1 = time.perf_counter_ns()
                if i >= warmup:
                    samples.append((t1 - t0) / 1000.0)
            out[size] = samples
    return out


def run(launchers: Launchers, server, client, *, sizes=DEFAULT_SIZES, iterations: int = 1000,
        warmup: int = 100, network: str = "eth", timeout: float = 300, impl: str = "python",
        transport: str = "tcp") -> list[Measurement]:
    """Start the echo server on ``server``, the timing client on ``client``; return one Measurement per size.
    ``impl="native"``: both ends from the native core (config ``<transport>/<network>,impl=native``),
    the floor the native RPC is read against; ``transport="verbs"`` needs it."""
    if transport not in METRICS:
        raise ConfigError(f"the ping-pong runs over {' or '.join(METRICS)}, not {transport!r}", where="transport")
    if transport == "verbs" and impl != "native":
        raise ConfigError("the verbs ping-pong is the native core's: impl=native", where="impl")
    host = server.address(network)
    srv = launchers.start(server, [sys.executable, "-m", __name__, "serve", "--host", host, "--port", "0",
                                   "--impl", impl, "--transport", transport])
    try:
        port = await_ready(srv).port
        cli = launchers.start(client, [sys.executable, "-m", __name__, "ping", "--host", host,
                                       "--port", str(port), "--sizes", ",".join(map(str, sizes)),
                                       "--iterations", str(iterations), "--warmup", str(warmup),
                                       "--impl", impl, "--transport", transport])
        out, _ = finish(cli, timeout)
    finally:
        srv.kill()
    results = json.loads(out)
    config = f"{transport}/{network}" if impl == "python" else f"{transport}/{network},impl=native"
    return [measurement(METRICS[transport], samples, unit="us", direction="lower", config=config,
                        nodes=(client.name, server.name),
                        params={"size": int(size), "round_trip": True})
            for size, samples in results.items()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--impl", choices=["python", "native"], default="python")
    s.add_argument("--transport", choices=list(METRICS), default="tcp")
    p = sub.add_parser("ping")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--impl", choices=["python", "native"], default="python")
    p.add_argument("--transport", choices=list(METRICS), default="tcp")
    return parser


def _run(args) -> int:
    if args.transport == "verbs" and args.impl != "native":
        raise ConfigError("the verbs ping-pong is the native core's: --impl native", where="--transport")
    if args.cmd == "serve":
        if args.transport == "verbs":
            serve_native_verbs(args.host, args.port)
        else:
            (serve_native if args.impl == "native" else serve)(args.host, args.port)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.impl == "native":   # timed inside the core
        from ..reference import native
        native.require("--impl")
        if args.transport == "verbs":
            from ..reference.transport.verbs import rdma_host
            host = rdma_host(args.host)
            out = {size: native.core.verbs_pingpong(host, args.port, size, args.iterations, args.warmup)
                   for size in sizes}
        else:
            out = {size: native.core.pingpong(args.host, args.port, size, args.iterations, args.warmup)
                   for size in sizes}
    else:
        out = pingpong(args.host, args.port, sizes, args.iterations, args.warmup)
    json.dump(out, sys.stdout)
    return 0


def main(argv=None) -> int:
    return node_main(_parser(), _run, argv, label="socket floor")


if __name__ == "__main__":
    sys.exit(main())
