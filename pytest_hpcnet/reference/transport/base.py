"""The transport interface every implementation fills, and the framing they share.

A transport moves *messages* between two endpoints: ``send(parts)`` writes one message (the parts are
gathered, never joined, unless the buffer design says so) and ``recv()`` returns one. On byte-stream
transports (tcp, shm) a message travels as a 4-byte big-endian length and the bytes -- the same packet
framing Hadoop IPC uses, so an RPC packet is exactly one transport message. ``send_raw``/``recv_raw``
move unframed bytes for protocol preambles (Hadoop's ``hrpc`` header has no length).

Bulk data goes one-sided: ``register(buffer)`` makes memory reachable by the peer and returns a
``Region``; its ``remote()`` descriptor is sent to the peer in an ordinary message, and the peer then
``put``s into or ``get``s from it without the owner's code taking part. A ``verbs`` transport maps
these onto an RC queue pair (send/recv for messages, RDMA WRITE/READ for put/get, ``ibv_reg_mr`` for
register) without callers changing.

Every blocking call takes a timeout (seconds; ``None`` = the connection's default) and raises
``TransportTimeout`` when it passes; a peer that went away raises ``TransportClosed``. Nothing blocks
forever.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
import struct
import threading
import time
from dataclasses import asdict, dataclass
from typing import Protocol, Sequence, runtime_checkable

from ...errors import HpcnetError
from ...timeouts import scaled
from ..buffers import Bytes, NaiveBuffers, PooledBuffers, Received

DEFAULT_TIMEOUT = 30.0   # not scaled: it is also how long a caller takes to notice a silent peer
LENGTH = struct.Struct(">I")
MAX_FRAME = 0xFFFFFFFF


class TransportError(HpcnetError, OSError):
    """Anything a transport reports."""


class TransportClosed(TransportError, ConnectionError):
    """The peer went away or the connection was closed."""


class PeerRefused(TransportClosed):
    """This one peer was refused (wrong credentials, another user, a failed handshake); the listener
    is fine and keeps accepting others."""


class TransportTimeout(TransportError, TimeoutError):
    """A blocking call did not complete within its timeout."""


class FrameTooLarge(TransportError):
    """A peer announced a message longer than the receiver allows; the stream cannot be resynced."""

    def __init__(self, length: int, limit: int):
        self.length, self.limit = length, limit
        super().__init__(f"message of {length} bytes exceeds the limit of {limit} bytes")


@dataclass(frozen=True)
class RemoteRegion:
    """What a peer needs to reach a registered region: the verbs analogue is (addr, rkey, length)."""

    transport: str
    address: str   # where the region lives: a host:port for tcp, a /dev/shm path for shm
    key: str       # the access key (rkey); only someone who was told it can reach the region
    length: int

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: Bytes) -> "RemoteRegion":
        return cls(**json.loads(bytes(data)))


class Region(Protocol):
    """Registered local memory: ``view`` is what the peer's put/get reads and writes."""

    view: memoryview
    length: int

    def remote(self) -> RemoteRegion: ...
    def close(self) -> None: ...


@runtime_checkable
class Connection(Protocol):
    transport: str
    buffers: NaiveBuffers | PooledBuffers

    def send(self, parts: Sequence[Bytes], timeout: float | None = None) -> None: ...
    def recv(self, timeout: float | None = None, max_length: int | None = None) -> Received: ...
    def send_raw(self, data: Bytes, timeout: float | None = None) -> None: ...
    def recv_raw(self, nbytes: int, timeout: float | None = None) -> bytes: ...
    def register(self, buffer: Bytes | int) -> Region: ...
    def put(self, remote: RemoteRegion, offset: int, data: Bytes, timeout: float | None = None) -> None: ...
    def get(self, remote: RemoteRegion, offset: int, length: int, timeout: float | None = None) -> bytes: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...


class Listener(Protocol):
    address: tuple[str, int]

    def accept(self, timeout: float | None = None) -> Connection: ...
    def close(self) -> None: ...


class Transport(Protocol):
    name: str

    def listen(self, host: str, port: int, buffers: str = "pooled") -> Listener: ...
    def connect(self, address: tuple[str, int], timeout: float | None = None,
                buffers: str = "pooled") -> Connection: ...


