"""``hpcnet rpc serve`` and ``hpcnet rpc ping``: run the reference server, time echo calls against one."""

from __future__ import annotations

import argparse
import sys
import time

from ...cluster.nodeprogram import announce, run_guarded, serve_until_signalled
from ...cluster.reaper import start_watchdog
from ...errors import ConfigError
from ..buffers import BUFFERS
from ..transport import TRANSPORTS, TransportError
from .errors import RpcError


def add_commands(subparsers) -> None:
    rpc = subparsers.add_parser("rpc", help="reference Hadoop-IPC-compatible RPC server and client")
    sub = rpc.add_subparsers(dest="rpc_command", required=True, metavar="ACTION")

    impl_help = ("native: the compiled core (tcp, shm; the default where it is built); python: the "
                 "readable reference (every transport)")
    serve = sub.add_parser("serve", help="run an RPC server (echo + ping) until SIGINT/SIGTERM")
    serve.add_argument("--impl", choices=["native", "python"], default=None, help=impl_help)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=0, help="0 picks a free port (default)")
    serve.add_argument("--transport", choices=sorted(TRANSPORTS), default="tcp")
    serve.add_argument("--buffers", choices=sorted(BUFFERS), default="pooled")
    serve.add_argument("--handlers", type=int, default=4)
    serve.add_argument("--dispatch", choices=["auto", "pool", "direct"], default="auto",
                       help="pool: every call via the handler pool (Hadoop's shape); auto (default): "
                            "readers run the cheap built-ins (echo, ping) themselves; direct: readers run all")
    serve.add_argument("--max-data-length", type=int, default=None,
                       help="ipc.maximum.data.length in bytes (default 128 MiB)")
    serve.add_argument("--max-connections", type=int, default=None,
                       help="connections served at once (default 1024)")
    serve.add_argument("--handshake-timeout", type=float, default=10.0,
                       help="seconds a connection has to send its preamble and context (default 10)")
    serve.add_argument("--idle-timeout", type=float, default=None,
                       help="seconds a connection may stay without a call (default 20, as Hadoop)")
    serve.add_argument("--idle-threshold", type=int, default=None,
                       help="idle connections are closed only while more than this many are open "
                            "(default 512; Hadoop's ipc.client.idlethreshold)")
    serve.set_defaults(func=serve_command)

    ping = sub.add_parser("ping", help="call echo COUNT times and print round-trip latency statistics")
    ping.add_argument("--impl", choices=["native", "python"], default=None, help=impl_help)
    ping.add_argument("address", metavar="HOST:PORT")
    ping.add_argument("--size", type=int, default=64, help="payload bytes (default 64)")
    ping.add_argument("--count", type=int, default=1000)
    ping.add_argument("--warmup", type=int, default=100)
    ping.add_argument("--transport", choices=sorted(TRANSPORTS), default="tcp")
    ping.add_argument("--buffers", choices=sorted(BUFFERS), default="pooled")
    ping.add_argument("--timeout", type=float, default=10.0, help="per-call timeout in seconds")
    ping.set_defaults(func=ping_command)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    return int(text)


def parse_address(text: str, where: str = "HOST:PORT") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"expected HOST:PORT, got {text!r}", where=where)
    return host.strip("[]"), int(port)


NATIVE_DEFAULT = ("tcp", "shm")   # where --impl defaults to native (verbs: by name only)


def _impl(args: argparse.Namespace, command: str) -> str:
    """``--impl``, else native where it is built and is the default for the transport, else python --
    and then one line on stderr says why (the native core is not built here, or the transport is verbs,
    where the native core is chosen only by name: the paper claims' verbs configurations are pyverbs).
    ``--impl native`` where it cannot run is refused in words (``ConfigError``)."""
    from .. import native
    if args.impl is not None:
        return native.resolve_impl(args.impl, where="--impl")
    why = native.WHY_NOT if not native.AVAILABLE else (
        "" if args.transport in NATIVE_DEFAULT else
        f"the native core is the default for {' and '.join(NATIVE_DEFAULT)} only, not {args.transport} "
        "(--impl native picks it)")
    if why:
        print(f"hpcnet rpc {command}: impl=python: {why}", file=sys.stderr, flush=True)
        return "python"
    return "native"


