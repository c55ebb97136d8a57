"""The ``tcp`` transport: plain sockets, the baseline (the "IPoIB / 10GigE" role).

Waiting: the socket stays in blocking mode with a kernel receive/send timeout (SO_RCVTIMEO /
SO_SNDTIMEO) of ``WAIT_SLICE`` set once, and a wait longer than that loops on EAGAIN until its
deadline. Python's own socket timeouts cost a poll() before every recv plus two fcntl() calls per
``settimeout``; this way a receive is one recv() system call. Waits shorter than the slice (rare:
the callers poll with 0.2-0.5 s) use poll() with the exact timeout, so no timeout is ever longer
than asked.

One-sided put/get is emulated the way a NIC would serve it: ``register`` publishes the region in a
per-process region server (a loopback-or-same-address listener thread), and a peer's ``put``/``get``
talk to that server directly, so the owner's application code takes no part.
"""

from __future__ import annotations

import secrets
import select
import socket
import struct
import threading
import time
from typing import Sequence

from ..buffers import Bytes, make_buffers
from .base import (DEFAULT_TIMEOUT, LENGTH, RemoteRegion, StreamConnection, TransportClosed, TransportError,
                   TransportTimeout, deadline_of, remaining)

_OP = struct.Struct(">cHQQ")   # op (P/G), key length, offset, length
WAIT_SLICE = 0.2               # seconds a blocked recv/send sleeps in the kernel before re-checking
_TIMEVAL = struct.pack("ll", int(WAIT_SLICE), int((WAIT_SLICE % 1) * 1_000_000))


