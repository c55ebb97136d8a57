"""An RPC server shaped like Hadoop's ``ipc.Server``: listener, readers, handler pool, responder.

- The *listener* thread accepts connections and starts a *reader* for each (Hadoop multiplexes
  connections over a few selector readers; a Python thread per connection is the plain equivalent).
- A reader checks the preamble and the connection context, then decodes packets into calls and puts
  them on the bounded call queue (a full queue blocks the reader: back-pressure, as in Hadoop).
- *Handler* threads run calls and write the response straight away when the connection is free;
  otherwise they hand it to the *responder*, which writes it when the connection's writer finishes,
  so one slow client never ties up a handler. Calls of one connection run concurrently, and responses
  go out in completion order, matched by call id.

Dispatch (``dispatch=``): ``"pool"`` is Hadoop's shape exactly -- every call goes reader -> call queue
-> handler. ``"auto"`` (the default) lets the reader run a method registered ``inline=True`` itself
(the built-in echo and ping: cheap, never blocking) and queues everything else. The hand-off to a
handler thread costs two thread wake-ups and GIL transfers per call, which measured 20-40 us of a
~130 us 64-byte echo on a 2-core box; a cheap method gains nothing from running elsewhere, and a
slow or blocking one still goes to the pool, so readers are never tied up by application code.
``"direct"`` runs every method in its reader (one connection's calls then run one at a time).

The SUCCESS response header is spliced from per-connection constant bytes and the call id
(``wire.success_header_bytes``) instead of a protobuf object per call; errors still use protobuf.
On the way in, a request header of the usual shape (the connection's client id, retryCount -1, a
non-negative call id) is recognised by its constant bytes, and the RequestHeaderProto bytes of known
methods are looked up in a small per-connection cache; anything else is parsed with protobuf.

Errors: a method that raises -> ERROR (exception class + message), connection stays. Anything that
breaks the framing or the protocol -> FATAL where the protocol allows a response (the client has sent
a valid preamble), then close, with the reason logged and counted in ``closed_reasons``.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from google.protobuf.message import DecodeError

from ...timeouts import scaled
from ..transport import FrameTooLarge, TransportClosed, TransportError, TransportTimeout, get_transport
from ..serving import Limits, Server
from . import wire

log = logging.getLogger("pytest_hpcnet.rpc.server")
E = wire.RpcResponseHeaderProto


@dataclass
class Method:
    request_type: type
    handler: Callable   # request message -> response message
    inline: bool = False   # cheap and non-blocking: a reader may run it itself (dispatch="auto")

DISPATCH_MODES = ("auto", "pool", "direct")
# Resource limits. The server speaks Hadoop's "simple" authentication (none), so anyone who reaches it
# is served; these bound what one peer, or a thousand, can make it hold.
MAX_CONNECTIONS = 1024          # reader threads (connections past their connection context)
MAX_PENDING = 4096              # connections still sending their preamble and context (no thread)
IDLE_TIMEOUT = 20.0             # Hadoop: a connection idle for 2 x ipc.client.connection.maxidletime
# Like Hadoop's server (ipc.client.idlethreshold, 4000 there, with no connection cap), idle connections
# are closed only while the server holds more than this many: a client that opened its connections and
# has not called yet (110 of them in the conformance suite, connected slowly under emulation) keeps
# them, while peers that park connections can never hold the server at its cap.
IDLE_THRESHOLD = MAX_CONNECTIONS // 2
MAX_CONTEXT_LENGTH = 64 * 1024  # the connection context is a few dozen bytes
EAGER_LIMIT = 64 * 1024         # larger messages: the buffer grows as their bytes arrive
MAX_KNOWN_METHODS = 32
# How long a reader's receive waits before it looks at the stop flag again. stop() closes every
# connection, which ends a waiting receive at once on every transport, so this only bounds how often an
# idle connection's reader wakes: with a hundred idle verbs connections, waking twice a second each
# cost a good part of the guest's (emulated) CPU.
READ_WAIT = 5.0
_PLAIN_PREFIX = wire.request_header_prefix()


def _plain_call_id(header: memoryview, suffix: bytes | None) -> int | None:
    """The call id of a request header that is exactly our usual shape -- RPC_PROTOCOL_BUFFER,
    RPC_FINAL_PACKET, a non-negative callId, this connection's clientId, retryCount -1 -- else None
    (then protobuf parses it and every check runs)."""
    if suffix is None or header[:5] != _PLAIN_PREFIX:
        return None
    zz = shift = 0
    pos = 5
    while pos < 10 and pos < len(header):
        b = header[pos]
        pos += 1
        zz |= (b & 0x7F) << shift
        if not b & 0x80:
            if zz & 1 or header[pos:] != suffix:   # odd zigzag = negative id: ping, context, bad
                return None
            return zz >> 1
        shift += 7
    return None


@dataclass
class _Call:
    conn: "_ServerConnection"
    call_id: int
    retry_count: int
    method: Method
    method_name: str
    request: object


class _Fatal(Exception):
    def __init__(self, code: int, reason: str, call_id: int = wire.INVALID_CALL_ID):
        super().__init__(reason)
        self.code, self.call_id = code, call_id


class _ServerConnection:
    def __init__(self, server: "RpcServer", conn):
        self.server, self.conn = server, conn
        self.write_lock = threading.Lock()
        self.client_id = b""
        self.user = self.protocol = ""
        self.open = True
        self.success_suffix = wire.success_header_suffix(b"")   # set again once the client id is known
        self.request_suffix = None                              # ditto, for incoming request headers
        self.known_methods: dict[bytes, tuple[Method, str]] = {}   # RequestHeaderProto bytes -> method

    def respond(self, parts: list, in_handler: bool) -> None:
        if not self.open:
            return
        if in_handler and not self.write_lock.acquire(blocking=False):
            self.server._responder_queue.put((self, parts))
            return
        if not in_handler:
            self.write_lock.acquire()
        try:
            self.conn.send(parts, timeout=self.server.write_timeout)
        except TransportError as e:
            self.close(f"writing a response failed: {e}")
        finally:
            self.write_lock.release()

    def conn_busy(self) -> bool:
        """A response is being written (a slow call's answer is not idleness)."""
        return self.write_lock.locked()

    def close(self, reason: str) -> None:
        if self.open:
            self.open = False
            self.server._closed(self, reason)
        self.conn.close()


class _HadoopGate:
    """Stage 1 for the RPC server (``serving.Server``): wait, without a thread, until a connection has
    sent its 7-byte preamble and its whole connection context (at most ``MAX_CONTEXT_LENGTH``), or
    something that cannot be one; then hand every byte back to the connection and start its reader,
    which judges them exactly as before. No credentials: Hadoop's ``simple`` mode."""

    def __init__(self, server: "RpcServer", timeout: float):
        self.server, self.timeout = server, timeout

    def start(self):
        return _Preamble()

    def blocking(self, conn, timeout: float) -> bool:   # shm, verbs: the reader's own timeouts apply
        return True

    def refuse(self, conn, reason: str) -> None:
        with self.server._lock:
            self.server.closed_reasons[("handshake timeout" if "within" in reason else reason).split(":")[0]] += 1
        log.info("closed connection %s before its context: %s", getattr(conn, "peer", "?"), reason)


class _Preamble:
    ok = True
    reply = b""
    rest = b""
    reason = ""

    def __init__(self):
        self.pushback = b""
        self.done = False

    def greeting(self) -> bytes:
        return b""

    def feed(self, data: bytes) -> None:
        self.pushback += data
        buf, n = self.pushback, len(wire.PREAMBLE)
        if buf[:4] != wire.PREAMBLE_MAGIC[:len(buf)] or len(buf) >= n and buf[4:n] != wire.PREAMBLE[4:]:
            self.done = True                      # not ours: the reader says why and closes
        elif len(buf) >= n + 4:
            length = int.from_bytes(buf[n:n + 4], "big")
            self.done = length > MAX_CONTEXT_LENGTH or len(buf) >= n + 4 + length


class RpcServer:
    """``RpcServer(transport="tcp", host="127.0.0.1", port=0).start()``; ``address``; ``stop()``."""

    def __init__(self, transport: str = "tcp", host: str = "127.0.0.1", port: int = 0,
                 buffers: str = "pooled", handlers: int = 4, max_data_length: int = wire.MAX_DATA_LENGTH,
                 protocol: str = wire.ECHO_PROTOCOL, handshake_timeout: float | None = None,
                 write_timeout: float | None = None, queue_size_per_handler: int = 100, dispatch: str = "auto",
                 max_connections: int = MAX_CONNECTIONS, idle_timeout: float = IDLE_TIMEOUT,
                 eager_limit: int = EAGER_LIMIT, idle_threshold: int = IDLE_THRESHOLD):
        from ...errors import ConfigError
        if handlers < 1:
            raise ConfigError(f"need at least one handler, got {handlers}", where="handlers")
        if dispatch not in DISPATCH_MODES:
            raise ConfigError(f"unknown dispatch mode {dispatch!r}; choose one of {list(DISPATCH_MODES)}",
                              where="dispatch")
        self.dispatch = dispatch
        self.transport_name, self.buffers = transport, buffers
        self._transport = get_transport(transport)
        self._listener = self._transport.listen(host, port, buffers=buffers)
        self.address = tuple(self._listener.address)
        self.max_data_length, self.protocol = max_data_length, protocol
        # the handshake follows the client's connect, whose budget is scaled (pytest_hpcnet.timeouts):
        # so is this one; a write that cannot finish in 30 s means a stuck client, on any machine
        self.handshake_timeout = scaled(10.0) if handshake_timeout is None else handshake_timeout
        self.write_timeout = 30.0 if write_timeout is None else write_timeout
        self.idle_timeout, self.eager_limit = idle_timeout, eager_limit
        self.idle_threshold = idle_threshold
        self._limits = Limits(max_connections=max_connections, max_pending=MAX_PENDING,
                              handshake_timeout=self.handshake_timeout, idle_timeout=idle_timeout)
        self._server = Server(self._listener, self._read_connection, "rpc server", self._limits,
                              gate=_HadoopGate(self, self.handshake_timeout))
        self.methods: dict[str, Method] = {
            "echo": Method(wire.EchoRequestProto, lambda r: wire.EchoResponseProto(payload=r.payload),
                           inline=True),
            "ping": Method(wire.EmptyRequestProto, lambda r: wire.EmptyResponseProto(), inline=True),
        }
        self._calls: queue.Queue = queue.Queue(maxsize=handlers * queue_size_per_handler)
        self._responder_queue: queue.Queue = queue.Queue()
        self._n_handlers = handlers
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: set[_ServerConnection] = set()
        self._lock = threading.Lock()
        self.closed_reasons: collections.Counter = collections.Counter()
        self.counters = collections.Counter()   # connections, calls, errors, fatals, pings

    # -- lifecycle -----------------------------------------------------------------------------
    def register(self, name: str, request_type: type, handler: Callable, inline: bool = False) -> None:
        """Serve ``name``: ``handler(request) -> response message``; an exception becomes ERROR.
        ``inline=True`` marks a cheap, non-blocking method that readers may run themselves."""
        self.methods[name] = Method(request_type, handler, inline)

    def start(self) -> "RpcServer":
        if self._threads:   # a second listener and gate on one selector lose connections: refuse
            raise RuntimeError("this RpcServer is already started (`with RpcServer(...)` starts it)")
        self._spawn(self._server.serve_forever, "listener")
        for i in range(self._n_handlers):
            self._spawn(self._handle, f"handler-{i}")
        self._spawn(self._respond, "responder")
        log.info("rpc server on %s %s:%s (%s buffers)", self.transport_name, *self.address, self.buffers)
        return self

    def _spawn(self, target, name, args=(), keep=True) -> None:
        t = threading.Thread(target=target, args=args, name=f"rpc-{name}", daemon=True)
        t.start()
        if keep:
            self._threads.append(t)

    def stop(self) -> None:
        self._stopping.set()
        self._server.stop()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close("server stopping")
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> "RpcServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def _count(self, what: str) -> None:
        with self._lock:
            self.counters[what] += 1

    def _closed(self, sc: _ServerConnection, reason: str) -> None:
        with self._lock:
            self._conns.discard(sc)
            self.closed_reasons[reason.split(":")[0]] += 1
        log.info("closed connection %s: %s", getattr(sc.conn, "peer", "?"), reason)

    # -- listener and readers ------------------------------------------------------------------
    def _read_connection(self, conn) -> None:
        """A connection whose preamble and context have arrived (``_HadoopGate``): its reader."""
        conn.eager_limit = self.eager_limit
        sc = _ServerConnection(self, conn)
        with self._lock:
            self._conns.add(sc)
            self.counters["connections"] += 1
        self._read(sc)

    def _fatal(self, sc: _ServerConnection, f: _Fatal) -> None:
        self._count("fatals")
        header = E(callId=wire.response_call_id(f.call_id), status=wire.FATAL, serverIpcVersionNum=9,
                   exceptionClassName="org.apache.hadoop.ipc.RpcServerException", errorMsg=str(f),
                   errorDetail=f.code, clientId=sc.client_id)
        sc.respond(wire.delimited(header), in_handler=False)
        sc.close(f"FATAL {E.RpcErrorCodeProto.Name(f.code)}: {f}")

    def _read(self, sc: _ServerConnection) -> None:
        try:
            self._handshake(sc)
            # the last packet's time, not a deadline: the idle rule reads ``idle_timeout`` when it looks,
            # so a server whose limit is changed applies it to connections already open
            last_packet = time.monotonic()
            while not self._stopping.is_set() and sc.open:
                try:
                    packet = sc.conn.recv(timeout=READ_WAIT, max_length=self.max_data_length)
                except TransportTimeout:
                    if (time.monotonic() - last_packet > self.idle_timeout and not sc.conn_busy()
                            and self.connections > self.idle_threshold):
                        sc.close(f"idle: no call for {self.idle_timeout:g}s with more than "
                                 f"{self.idle_threshold} connections open")
                    continue
                last_packet = time.monotonic()
                try:
                    self._dispatch(sc, packet.view)
                finally:
                    packet.release()
        except _Fatal as f:
            self._fatal(sc, f)
        except FrameTooLarge as e:
            self._fatal(sc, _Fatal(E.FATAL_INVALID_RPC_HEADER,
                                   f"RPC data length {e.length} exceeds ipc.maximum.data.length {e.limit}"
                                   if sc.request_suffix is not None else
                                   f"connection context of {e.length} bytes exceeds {e.limit}"))
        except TransportTimeout:
            sc.close("handshake timeout: no preamble/context in time")
        except TransportClosed as e:
            sc.close(f"peer closed: {e}")
        except Exception as e:   # a reader must never take the server down
            log.exception("reader failed")
            sc.close(f"reader error: {type(e).__name__}: {e}")

    def _handshake(self, sc: _ServerConnection) -> None:
        preamble = sc.conn.recv_raw(len(wire.PREAMBLE), timeout=self.handshake_timeout)
        if preamble[:4] != wire.PREAMBLE_MAGIC:
            sc.close(f"bad preamble: {preamble[:4]!r} is not 'hrpc'")   # not Hadoop: no reply
            raise TransportClosed("bad preamble")
        if preamble[4] != wire.IPC_VERSION:
            raise _Fatal(E.FATAL_VERSION_MISMATCH,
                         f"IPC version {preamble[4]} not supported, server speaks {wire.IPC_VERSION}")
        if preamble[6] != wire.AUTH_NONE:
            raise _Fatal(E.FATAL_UNAUTHORIZED, f"auth protocol {preamble[6]} not supported (only none)")
        packet = sc.conn.recv(timeout=self.handshake_timeout,
                              max_length=min(self.max_data_length, MAX_CONTEXT_LENGTH))
        try:
            view = packet.view
            header_bytes, pos = self._delimited(view, 0)
            header = self._parse(wire.RpcRequestHeaderProto, header_bytes, E.FATAL_INVALID_RPC_HEADER)
            if header.callId != wire.CONNECTION_CONTEXT_CALL_ID:
                raise _Fatal(E.FATAL_INVALID_RPC_HEADER,
                             f"first packet has callId {header.callId}, expected connection context -3")
            sc.client_id = header.clientId
            sc.success_suffix = wire.success_header_suffix(sc.client_id)
            sc.request_suffix = wire.request_header_suffix(sc.client_id)
            ctx_bytes, _ = self._delimited(view, pos)
            ctx = self._parse(wire.IpcConnectionContextProto, ctx_bytes, E.FATAL_DESERIALIZING_REQUEST)
            sc.user, sc.protocol = ctx.userInfo.effectiveUser, ctx.protocol
        finally:
            packet.release()

    @staticmethod
    def _delimited(view, pos, call_id=wire.INVALID_CALL_ID):
        try:
            return wire.read_delimited(view, pos)
        except wire.WireError as e:
            raise _Fatal(E.FATAL_DESERIALIZING_REQUEST, str(e), call_id) from None

    @staticmethod
    def _parse(cls, data, code, call_id=wire.INVALID_CALL_ID):
        msg = cls()
        try:
            msg.ParseFromString(data)
            if not msg.IsInitialized():
                raise DecodeError("missing required fields: " + ", ".join(msg.FindInitializationErrors()))
        except (DecodeError, ValueError, RuntimeError) as e:
            raise _Fatal(code, f"cannot parse {cls.__name__}: {e}", call_id) from None
        return msg

    def _dispatch(self, sc: _ServerConnection, view: memoryview) -> None:
        header_bytes, pos = self._delimited(view, 0)
        call_id = _plain_call_id(header_bytes, sc.request_suffix)
        if call_id is not None:
            rh_bytes, body_pos = self._delimited(view, pos, call_id)
            known = sc.known_methods.get(bytes(rh_bytes))
            if known is not None:
                method, name = known
                body, _ = self._delimited(view, body_pos, call_id)
                request = self._parse(method.request_type, body, E.FATAL_DESERIALIZING_REQUEST, call_id)
                self._call(sc, _Call(sc, call_id, -1, method, name, request))
                return
        header = self._parse(wire.RpcRequestHeaderProto, header_bytes, E.FATAL_INVALID_RPC_HEADER)
        call_id = header.callId
        if call_id == wire.PING_CALL_ID:
            self._count("pings")
            return
        if header.rpcOp == wire.RpcRequestHeaderProto.RPC_CLOSE_CONNECTION:
            sc.close("client asked to close")
            return
        if call_id < 0:
            raise _Fatal(E.FATAL_INVALID_RPC_HEADER, f"callId {call_id} is not a call")
        if header.rpcKind != wire.RPC_PROTOCOL_BUFFER:
            raise _Fatal(E.FATAL_UNSUPPORTED_SERIALIZATION, f"rpcKind {header.rpcKind} not supported",
                         call_id)
        rh_bytes, pos = self._delimited(view, pos, call_id)
        rh = self._parse(wire.RequestHeaderProto, rh_bytes, E.FATAL_DESERIALIZING_REQUEST, call_id)
        body, _ = self._delimited(view, pos, call_id)
        method = self.methods.get(rh.methodName)
        if rh.declaringClassProtocolName != self.protocol:
            self._error(sc, call_id, header.retryCount, E.ERROR_NO_SUCH_PROTOCOL,
                        "org.apache.hadoop.ipc.RpcNoSuchProtocolException",
                        f"unknown protocol {rh.declaringClassProtocolName}")
            return
        if method is None:
            self._error(sc, call_id, header.retryCount, E.ERROR_NO_SUCH_METHOD,
                        "org.apache.hadoop.ipc.RpcNoSuchMethodException",
                        f"unknown method {rh.methodName} of {self.protocol}")
            return
        request = self._parse(method.request_type, body, E.FATAL_DESERIALIZING_REQUEST, call_id)
        if len(sc.known_methods) < MAX_KNOWN_METHODS:   # bounded: a client may vary the header bytes
            sc.known_methods[bytes(rh_bytes)] = (method, rh.methodName)
        self._call(sc, _Call(sc, call_id, header.retryCount, method, rh.methodName, request))

    def _call(self, sc: _ServerConnection, call: _Call) -> None:
        self._count("calls")
        method = call.method
        if self.dispatch == "direct" or (method.inline and self.dispatch == "auto"):
            self._run(call)
            return
        while sc.open:
            try:
                self._calls.put(call, timeout=0.5)
                return
            except queue.Full:
                if self._stopping.is_set():
                    return

    def _error(self, sc, call_id, retry_count, code, class_name, message, in_handler=False) -> None:
        self._count("errors")
        header = E(callId=wire.response_call_id(call_id), status=wire.ERROR, serverIpcVersionNum=9,
                   exceptionClassName=class_name, errorMsg=message, errorDetail=code,
                   clientId=sc.client_id, retryCount=retry_count)
        sc.respond(wire.delimited(header), in_handler=in_handler)

    # -- handlers and responder ----------------------------------------------------------------
    def _handle(self) -> None:
        while not self._stopping.is_set():
            try:
                call = self._calls.get(timeout=0.2)
            except queue.Empty:
                continue
            if call.conn.open:
                self._run(call)

    def _run(self, call: _Call) -> None:
        """Run one call and write its response (or hand it to the responder if the connection is busy)."""
        sc = call.conn
        try:
            response = call.method.handler(call.request).SerializeToString()
        except Exception as e:
            cls = type(e)
            self._error(sc, call.call_id, call.retry_count, E.ERROR_APPLICATION,
                        f"{cls.__module__}.{cls.__qualname__}", str(e), in_handler=True)
            return
        if call.retry_count == -1:
            header = b"\x08" + wire.varint(call.call_id) + sc.success_suffix
        else:
            header = wire.success_header_bytes(call.call_id, sc.client_id, call.retry_count)
        sc.respond([wire.varint(len(header)), header, wire.varint(len(response)), response],
                   in_handler=True)

    def _respond(self) -> None:
        while not self._stopping.is_set():
            try:
                sc, parts = self._responder_queue.get(timeout=0.2)
            except queue.Empty:
                continue
            sc.respond(parts, in_handler=False)