def serve_command(args: argparse.Namespace) -> int:
    start_watchdog()   # exits when the controller that started it is gone (see cluster.reaper)
    from . import make_server
    from .server import IDLE_THRESHOLD, IDLE_TIMEOUT, MAX_CONNECTIONS
    from .wire import MAX_DATA_LENGTH

    try:
        impl = _impl(args, "serve")
        server = make_server(impl, transport=args.transport, host=args.host, port=args.port,
                             buffers=args.buffers, handlers=args.handlers, dispatch=args.dispatch,
                             max_data_length=args.max_data_length or MAX_DATA_LENGTH,
                             max_connections=args.max_connections or MAX_CONNECTIONS,
                             handshake_timeout=args.handshake_timeout,
                             idle_timeout=args.idle_timeout or IDLE_TIMEOUT,
                             idle_threshold=IDLE_THRESHOLD if args.idle_threshold is None
                             else args.idle_threshold).start()
    except TransportError as e:
        raise ConfigError(str(e), where="--host/--port") from None
    serve_until_signalled(server.stop, ready=lambda: announce(
        "listening", transport=args.transport, address=server.address, buffers=args.buffers,
        handlers=args.handlers, dispatch=args.dispatch, impl=impl))
    return 0


def ping_command(args: argparse.Namespace) -> int:
    from ...measure import summarize   # imported here: it pulls in scipy, which `serve` does not need
    from . import make_client

    from .wire import MAX_DATA_LENGTH

    address = parse_address(args.address)
    if not 0 <= args.size <= MAX_DATA_LENGTH:
        raise ConfigError(f"payload bytes must be 0..{MAX_DATA_LENGTH} (the RPC message limit), got {args.size}",
                          where="--size")
    if args.count < 1:
        raise ConfigError(f"must be at least 1, got {args.count}", where="--count")
    if args.warmup < 0:
        raise ConfigError(f"must be 0 or more, got {args.warmup}", where="--warmup")
    if not args.timeout > 0:
        raise ConfigError(f"seconds must be above 0, got {args.timeout:g}", where="--timeout")
    payload = bytes(args.size)
    impl = _impl(args, "ping")
    try:
        with make_client(address, impl=impl, transport=args.transport, buffers=args.buffers,
                         timeout=args.timeout, connect_timeout=args.timeout) as client:
            samples = []
            if impl == "native":   # timed inside the core: no interpreter in a timed call
                samples = client.echo_samples(args.size, args.count, args.warmup)
            for _ in range(args.warmup if impl == "python" else 0):
                client.echo(payload)
            for _ in range(args.count if impl == "python" else 0):
                t0 = time.perf_counter()
                reply = client.echo(payload)
                samples.append((time.perf_counter() - t0) * 1e6)
                if len(reply) != args.size:
                    print(f"hpcnet rpc ping: echo returned {len(reply)} bytes, sent {args.size}",
                          file=sys.stderr)
                    return 1
    except RpcError as e:
        print(f"hpcnet rpc ping: {args.address}: {e}", file=sys.stderr)
        return 1
    except OSError as e:   # refused, reset, unreachable: the address or the server, not this command
        print(f"hpcnet rpc ping: {args.address}: {e.strerror or e}", file=sys.stderr)
        return 1
    s = summarize(samples)
    print(f"echo {args.transport}://{address[0]}:{address[1]} size={args.size} B "
          f"iterations={s['n']} impl={impl} round-trip latency (us)")
    labels = {"p99_9": "p99.9"}
    print("  ".join(f"{labels.get(k, k)}={s[k]:.1f}"
                    for k in ("min", "median", "mean", "stdev", "p99", "p99_9", "max")))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pytest_hpcnet.reference.rpc.cli serve|ping ...``: the same commands as ``hpcnet rpc``
    without importing every other area's commands (a server starts in a fraction of the time)."""
    parser = argparse.ArgumentParser(prog="hpcnet")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rpc", *(sys.argv[1:] if argv is None else argv)])
    return run_guarded(lambda: args.func(args), "hpcnet rpc")


if __name__ == "__main__":
    sys.exit(main())