class TcpConnection(StreamConnection):
    transport = "tcp"

    def __init__(self, sock: socket.socket, buffers, default_timeout: float = DEFAULT_TIMEOUT):
        super().__init__(buffers, default_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)   # blocking; the kernel timeouts below bound every wait
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TIMEVAL)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TIMEVAL)
        self.sock = sock
        self.peer = sock.getpeername()
        self._regions: list[TcpRegion] = []
        self._side: dict[tuple, socket.socket] = {}   # region-server connections for put/get

    def _recv_into(self, view: memoryview, deadline: float) -> int:
        try:
            while True:
                left = deadline - time.monotonic()
                if left < WAIT_SLICE:
                    if left <= 0 or not _readable(self.sock, left):
                        raise TransportTimeout(f"no data from {self.peer} within the timeout")
                    n = self.sock.recv_into(view, 0, socket.MSG_DONTWAIT)
                    break
                try:
                    n = self.sock.recv_into(view)   # sleeps at most WAIT_SLICE (SO_RCVTIMEO)
                    break
                except BlockingIOError:
                    continue
        except BlockingIOError:
            return 0   # poll said readable but the data went elsewhere; the caller reads again
        except TransportError:
            raise
        except (OSError, ValueError) as e:
            raise TransportClosed(f"connection to {self.peer} failed: {e}") from None
        if n == 0:
            raise TransportClosed(f"peer {self.peer} closed the connection")
        return n

    def _send_views(self, views: Sequence[Bytes], deadline: float) -> None:
        # fast path: one sendmsg takes the whole gather list (the usual case for RPC-sized messages),
        # with no per-part Python work
        try:
            sent = self.sock.sendmsg(views)   # blocks at most WAIT_SLICE (SO_SNDTIMEO)
        except BlockingIOError:
            sent = 0
        except OSError as e:
            raise TransportClosed(f"connection to {self.peer} failed: {e}") from None
        if sent != sum(map(len, views)):
            self._send_rest(views, sent, deadline)

    def _send_rest(self, views: Sequence[Bytes], sent: int, deadline: float) -> None:
        views = [memoryview(v).cast("B") for v in views]
        try:
            while True:
                while views and sent >= len(views[0]):
                    sent -= len(views[0])
                    views.pop(0)
                if not views:
                    return
                if sent:
                    views[0] = views[0][sent:]
                try:
                    sent = self.sock.sendmsg(views)
                except BlockingIOError:
                    remaining(deadline)
                    sent = 0
        except TransportTimeout:
            raise TransportTimeout(f"sending to {self.peer} did not finish within the timeout") from None
        except OSError as e:
            if isinstance(e, TransportError):
                raise
            raise TransportClosed(f"connection to {self.peer} failed: {e}") from None

    def send_file(self, head: bytes, fd: int, offset: int, length: int, what: str,
                  timeout: float | None = None) -> None:
        """One message: ``head``, then ``length`` bytes of the file ``fd`` from ``offset``, sent by the
        native core's ``sendfile`` (page cache to socket, no copy in this process). A failure closes
        the connection, since the frame may be cut, and raises TransportClosed naming ``what``."""
        from ..native import core
        timeout = self.default_timeout if timeout is None else timeout
        with self._send_lock:
            try:
                core.send_file(self.sock.fileno(), fd, offset, length, LENGTH.pack(len(head) + length) + head, timeout)
            except OSError as e:        # TimeoutError included
                self.close()
                raise TransportClosed(f"sending {what} to {self.peer} failed: {e}") from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for region in self._regions:
            region.close()
        for side in self._side.values():
            side.close()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    # -- one-sided -----------------------------------------------------------------------------
    def register(self, buffer: Bytes | int) -> "TcpRegion":
        region = TcpRegion(buffer, self.sock.getsockname()[0])
        self._regions.append(region)
        return region

    def _side_sock(self, remote: RemoteRegion, deadline: float) -> socket.socket:
        host, port = remote.address.rsplit(":", 1)
        key = (host, int(port))
        sock = self._side.get(key)
        if sock is None:
            try:
                sock = socket.create_connection(key, timeout=remaining(deadline))
            except OSError as e:
                raise TransportClosed(f"region server {remote.address} unreachable: {e}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            from .. import auth   # here, not at import: auth itself imports the transports
            auth.client_handshake_socket(sock, remaining(deadline))
            self._side[key] = sock
        sock.settimeout(remaining(deadline))
        return sock

    def _one_sided(self, op: bytes, remote: RemoteRegion, offset: int, length: int, data: Bytes,
                   timeout: float | None) -> bytes:
        if offset < 0 or length < 0 or offset + length > remote.length:
            raise TransportError(f"{op.decode()} of {length} bytes at {offset} is outside the "
                                 f"{remote.length}-byte region")
        deadline = deadline_of(timeout, self.default_timeout)
        key = remote.key.encode()
        sock = self._side_sock(remote, deadline)
        try:
            sock.sendall(_OP.pack(op, len(key), offset, length) + key + bytes(data))
            status = _recv_exact(sock, 1)
            if status != b"\x00":
                raise TransportError(f"region server refused {op.decode()} on key {remote.key}")
            return _recv_exact(sock, length) if op == b"G" else b""
        except socket.timeout:
            raise TransportTimeout(f"{op.decode()} to {remote.address} timed out") from None
        except OSError as e:
            if isinstance(e, TransportError):
                raise
            raise TransportClosed(f"region server {remote.address} failed: {e}") from None

    def put(self, remote: RemoteRegion, offset: int, data: Bytes, timeout: float | None = None) -> None:
        self._one_sided(b"P", remote, offset, len(data), data, timeout)

    def get(self, remote: RemoteRegion, offset: int, length: int, timeout: float | None = None) -> bytes:
        return self._one_sided(b"G", remote, offset, length, b"", timeout)


def _readable(sock: socket.socket, timeout: float) -> bool:
    poller = select.poll()   # not select(): descriptors above 1023 are normal on a busy server
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise TransportClosed("peer closed the connection")
        got += k
    return bytes(buf)


def _recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise TransportClosed("peer closed the connection")
        got += k


class TcpRegion:
    def __init__(self, buffer: Bytes | int, host: str):
        self.view = memoryview(bytearray(buffer) if isinstance(buffer, int) else buffer).cast("B")
        if self.view.readonly:
            raise TransportError("cannot register read-only memory")
        self.length = len(self.view)
        self.key = secrets.token_hex(8)
        self._server = _region_server(host)
        self._server.regions[self.key] = self.view

    def remote(self) -> RemoteRegion:
        host, port = self._server.address
        return RemoteRegion("tcp", f"{host}:{port}", self.key, self.length)

    def close(self) -> None:
        self._server.regions.pop(self.key, None)


class _RegionServer:
    """Serves put/get on this process's registered regions to peers holding the run's credentials,
    one thread per peer connection (at most ``MAX_PEERS``; idle ones close after ``IDLE_TIMEOUT``).
    A put lands straight in the region, so nothing is allocated at a size the peer chose, and a
    request outside a region is refused and the connection closed without reading its data."""

    MAX_PEERS = 256
    IDLE_TIMEOUT = 60.0

    def __init__(self, host: str):
        self.regions: dict[str, memoryview] = {}
        self._sock = socket.create_server((host, 0), backlog=1024)
        self.address = self._sock.getsockname()[:2]
        self._peers = threading.BoundedSemaphore(self.MAX_PEERS)
        threading.Thread(target=self._accept, name=f"hpcnet-regions-{host}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                time.sleep(0.05)   # out of descriptors, or a connection reset before we took it
                continue
            if not self._peers.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        from .. import auth
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not auth.serve_handshake_socket(conn, "tcp region server"):
                return
            conn.settimeout(self.IDLE_TIMEOUT)
            with conn:
                while True:
                    op, klen, offset, length = _OP.unpack(_recv_exact(conn, _OP.size))
                    region = self.regions.get(_recv_exact(conn, klen).decode(errors="replace"))
                    if op not in (b"P", b"G") or region is None or offset + length > len(region):
                        conn.sendall(b"\x01")
                        return
                    if op == b"P":
                        _recv_exact_into(conn, region[offset:offset + length])
                        conn.sendall(b"\x00")
                    else:
                        conn.sendall(b"\x00")
                        conn.sendall(region[offset:offset + length])
        except (OSError, struct.error):
            return
        finally:
            conn.close()
            self._peers.release()


_region_servers: dict[str, _RegionServer] = {}
_region_lock = threading.Lock()


def _region_server(host: str) -> _RegionServer:
    with _region_lock:
        if host not in _region_servers:
            _region_servers[host] = _RegionServer(host)
        return _region_servers[host]


class TcpListener:
    def __init__(self, host: str, port: int, buffers: str, default_timeout: float):
        try:
            self._sock = socket.create_server((host, port), backlog=1024)
        except (OSError, OverflowError, ValueError) as e:
            raise TransportError(f"cannot listen on {host}:{port}: {e}") from None
        self.address = self._sock.getsockname()[:2]
        self._buffers, self._default_timeout = buffers, default_timeout

    def accept(self, timeout: float | None = None) -> TcpConnection:
        try:
            # inside the try: close() from another thread may land before settimeout (EBADF)
            self._sock.settimeout(self._default_timeout if timeout is None else timeout)
            sock, _ = self._sock.accept()
        except socket.timeout:
            raise TransportTimeout("no connection within the timeout") from None
        except OSError as e:
            raise TransportClosed(f"listener on {self.address} closed: {e}") from None
        # cold: the pool is registered when a server admits the peer (serving.Server), so a flood of
        # connections that never get that far costs no buffers
        return TcpConnection(sock, make_buffers(self._buffers, cold=True), self._default_timeout)

    def close(self) -> None:
        self._sock.close()


class TcpTransport:
    name = "tcp"

    def __init__(self, default_timeout: float = DEFAULT_TIMEOUT):
        self.default_timeout = default_timeout

    def listen(self, host: str, port: int, buffers: str = "pooled") -> TcpListener:
        make_buffers(buffers)   # reject an unknown design now, not at the first accept
        return TcpListener(host, port, buffers, self.default_timeout)

    def connect(self, address: tuple[str, int], timeout: float | None = None,
                buffers: str = "pooled") -> TcpConnection:
        t = self.default_timeout if timeout is None else timeout
        try:
            sock = socket.create_connection(tuple(address), timeout=t)
        except socket.timeout:
            raise TransportTimeout(f"connecting to {address[0]}:{address[1]} timed out") from None
        except (OSError, OverflowError, ValueError) as e:
            raise TransportClosed(f"cannot connect to {address[0]}:{address[1]}: {e}") from None
        return TcpConnection(sock, make_buffers(buffers), self.default_timeout)
