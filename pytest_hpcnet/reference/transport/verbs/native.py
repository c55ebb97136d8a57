"""The ``verbs`` transport over the native core's verbs end (``native/src/verbs/``), with the interface
and semantics of the pyverbs transport in this package: framed messages (4-byte big-endian length +
body), ``send_raw``/``recv_raw`` for the run-credential handshake, ``register`` (a region the peer can
READ and WRITE, described by the same ``RemoteRegion("verbs", hex address, rkey, length)``), and
one-sided ``put``/``get``/``get_into``. The wire protocol is the same, so a native end and a pyverbs
end talk to each other, messages and one-sided access alike.

Why: a Python end spends tens of microseconds of interpreter per message and copies every RDMA READ
out of a bounce buffer; the native end waits without the GIL and READs straight into the caller's
memory (``get_into`` registers the target for the operation).
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Sequence

from ... import native
from ...buffers import Bytes, Received, make_buffers
from ..base import (DEFAULT_TIMEOUT, FrameTooLarge, MAX_FRAME, RemoteRegion, TransportClosed, TransportError,
                    TransportTimeout)
from .loader import rdma_host


def unavailable() -> str | None:
    """Why the native verbs end cannot run here (one line), or None."""
    if not native.AVAILABLE:
        return native.WHY_NOT
    why = getattr(native.core, "verbs_unavailable", None)
    if why is None or not hasattr(native.core, "VerbsConnection"):
        return "this build of the native core predates its Python-facing verbs connection; rebuild it"
    return why()


@contextlib.contextmanager
def _translated():
    """The native end's exceptions as the transport's."""
    try:
        yield
    except TimeoutError as e:
        raise TransportTimeout(str(e)) from None
    except ConnectionError as e:
        raise TransportClosed(str(e)) from None
    except OverflowError as e:
        if len(e.args) == 2 and all(isinstance(a, int) for a in e.args):   # the core's (length, limit)
            raise FrameTooLarge(*e.args) from None
        raise TransportError(str(e)) from None
    except (ValueError, OSError) as e:
        raise TransportError(str(e)) from None


def _byte_view(b: Bytes) -> memoryview:
    v = memoryview(b)
    return v if v.format == "B" and v.ndim == 1 else v.cast("B")


class NativeVerbsRegion:
    """Memory registered on a native connection: memory we own (an anonymous mapping, page-aligned)
    or a caller's writable buffer, registered in place (``view`` aliases it)."""

    def __init__(self, conn: "NativeVerbsConnection", buffer: Bytes | int):
        if isinstance(buffer, int):
            if buffer < 0:
                raise TransportError(f"cannot register {buffer} bytes")
            self._mem = mmap.mmap(-1, max(buffer, 1))
            target = memoryview(self._mem)[:buffer]
        else:
            target = _byte_view(buffer)
            if target.readonly:
                raise TransportError("cannot register read-only memory")
            self._mem = None
        self.view, self.length = target, target.nbytes
        self._conn = conn
        with _translated():
            # the mapping itself (never empty) when we own it: a zero-length view cannot be registered
            self._id, self.addr, self.rkey = conn._core.register(self._mem if self._mem is not None else target)

    def remote(self) -> RemoteRegion:
        return RemoteRegion("verbs", f"{self.addr:x}", str(self.rkey), self.length)

    def close(self) -> None:
        if self._id is not None:
            self._conn._core.deregister(self._id)
            self._id = None