def connect_pair(transport: "Transport", listener: "Listener", timeout: float | None = None,
                 buffers: str = "pooled") -> tuple["Connection", "Connection"]:
    """Connect to ``listener`` from this process and accept the other end at the same time (shm's and
    verbs' handshakes need both sides running): (client side, server side). For tests and local tools.
    ``timeout`` defaults to ``scaled(10)``."""
    timeout = scaled(10.0) if timeout is None else timeout
    accepted: dict = {}

    def accept():
        try:
            accepted["conn"] = conn = listener.accept(timeout=timeout)
            warm = getattr(conn.buffers, "warm", None)   # a listener hands out cold pools
            if warm is not None:
                warm()
        except BaseException as e:   # handed to the caller below
            accepted["error"] = e
    thread = threading.Thread(target=accept, name="connect-pair-accept", daemon=True)
    thread.start()
    try:
        client = transport.connect(listener.address, timeout=timeout, buffers=buffers)
    finally:
        thread.join(timeout)
    if "conn" not in accepted:
        client.close()
        raise accepted.get("error") or TransportTimeout(f"no connection accepted within {timeout} s")
    return client, accepted["conn"]


def deadline_of(timeout: float | None, default: float) -> float:
    return time.monotonic() + (default if timeout is None else timeout)


def remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TransportTimeout("timed out")
    return left


