"""An RPC client speaking Hadoop IPC v9: one connection, many concurrent calls matched by call id.

No dedicated receiver thread: a calling thread whose response has not arrived becomes the *leader*
and reads packets for everyone, handing each response to the thread waiting for its call id; when it
gets its own it passes leadership to another waiting caller. A lone caller therefore reads its own
response with no thread hand-off, which keeps small-call latency close to the socket's.

Per call, no protobuf object is built for the headers: the request header is the call id's varint
spliced between constant bytes, and a SUCCESS response header is recognised by its constant tail
(anything else -- ERROR, FATAL, another retry count -- is parsed with protobuf as before).
"""

from __future__ import annotations

import getpass
import itertools
import threading
import time
import uuid

from google.protobuf.message import DecodeError

from ...timeouts import scaled
from ..transport import TransportError, TransportTimeout, get_transport
from . import wire
from .errors import RpcConnectionLost, RpcFatalError, RpcRemoteError, RpcTimeout

E = wire.RpcResponseHeaderProto


_thread_events = threading.local()


class _Slot:
    __slots__ = ("event", "done", "header", "body", "error")

    def __init__(self):
        # A thread has one call in flight at a time, so it reuses one Event (saves building one per call).
        # Not cleared here: ``_await`` clears it before every check-then-wait.
        event = getattr(_thread_events, "event", None)
        if event is None:
            event = _thread_events.event = threading.Event()
        self.event = event
        self.done = False
        self.header = self.body = self.error = None


class TypedCalls:
    """``call`` with protobuf messages over a client's ``call_raw`` (both implementations')."""

    def call(self, method: str, request, response_type: type, timeout: float | None = None):
        """Call ``method`` and return its parsed response; raises RpcTimeout / RpcRemoteError /
        RpcConnectionLost."""
        body = self.call_raw(method, request.SerializeToString(), timeout)
        response = response_type()
        try:
            response.ParseFromString(body)
        except DecodeError as e:
            raise RpcRemoteError(type(e).__name__, f"cannot parse the {method} response: {e}") from None
        return response


