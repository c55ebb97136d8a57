"""Speak the protocol of Hadoop's ``RPCCallBenchmark`` (hadoop-common tests jar), both ways.

Its server registers ``TestRpcService`` (protocol name below, version 1) whose ``echo`` takes
``EchoRequestProto{string message = 1}`` and returns ``EchoResponseProto{string message = 1}``. Our
echo messages carry ``bytes payload = 1``: the same field number and wire type, so the bytes on the
wire are identical as long as the payload is UTF-8 (the benchmark sends ``'x' * m``). So our server
only has to answer to that protocol name, and our client only has to name it.

``calls_per_second`` mirrors the benchmark's client side: ``clients`` threads, each with its own
connection (the benchmark gives each proxy its own user, hence its own connection), calling echo
back to back for ``seconds``.

``impl`` picks the implementation of our side (``python``, the default, or ``native``).
"""

from __future__ import annotations

import threading
import time

from .client import RpcClient
from .server import RpcServer   # noqa: F401 -- the Python server, for callers that name it

HADOOP_BENCH_PROTOCOL = "org.apache.hadoop.ipc.TestRpcBase$TestRpcService"


def bench_server(host: str = "127.0.0.1", port: int = 0, handlers: int = 4, impl: str = "python",
                 **kw) -> RpcServer:
    """An (unstarted) RPC server that Hadoop's RPCCallBenchmark client can drive."""
    from . import make_server
    return make_server(impl, host=host, port=port, handlers=handlers, protocol=HADOOP_BENCH_PROTOCOL, **kw)


def bench_client(address: tuple[str, int], impl: str = "python", **kw) -> RpcClient:
    """A client of Hadoop's RPCCallBenchmark server (or of ``bench_server``)."""
    from . import make_client
    return make_client(address, impl=impl, protocol=HADOOP_BENCH_PROTOCOL, **kw)


def calls_per_second(address: tuple[str, int], *, clients: int, seconds: float, msg_size: int,
                     impl: str = "python") -> float:
    """Echo calls completed per second by ``clients`` threads over ``seconds``; any failed call raises."""
    message = b"x" * msg_size
    conns = [bench_client(address, impl) for _ in range(clients)]
    counts = [0] * clients
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop(i: int) -> None:
        c = conns[i]
        try:
            while not stop.is_set():
                if c.echo(message) != message:
                    raise AssertionError(f"echo of {msg_size} bytes came back changed")
                counts[i] += 1
        except BaseException as e:   # reported to the caller below
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)]
    try:
        t0 = time.monotonic()
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        for c in conns:
            c.close()
    if errors:
        raise errors[0]
    return sum(counts) / elapsed