class StreamConnection(ABC):
    """Framing over a byte stream. Subclasses provide ``_recv_into`` and ``_send_views``.

    A receive that times out mid-message keeps what it has read, so the next ``recv`` resumes the same
    message: a caller may poll with short timeouts without corrupting the stream.
    """

    transport = "stream"

    def __init__(self, buffers, default_timeout: float = DEFAULT_TIMEOUT):
        self.buffers = buffers
        self.default_timeout = default_timeout
        self._send_lock = threading.Lock()
        self._hdr = bytearray(4)
        self._hdr_view = memoryview(self._hdr)
        self._hdr_n = 0
        self._body = None          # (view, release) of the message being received
        self._body_n = 0
        self._ahead = None         # read-ahead: (view, release) holding length + message + maybe more
        self._ahead_n = 0
        self._carry = b""          # bytes read past the previous message (only when the peer pipelines)
        self._closed = False
        # Messages longer than this are received into a buffer that grows as their bytes arrive,
        # not one allocated at the announced size (None: always the announced size). Servers that
        # serve strangers set it; see ``_recv_growing``.
        self.eager_limit: int | None = None
        self._growing: int | None = None

    # -- implemented by subclasses -------------------------------------------------------------
    @abstractmethod
    def _recv_into(self, view: memoryview, deadline: float) -> int:
        """Read at least one byte into ``view``; raise TransportTimeout/TransportClosed."""

    @abstractmethod
    def _send_views(self, views: Sequence[Bytes], deadline: float) -> None:
        """Write every view, in order, before ``deadline``."""

    # -- messages ------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def in_step(self) -> bool:
        """Nothing of an incoming message is buffered here, so the next bytes on the wire begin the next
        message: native code may read it from the socket itself (always so between strict
        request/reply exchanges)."""
        return (not self._carry and self._hdr_n == 0 and self._body is None and self._ahead is None
                and self._growing is None)

    def send(self, parts: Sequence[Bytes], timeout: float | None = None) -> None:
        total = sum(map(len, parts))
        if total > MAX_FRAME:
            raise FrameTooLarge(total, MAX_FRAME)
        views = self.buffers.gather([LENGTH.pack(total), *parts])
        deadline = deadline_of(timeout, self.default_timeout)
        with self._send_lock:
            self._send_views(views, deadline)

    def recv(self, timeout: float | None = None, max_length: int | None = None) -> Received:
        deadline = deadline_of(timeout, self.default_timeout)
        if self._growing is not None:          # a large message a timeout interrupted
            return self._recv_growing(self._growing, deadline, self._fill)
        if getattr(self.buffers, "read_ahead", False):
            return self._recv_ahead(deadline, max_length)
        fill = self._fill if self._carry else self._recv_into
        while self._hdr_n < 4:
            self._hdr_n += fill(self._hdr_view[self._hdr_n:], deadline)
        (length,) = LENGTH.unpack(self._hdr)
        if max_length is not None and length > max_length:
            raise FrameTooLarge(length, max_length)
        if self.eager_limit is not None and length > self.eager_limit:
            return self._recv_growing(length, deadline, fill)
        if self._body is None:
            self._body = self.buffers.acquire(length)
            self._body_n = 0
        view, release = self._body
        while self._body_n < length:
            self._body_n += fill(view[self._body_n:], deadline)
        self._hdr_n, self._body = 0, None
        return self.buffers.finish(view, release)

    def _recv_growing(self, length: int, deadline: float, fill) -> Received:
        """A message longer than ``eager_limit``: its buffer grows (doubling) as its bytes arrive, so a
        peer that announces a large length and sends nothing costs nothing. About one extra copy."""
        if self._body is None:
            self._body = (bytearray(min(length, max(self.eager_limit, 4096))), None)
            self._body_n = 0
            self._growing = length
        buf = self._body[0]
        while self._body_n < length:
            if self._body_n == len(buf):
                bigger = bytearray(min(length, 2 * len(buf)))
                bigger[:self._body_n] = buf
                if hasattr(self.buffers, "count_copy"):
                    self.buffers.count_copy(self._body_n)
                buf = bigger
                self._body = (buf, None)
            self._body_n += fill(memoryview(buf)[self._body_n:], deadline)
        self._hdr_n, self._body, self._growing = 0, None, None
        return self.buffers.finish(memoryview(buf), None)

    def _fill(self, view: memoryview, deadline: float) -> int:
        """Read into ``view``: bytes handed back with ``unread`` first, then the transport."""
        if self._carry:
            n = min(len(view), len(self._carry))
            view[:n], self._carry = self._carry[:n], self._carry[n:]
            return n
        return self._recv_into(view, deadline)

    def unread(self, data: bytes) -> None:
        """Give bytes already taken off the stream back: the next receives return them first (a server
        that looked at a connection's first bytes before deciding to serve it)."""
        self._carry = bytes(data) + self._carry

    def _recv_ahead(self, deadline: float, max_length: int | None) -> Received:
        """Receive into a buffer posted before the size is known, sized by what recent messages
        needed (RPCoIB's message-size locality): a message that fits arrives with one read, length
        and body together, straight into its final buffer."""
        buffers = self.buffers
        if self._ahead is None:
            carry, self._carry = self._carry, b""
            view, release = buffers.acquire_predicted(len(carry))
            if carry:
                buffers.count_copy(len(carry))
                view[:len(carry)] = carry
            self._ahead, self._ahead_n = (view, release), len(carry)
        view, release = self._ahead
        while self._ahead_n < 4:
            self._ahead_n += self._recv_into(view[self._ahead_n:], deadline)
        (length,) = LENGTH.unpack(view[:4])
        if max_length is not None and length > max_length:
            raise FrameTooLarge(length, max_length)
        total = 4 + length
        if self.eager_limit is not None and length > self.eager_limit and total > len(view):
            # hand what was read ahead back to the stream and grow the buffer as bytes arrive
            self._carry = bytes(view[4:self._ahead_n]) + self._carry
            self._hdr[:] = view[:4]
            self._hdr_n = 4
            release()
            self._ahead = None
            return self._recv_growing(length, deadline, self._fill)
        if total > len(view):   # the prediction was too small: move to a buffer that fits
            bigger, bigger_release = buffers.acquire_predicted(total)
            buffers.count_copy(self._ahead_n)
            bigger[:self._ahead_n] = view[:self._ahead_n]
            release()
            view, release = bigger, bigger_release
            self._ahead = (view, release)
        while self._ahead_n < total:
            self._ahead_n += self._recv_into(view[self._ahead_n:], deadline)
        if self._ahead_n > total:   # the peer pipelined: keep what belongs to the next message
            self._carry = bytes(view[total:self._ahead_n])
            buffers.count_copy(len(self._carry))
        self._ahead = None
        return buffers.finish_recorded(view[4:total], release, total)

    def send_raw(self, data: Bytes, timeout: float | None = None) -> None:
        with self._send_lock:
            self._send_views([data], deadline_of(timeout, self.default_timeout))

    def recv_raw(self, nbytes: int, timeout: float | None = None) -> bytes:
        deadline = deadline_of(timeout, self.default_timeout)
        buf = bytearray(nbytes)
        view, got = memoryview(buf), 0
        if self._carry:   # bytes a read-ahead already took off the stream come first
            got = min(nbytes, len(self._carry))
            view[:got], self._carry = self._carry[:got], self._carry[got:]
        while got < nbytes:
            got += self._recv_into(view[got:], deadline)
        return bytes(buf)