class NativeVerbsConnection:
    transport = "verbs"

    def __init__(self, core, buffers, default_timeout: float, peer):
        self._core, self.buffers, self.default_timeout, self.peer = core, buffers, default_timeout, peer
        self._closed = False
        self.eager_limit: int | None = None   # the stream transports' knob; frames arrive whole here

    def _t(self, timeout: float | None) -> float:
        return self.default_timeout if timeout is None else max(0.0, timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, parts: Sequence[Bytes], timeout: float | None = None) -> None:
        views = [_byte_view(p) for p in self.buffers.gather(list(parts))]
        total = sum(v.nbytes for v in views)
        if total > MAX_FRAME:
            raise FrameTooLarge(total, MAX_FRAME)
        with _translated():
            self._core.send(views, self._t(timeout))

    def recv(self, timeout: float | None = None, max_length: int | None = None) -> Received:
        with _translated():
            body = self._core.recv(self._t(timeout), MAX_FRAME if max_length is None else max_length)
        return self.buffers.finish(memoryview(body), None)

    def send_raw(self, data: Bytes, timeout: float | None = None) -> None:
        with _translated():
            self._core.send_raw(_byte_view(data), self._t(timeout))

    def recv_raw(self, nbytes: int, timeout: float | None = None) -> bytes:
        with _translated():
            return self._core.recv_raw(nbytes, self._t(timeout))

    def register(self, buffer: Bytes | int) -> NativeVerbsRegion:
        return NativeVerbsRegion(self, buffer)

    @staticmethod
    def _check_remote(remote: RemoteRegion, offset: int, length: int, op: str) -> tuple[int, int]:
        """The peer's address and rkey for [offset, offset + length) of ``remote``; the pyverbs end's
        checks and wording, so both ends refuse the same requests alike."""
        if remote.transport != "verbs":
            raise TransportError(f"{op}: region of transport {remote.transport!r} given to verbs")
        if offset < 0 or length < 0 or offset + length > remote.length:
            raise TransportError(f"{op} of {length} bytes at {offset} is outside the {remote.length}-byte region")
        try:
            return int(remote.address, 16) + offset, int(remote.key)
        except ValueError:
            raise TransportError(f"{op}: {remote.address!r}/{remote.key!r} is not a verbs region's "
                                 "address and key") from None

    def put(self, remote: RemoteRegion, offset: int, data: Bytes, timeout: float | None = None) -> None:
        data = _byte_view(data)
        addr, rkey = self._check_remote(remote, offset, data.nbytes, "put")
        if data.nbytes:
            with _translated():
                self._core.put(addr, rkey, data, self._t(timeout))

    def get(self, remote: RemoteRegion, offset: int, length: int, timeout: float | None = None) -> bytes:
        out = bytearray(length if length > 0 else 0)
        self.get_into(remote, offset, memoryview(out), timeout, length=length)
        return bytes(out)

    def get_into(self, remote: RemoteRegion, offset: int, into: memoryview, timeout: float | None = None,
                 length: int | None = None) -> None:
        """RDMA READ of ``len(into)`` bytes at ``offset`` of ``remote`` straight into ``into``."""
        into = _byte_view(into)
        addr, rkey = self._check_remote(remote, offset, into.nbytes if length is None else length, "get")
        if into.readonly:
            raise TransportError("get_into needs a writable target")
        if into.nbytes:
            with _translated():
                self._core.get_into(addr, rkey, into, self._t(timeout))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._core.close()


class NativeVerbsListener:
    def __init__(self, host: str, port: int, buffers: str, default_timeout: float):
        self.host = rdma_host(host)
        self._buffers, self._default_timeout = buffers, default_timeout
        with _translated():
            self._core = native.core.VerbsListener(self.host, port)
        self.address = (self.host, self._core.port)
        self._closed = False

    def accept(self, timeout: float | None = None) -> NativeVerbsConnection:
        try:
            with _translated():
                core = self._core.accept(self._default_timeout if timeout is None else max(0.0, timeout))
        except TransportClosed as e:
            if self._closed:   # the accept loops stop on this wording (serving.Server)
                raise TransportClosed(f"listener on {self.address} closed") from None
            raise TransportError(str(e)) from None   # one peer's failed set-up: keep accepting
        return NativeVerbsConnection(core, make_buffers(self._buffers), self._default_timeout,
                                     peer=("rdma_cm", core.peer))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._core.close()


class NativeVerbsTransport:
    """``listen``/``connect`` as ``VerbsTransport``'s, on the native end."""

    name = "verbs"
    native = True   # which verbs end this is (the pyverbs transport has no such attribute)

    def __init__(self, default_timeout: float = DEFAULT_TIMEOUT):
        why = unavailable()
        if why:
            from .loader import VerbsUnavailable
            raise VerbsUnavailable(f"native verbs cannot run here: {why}")
        self.default_timeout = default_timeout

    def listen(self, host: str, port: int, buffers: str = "pooled") -> NativeVerbsListener:
        make_buffers(buffers)
        return NativeVerbsListener(host, port, buffers, self.default_timeout)

    def connect(self, address: tuple[str, int], timeout: float | None = None,
                buffers: str = "pooled") -> NativeVerbsConnection:
        host, port = rdma_host(str(address[0])), int(address[1])
        t = self.default_timeout if timeout is None else max(0.0, timeout)
        with _translated():
            core = native.core.VerbsConnection.connect(host, port, t)
        return NativeVerbsConnection(core, make_buffers(buffers), self.default_timeout, peer=(host, port))
