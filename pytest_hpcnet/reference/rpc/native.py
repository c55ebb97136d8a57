"""``impl=native``: the compiled Hadoop IPC v9 client and server (``native/src``) behind the
interfaces of ``RpcClient`` and ``RpcServer``.

- ``NativeRpcClient``: one tcp connection, concurrent calls matched by call id; every call releases
  the GIL while it waits. ``echo_samples`` times echo calls inside the core (per-call samples in us).
- ``NativeRpcServer``: one event-driven reader thread (epoll through mio) for all connections, not a
  thread per connection; the built-in ``echo`` and ``ping`` are answered there without entering
  Python. Every other method goes through a bounded call queue to ``handlers`` Python threads (the
  handler pool), which run the registered handler and hand the response back to the reader. The
  resource bounds are the Python server's: ``max_connections``, the pending-handshake bound,
  ``handshake_timeout``, ``idle_timeout``, ``max_data_length`` (no buffer beyond it, grown only as
  bytes arrive), and ``write_timeout`` for a peer that takes no responses.

Over tcp, shm (``native/src/shm.rs``: the Python shm transport's rings, doorbells and handshake, so
either side may be Python) and verbs (``native/src/verbs``: the pyverbs transport's protocol, with
libibverbs/librdmacm loaded at run time; ``native_verbs_unavailable()`` says why it cannot run here --
built without rdma-core's headers, or the libraries do not load -- and ``impl=native`` with
``transport=verbs`` is then refused with that reason). Both buffer
designs exist natively (``native/src/buffers.rs``) with the Python designs' counters: ``pooled`` reads
into a connection's reused buffer, parses in place and encodes responses straight into the write
buffer; ``naive`` copies every message out to a fresh buffer and joins every outgoing one into
another. ``NativeRpcClient.buffers.stats`` and ``NativeRpcServer.buffer_stats`` give the counters as
``BufferStats`` (the server's: all its connections together).
"""

from __future__ import annotations

import atexit
import getpass
import logging
import threading
import uuid
import weakref
from typing import Callable

from google.protobuf.message import DecodeError

from ...errors import ConfigError
from .. import native
from ..buffers import BUFFERS, BufferStats
from . import wire
from .client import TypedCalls
from .errors import RpcConnectionLost, RpcFatalError, RpcRemoteError, RpcTimeout
from .server import IDLE_THRESHOLD

log = logging.getLogger("pytest_hpcnet.rpc.native")
E = wire.RpcResponseHeaderProto


NATIVE_TRANSPORTS = ("tcp", "shm", "verbs")


def native_verbs_unavailable() -> str | None:
    """Why the native core cannot speak verbs here (one line), or None."""
    if not native.AVAILABLE:
        return native.WHY_NOT
    why = getattr(native.core, "verbs_unavailable", None)
    if why is None:
        return "this build of the native core predates native verbs; rebuild it"
    return why()


def check_config(transport: str, buffers: str) -> None:
    native.require()
    if transport not in NATIVE_TRANSPORTS:
        raise ConfigError(f"impl=native speaks {', '.join(NATIVE_TRANSPORTS)}, not {transport!r}; use "
                          "impl=python for it", where="impl")
    if transport == "verbs":
        why = native_verbs_unavailable()
        if why:
            raise ConfigError(f"impl=native cannot speak verbs here: {why}", where="impl")
    if buffers not in BUFFERS:
        raise ConfigError(f"unknown buffer design {buffers!r}; choose one of {sorted(BUFFERS)}",
                          where="buffers")


def _verbs_host(host: str) -> str:
    """rdma_cm needs this machine's RDMA address for loopback/wildcard hosts, as the pyverbs transport."""
    from ..transport.verbs import rdma_host
    return rdma_host(host)


def _raise(e: Exception):
    kind, class_name, message, detail = e.args
    if kind == "timeout":
        raise RpcTimeout(message) from None
    if kind == "lost":
        raise RpcConnectionLost(message) from None
    if kind == "fatal":
        raise RpcFatalError(class_name, message, detail) from None
    raise RpcRemoteError(class_name, message, detail) from None


class _NativeBuffers:
    """``conn.buffers`` of a native connection: its design's name and its counters."""

    def __init__(self, name: str, stats):
        self.name, self._stats = name, stats

    @property
    def stats(self) -> BufferStats:
        return BufferStats(**self._stats())


class NativeRpcClient(TypedCalls):
    """``RpcClient``'s interface over the native client (tcp)."""

    impl = "native"

    def __init__(self, address: tuple[str, int], transport: str = "tcp", buffers: str = "pooled",
                 protocol: str = wire.ECHO_PROTOCOL, timeout: float = 30.0, connect_timeout: float = 10.0,
                 user: str | None = None, max_data_length: int = wire.MAX_DATA_LENGTH,
                 client_id: bytes | None = None):
        check_config(transport, buffers)
        self.address, self.protocol, self.timeout = tuple(address), protocol, timeout
        self.transport, self._buffers = transport, buffers
        self.client_id = client_id or uuid.uuid4().bytes
        self.max_data_length = max_data_length
        host = _verbs_host(str(self.address[0])) if transport == "verbs" else self.address[0]
        try:
            self._c = native.core.Client(host, int(self.address[1]), self.client_id,
                                         user or _user(), protocol, connect_timeout, max_data_length,
                                         buffers, transport)
        except native.core.NativeError as e:
            _raise(e)
        self._buffer_view = _NativeBuffers(buffers, self._c.buffer_stats)

    @property
    def buffers(self) -> _NativeBuffers:
        return self._buffer_view

    def call_raw(self, method: str, request_bytes: bytes, timeout: float | None = None) -> bytes:
        try:
            return self._c.call(method, request_bytes, self.timeout if timeout is None else timeout)
        except native.core.NativeError as e:
            _raise(e)

    def echo(self, payload: bytes, timeout: float | None = None) -> bytes:
        try:
            return self._c.echo(payload, self.timeout if timeout is None else timeout)
        except native.core.NativeError as e:
            _raise(e)

    def echo_samples(self, size: int, iterations: int, warmup: int = 0) -> list[float]:
        """Round-trip times (us) of ``iterations`` echo calls of ``size`` bytes, timed in the core."""
        try:
            return self._c.echo_samples(size, iterations, warmup, self.timeout)
        except native.core.NativeError as e:
            _raise(e)

    def echo_for(self, size: int, seconds: float) -> int:
        """Echo calls of ``size`` bytes back to back for ``seconds``, in the core: how many completed."""
        try:
            return self._c.echo_for(size, seconds, self.timeout)
        except native.core.NativeError as e:
            _raise(e)

    def ping(self, timeout: float | None = None) -> None:
        self.call("ping", wire.EmptyRequestProto(), wire.EmptyResponseProto, timeout)

    def send_ping(self) -> None:
        try:
            self._c.send_ping()
        except native.core.NativeError as e:
            _raise(e)

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> "NativeRpcClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Method:
    __slots__ = ("request_type", "handler")

    def __init__(self, request_type: type, handler: Callable):
        self.request_type, self.handler = request_type, handler