class RpcClient(TypedCalls):
    """``RpcClient(("127.0.0.1", port)).echo(b"hi")``; ``call(method, request, response_type)``."""

    def __init__(self, address: tuple[str, int], transport: str = "tcp", buffers: str = "pooled",
                 protocol: str = wire.ECHO_PROTOCOL, timeout: float | None = None,
                 connect_timeout: float | None = None, user: str | None = None,
                 max_data_length: int = wire.MAX_DATA_LENGTH, client_id: bytes | None = None):
        # defaults: a call answers within 30 s (how long a hung server takes to notice: not scaled)
        # and a connection is up within 10 s times this machine's timeout scale
        # (HPCNET_TIMEOUT_SCALE: under emulation one rdma_cm connection alone can take seconds)
        timeout = 30.0 if timeout is None else timeout
        connect_timeout = scaled(10.0) if connect_timeout is None else connect_timeout
        self.address, self.protocol, self.timeout = tuple(address), protocol, timeout
        self.max_data_length = max_data_length
        self.client_id = client_id or uuid.uuid4().bytes
        self._ids = itertools.count()
        self._pending: dict[int, _Slot] = {}
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._broken: Exception | None = None
        self._method_headers: dict[str, bytes] = {}   # serialized RequestHeaderProto per method
        self._header_prefix = wire.request_header_prefix()
        self._header_suffix = wire.request_header_suffix(self.client_id)
        self._success_suffix = wire.success_header_suffix(self.client_id)
        try:
            self.conn = get_transport(transport).connect(self.address, timeout=connect_timeout,
                                                         buffers=buffers)
            self.conn.send_raw(wire.PREAMBLE, timeout=connect_timeout)
            ctx = wire.connection_context(user or _user(), protocol)
            self.conn.send(wire.delimited(wire.request_header(wire.CONNECTION_CONTEXT_CALL_ID,
                                                              self.client_id), ctx),
                           timeout=connect_timeout)
        except TransportTimeout as e:
            raise RpcTimeout(f"connecting to {address[0]}:{address[1]}: {e}") from None
        except TransportError as e:
            raise RpcConnectionLost(f"connecting to {address[0]}:{address[1]}: {e}") from None

    @property
    def buffers(self):
        return self.conn.buffers

    # -- calls ---------------------------------------------------------------------------------
    def echo(self, payload: bytes, timeout: float | None = None) -> bytes:
        return self.call("echo", wire.EchoRequestProto(payload=payload), wire.EchoResponseProto,
                         timeout).payload

    def ping(self, timeout: float | None = None) -> None:
        self.call("ping", wire.EmptyRequestProto(), wire.EmptyResponseProto, timeout)

    def send_ping(self) -> None:
        """Hadoop's keep-alive: a header with callId -4 and no response."""
        self._send(wire.delimited(wire.request_header(wire.PING_CALL_ID, self.client_id)), self.timeout)

    def call_raw(self, method: str, request_bytes: bytes, timeout: float | None = None) -> memoryview:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if self._broken:
            raise self._broken
        call_id = next(self._ids) & 0x7FFFFFFF
        slot = _Slot()
        with self._lock:
            self._pending[call_id] = slot
        try:
            rh = self._method_headers.get(method)
            if rh is None:   # constant per method: serialize once
                rh = self._method_headers[method] = wire.RequestHeaderProto(
                    methodName=method, declaringClassProtocolName=self.protocol,
                    clientProtocolVersion=wire.PROTOCOL_VERSION).SerializeToString()
            header = self._header_prefix + wire.varint(wire.zigzag(call_id)) + self._header_suffix
            self._send([wire.varint(len(header)), header, wire.varint(len(rh)), rh,
                        wire.varint(len(request_bytes)), request_bytes], timeout)
            self._await(slot, deadline, method, timeout)
        finally:
            with self._lock:
                self._pending.pop(call_id, None)
            self._hand_over()
        if slot.error is not None:
            raise slot.error
        return slot.body

    def _send(self, parts, timeout) -> None:
        try:
            self.conn.send(parts, timeout=timeout)
        except TransportTimeout as e:
            raise RpcTimeout(f"sending to {self.address}: {e}") from None
        except TransportError as e:
            self._break(RpcConnectionLost(f"connection to {self.address[0]}:{self.address[1]} lost: {e}"))
            raise self._broken from None

    def _await(self, slot: _Slot, deadline: float, method: str, timeout: float) -> None:
        while not slot.done:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RpcTimeout(f"{method} got no response within {timeout:g} s")
            slot.event.clear()
            if slot.done:
                return
            if self._read_lock.acquire(blocking=False):
                try:
                    while not slot.done and deadline > time.monotonic():
                        self._read_one(min(deadline - time.monotonic(), 0.5), slot)
                finally:
                    self._read_lock.release()
            else:
                slot.event.wait(left)

    def _hand_over(self) -> None:
        """Wake one waiting caller so it can take over reading."""
        if not self._pending:
            return   # nobody waits (a caller that registers now finds the read lock free itself)
        with self._lock:
            for other in self._pending.values():
                if not other.done:
                    other.event.set()
                    return

    def _read_one(self, timeout: float, own: _Slot | None = None) -> None:
        """Read one response and hand it to its caller (``own``: the reading caller's slot, whose
        thread is awake and needs no Event.set)."""
        if self._broken:
            raise self._broken
        try:
            packet = self.conn.recv(timeout=max(timeout, 0.0), max_length=self.max_data_length)
        except TransportTimeout:
            return
        except TransportError as e:
            self._break(RpcConnectionLost(f"connection to {self.address[0]}:{self.address[1]} lost: {e}"))
            raise self._broken from None
        try:
            view = packet.view
            hbytes, pos = wire.read_delimited(view, 0)
            call_id = _success_call_id(hbytes, self._success_suffix)
            if call_id is None:   # not a plain SUCCESS header: let protobuf read it
                header = E()
                header.ParseFromString(hbytes)
                call_id = wire.signed_call_id(header.callId)
            else:
                header = None
            body = b""
            if header is None or header.status == wire.SUCCESS:
                body = bytes(wire.read_delimited(view, pos)[0])
        except (wire.WireError, DecodeError) as e:
            self._break(RpcConnectionLost(f"malformed response from {self.address}: {e}"))
            raise self._broken from None
        finally:
            packet.release()
        if header is None:
            with self._lock:
                slot = self._pending.get(call_id)
            if slot is not None:
                slot.body, slot.done = body, True
                if slot is not own:
                    slot.event.set()
            return
        if header.status == wire.FATAL:
            err = RpcFatalError(header.exceptionClassName, header.errorMsg, header.errorDetail)
            self._break(err)
            raise err
        with self._lock:
            slot = self._pending.get(call_id)
        if slot is None:
            return   # the caller timed out and left
        slot.header, slot.body = header, body
        if header.status == wire.ERROR:
            slot.error = RpcRemoteError(header.exceptionClassName, header.errorMsg, header.errorDetail)
        slot.done = True
        slot.event.set()

    def _break(self, error: Exception) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = error
            for slot in self._pending.values():
                if not slot.done:
                    slot.error, slot.done = self._broken, True
                    slot.event.set()
        self.conn.close()

    def close(self) -> None:
        if self._broken is None:
            self._broken = RpcConnectionLost("client closed")
        self._break(self._broken)

    def __enter__(self) -> "RpcClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _success_call_id(hbytes: memoryview, success_suffix: bytes) -> int | None:
    """The call id of a SUCCESS header that is tag 1 + a varint call id + our constant tail, else None."""
    if len(hbytes) < 2 or hbytes[0] != 0x08:
        return None
    call_id = shift = 0
    pos = 1
    while pos < len(hbytes) and pos <= 5:
        b = hbytes[pos]
        pos += 1
        call_id |= (b & 0x7F) << shift
        if not b & 0x80:
            if hbytes[pos:] == success_suffix and call_id < 1 << 31:
                return call_id
            return None
        shift += 7
    return None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "hpcnet"