class NativeRpcServer:
    """``RpcServer``'s interface over the native server (tcp). ``register`` adds Python methods;
    ``echo`` and ``ping`` are built in and native. Listens from construction (``address``)."""

    impl = "native"

    def __init__(self, transport: str = "tcp", host: str = "127.0.0.1", port: int = 0,
                 buffers: str = "pooled", handlers: int = 4, max_data_length: int = wire.MAX_DATA_LENGTH,
                 protocol: str = wire.ECHO_PROTOCOL, handshake_timeout: float = 10.0,
                 write_timeout: float = 30.0, queue_size_per_handler: int = 100, dispatch: str = "auto",
                 max_connections: int = 1024, idle_timeout: float = 20.0, eager_limit: int | None = None,
                 idle_threshold: int = IDLE_THRESHOLD):
        check_config(transport, buffers)
        if handlers < 1:
            raise ConfigError(f"need at least one handler, got {handlers}", where="handlers")
        self.transport_name, self.buffers, self.dispatch = transport, buffers, dispatch
        self.max_data_length, self.protocol = max_data_length, protocol
        self.methods: dict[str, _Method] = {}
        self._n_handlers = handlers
        if transport == "verbs":
            host = _verbs_host(host)
        try:
            self._s = native.core.Server(host, port, protocol, max_data_length, max_connections, 4096,
                                         handshake_timeout, idle_timeout, write_timeout,
                                         handlers * queue_size_per_handler, buffers, transport,
                                         idle_threshold)
        except OSError as e:
            from ..transport import TransportError
            raise TransportError(str(e)) from None
        self.address = tuple(self._s.address)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        _LIVE.add(self)

    def register(self, name: str, request_type: type, handler: Callable, inline: bool = False) -> None:
        """Serve ``name`` from Python: ``handler(request) -> response message``; an exception becomes
        ERROR. ``echo`` and ``ping`` stay native."""
        if name in ("echo", "ping"):
            raise ConfigError(f"{name!r} is built into the native server", where="register")
        self.methods[name] = _Method(request_type, handler)

    def start(self) -> "NativeRpcServer":
        if self._threads:
            raise RuntimeError("this NativeRpcServer is already started (`with NativeRpcServer(...)` starts it)")
        for i in range(self._n_handlers):
            t = threading.Thread(target=self._handle, name=f"rpc-native-handler-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info("native rpc server on %s %s:%s", self.transport_name, *self.address)
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._s.stop()
        _LIVE.discard(self)
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> "NativeRpcServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def connections(self) -> int:
        return self._s.connections

    @property
    def counters(self) -> dict:
        return self._s.counters()

    @property
    def buffer_stats(self) -> BufferStats:
        return BufferStats(**self._s.buffer_stats())

    @property
    def closed_reasons(self) -> dict:
        return self._s.closed_reasons()

    def _handle(self) -> None:
        s = self._s
        while not self._stopping.is_set():
            call = s.next_call(0.2)
            if call is None:
                continue
            conn, call_id, retry, name, body = call
            method = self.methods.get(name)
            if method is None:
                s.respond_error(conn, call_id, retry, "org.apache.hadoop.ipc.RpcNoSuchMethodException",
                                f"unknown method {name} of {self.protocol}", E.ERROR_NO_SUCH_METHOD)
                continue
            try:
                request = method.request_type.FromString(body)
                if not request.IsInitialized():
                    raise DecodeError("missing required fields: "
                                      + ", ".join(request.FindInitializationErrors()))
            except (DecodeError, ValueError, RuntimeError) as e:
                s.respond_fatal(conn, call_id, f"cannot parse {method.request_type.__name__}: {e}",
                                E.FATAL_DESERIALIZING_REQUEST)
                continue
            try:
                response = method.handler(request).SerializeToString()
            except Exception as e:
                cls = type(e)
                s.respond_error(conn, call_id, retry, f"{cls.__module__}.{cls.__qualname__}", str(e),
                                E.ERROR_APPLICATION)
                continue
            s.respond(conn, call_id, retry, response)


_LIVE: "weakref.WeakSet[NativeRpcServer]" = weakref.WeakSet()


@atexit.register
def _stop_live_servers() -> None:
    """Servers nobody stopped stop before the interpreter goes: a handler thread must not be inside
    the core when Python finalizes."""
    for server in list(_LIVE):
        server.stop()


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "hpcnet"
