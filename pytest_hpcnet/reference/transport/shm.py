"""The ``shm`` transport: same-host shared-memory rings, no socket on the data path.

Setup: the listener is an abstract unix socket named after (host, port). On accept the server creates
one anonymous shared-memory file (``memfd_create``) holding two single-producer/single-consumer byte
rings, plus four eventfd doorbells, and passes their descriptors to the client over the unix socket
(SCM_RIGHTS). The memory has no name in /dev/shm, so nothing can leak there even if both processes are
killed. After the handshake the unix socket carries no data: it stays open only so each side notices
when the other process dies (it reads as EOF).

Data path: each ring has a ``head`` (bytes ever written, stored only by the producer) and a ``tail``
(bytes ever read, stored only by the consumer) as aligned 8-byte words; a byte stream with the same
4-byte length framing as tcp flows through it.

Wake-up strategy: adaptive spin, then doorbell. A waiting side first polls the ring for up to a spin
budget so a message already on its way arrives without a sleep -- but only while spinning can pay:
(1) the peer has work: it has not yet read everything we sent, or it is awake (its "waiting"
flag on our outgoing ring is clear) -- a peer asleep with nothing to read will not write soon, (2) no other thread of this process is spinning (many readers
of one server must not burn the cores their peers need), and (3) recent spins succeeded: the budget
doubles (up to the maximum) after a spin that caught the message and halves after one that did not,
so on a box where the peer cannot run while we spin the spinning fades out by itself. Between checks
the spinner calls ``sched_yield`` (which also releases the GIL): a runnable task on this core gets
it, and the spin costs nothing it would have used. The maximum is ``HPCNET_SHM_SPIN`` seconds;
the default is 0 (no spin) because on the 2-core box we measure on, spinning still did not pay:
64-byte echo p50 88-97 us without and 96-102 us with a 200 us adaptive spin (interleaved runs,
2026-11-30). The spins did catch the reply (~95% of waits once warmed up), but each side burns
its spin while the other needs ~45 us of Python per call, so both sides' CPU per call grew by
5-10 us. An earlier fixed spin (``time.sleep(0)``, 200 us, no feedback) lost more: ~210 us against
~130 us. With spare cores the knob can pay. Then it sets its "waiting" flag,
re-checks, and sleeps in ``poll()`` on an eventfd doorbell plus the liveness socket. The other side
rings the doorbell only when it sees the flag, so a busy stream makes no system calls at all. We chose
an eventfd doorbell over sleep-with-backoff because a backoff sleep puts its own length (tens of
microseconds or more) into every idle-to-busy transition, which is exactly the small-message latency
this transport exists to cut. The flag store and the counter load can be reordered by the CPU, so a
wake-up can be missed; every sleep is therefore capped at ``MAX_SLEEP`` and re-checks, which bounds the
cost of that race without futexes.

One-sided put/get: ``register`` creates a named file under /dev/shm (the peer must be able to open it
by name), which ``Region.close`` and ``Connection.close`` unlink.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import secrets
import select
import socket
import struct
import time
import weakref
from typing import Sequence

from ..buffers import Bytes, make_buffers
from .base import (DEFAULT_TIMEOUT, PeerRefused, RemoteRegion, StreamConnection, TransportClosed,
                   TransportError, TransportTimeout, deadline_of, remaining)

RING_CAPACITY = 1 << 20     # bytes per direction; larger messages stream through in pieces
SPIN_SECONDS = 0.0          # maximum adaptive spin before arming the doorbell; HPCNET_SHM_SPIN overrides
_spinners = [0]             # threads of this process spinning right now (a racy hint is enough)
MAX_SLEEP = 0.005
CTRL = 320                  # per ring: head, tail, reader/writer waiting, closed -- one cache line each
HEAD, TAIL, READER_WAITING, WRITER_WAITING, CLOSED = 0, 8, 16, 24, 32   # indices of 8-byte words
SHM_DIR = "/dev/shm"
REGION_PREFIX = "hpcnet-region-"
HANDSHAKE_TIMEOUT = 5.0


def spin_seconds() -> float:
    """The maximum spin phase in seconds (see the module docstring)."""
    text = os.environ.get("HPCNET_SHM_SPIN")
    if text is None:
        return SPIN_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        from ...errors import ConfigError
        raise ConfigError(f"expected seconds in [0, 1), got {text!r}", where="HPCNET_SHM_SPIN")
    return value


def socket_name(host: str, port: int) -> bytes:
    return f"\0pytest-hpcnet-shm/{host}:{port}".encode()


class _Ring:
    """One direction: a control block and ``capacity`` data bytes inside the shared mapping."""

    def __init__(self, mem: memoryview, offset: int, capacity: int):
        self.ctrl = mem[offset:offset + CTRL].cast("Q")
        self.data = mem[offset + CTRL:offset + CTRL + capacity]
        self.capacity = capacity
        self.mask = capacity - 1

    def release(self) -> None:
        self.ctrl.release()
        self.data.release()


class _Doorbell:
    def __init__(self, fd: int):
        self.fd = fd

    def ring(self) -> None:
        try:
            os.eventfd_write(self.fd, 1)
        except OSError:
            pass

    def drain(self) -> None:
        try:
            os.eventfd_read(self.fd)
        except (BlockingIOError, OSError):
            pass


class ShmConnection(StreamConnection):
    transport = "shm"

    def __init__(self, mm: mmap.mmap, capacity: int, is_server: bool, fds: Sequence[int],
                 liveness: socket.socket, buffers, default_timeout: float = DEFAULT_TIMEOUT):
        super().__init__(buffers, default_timeout)
        self._mm = mm
        self._mem = memoryview(mm)
        c2s, s2c = _Ring(self._mem, 0, capacity), _Ring(self._mem, CTRL + capacity, capacity)
        srv_data, srv_space, cli_data, cli_space = (_Doorbell(fd) for fd in fds)
        self._fds = list(fds)
        if is_server:
            self._rx, self._tx = c2s, s2c
            self._my_data, self._my_space, self._peer_data, self._peer_space = \
                srv_data, srv_space, cli_data, cli_space
        else:
            self._rx, self._tx = s2c, c2s
            self._my_data, self._my_space, self._peer_data, self._peer_space = \
                cli_data, cli_space, srv_data, srv_space
        self._live = liveness
        self._live.setblocking(False)
        self._peer_gone = False
        self._spin_max = spin_seconds()
        self._spin = self._spin_max   # current adaptive budget
        self._pollers = {}            # doorbell fd -> poll object (doorbell + liveness socket)
        self.peer = f"shm:{'client' if is_server else 'server'}"
        weakref.finalize(self, _release, mm, list(fds), liveness)
        self._regions: list[ShmRegion] = []
        self._maps: dict[str, tuple[mmap.mmap, memoryview]] = {}

    # -- waiting -------------------------------------------------------------------------------
    def _check_peer(self) -> None:
        if self._closed:
            raise TransportClosed("connection is closed")
        if self._peer_gone:
            raise TransportClosed("peer closed the shared-memory connection")
        try:
            if self._live.recv(1, socket.MSG_PEEK) == b"":
                self._peer_gone = True
        except BlockingIOError:
            return
        except OSError:
            self._peer_gone = True
        if self._peer_gone:
            raise TransportClosed("peer closed the shared-memory connection")

    def _peer_idle(self) -> bool:
        """The peer has read all we sent and sleeps waiting for more: no reply is on its way."""
        tx = self._tx.ctrl
        return tx[HEAD] == tx[TAIL] and tx[READER_WAITING] != 0

    def _spin_wait(self, ready) -> bool:
        """Spin for up to the adaptive budget while the peer has work; True if ``ready()`` came true."""
        peer_idle = self._peer_idle
        if not self._spin or _spinners[0] or peer_idle():
            return False
        _spinners[0] += 1
        try:
            clock, yield_cpu = time.perf_counter, os.sched_yield
            until = clock() + self._spin
            while True:
                if ready():
                    self._spin = min(self._spin * 2, self._spin_max)
                    return True
                # checked after the last yield too: a yield may hand the core to the peer for longer
                # than the whole budget, and what it wrote then counts as caught by the spin
                if clock() >= until or peer_idle():
                    break   # out of budget, or the peer went to sleep: nothing is coming soon
                yield_cpu()
        finally:
            _spinners[0] -= 1
        self._spin = self._spin / 2 if self._spin > 2e-6 else 0.0
        return False

    def _poller(self, bell: _Doorbell):
        poller = self._pollers.get(bell.fd)
        if poller is None:
            poller = self._pollers[bell.fd] = select.poll()
            poller.register(bell.fd, select.POLLIN)
            poller.register(self._live.fileno(), select.POLLIN)
        return poller

    def _wait(self, ready, flag_ring: _Ring, flag: int, bell: _Doorbell, deadline: float, what: str,
              spin: bool = False):
        if spin and self._spin_wait(ready):
            return
        if self._spin_max and not self._spin and not _spinners[0]:
            self._spin = 1e-6 * 4   # probe again now and then: conditions change
        while True:
            if ready():
                return
            if flag_ring.ctrl[CLOSED] or self._closed:
                self._check_peer()
                raise TransportClosed("peer closed the shared-memory connection")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportTimeout(f"{what} within the timeout")
            flag_ring.ctrl[flag] = 1
            try:
                if ready():
                    return
                events = self._poller(bell).poll(min(left, MAX_SLEEP) * 1000)
                for fd, _ in events:
                    if fd == bell.fd:
                        bell.drain()
                    else:
                        if ready():
                            return
                        self._check_peer()
            finally:
                flag_ring.ctrl[flag] = 0

    # -- the byte stream -----------------------------------------------------------------------
    def _recv_into(self, view: memoryview, deadline: float) -> int:
        ring = self._rx
        ctrl = ring.ctrl
        if ctrl[HEAD] == ctrl[TAIL]:
            self._wait(lambda: ctrl[HEAD] != ctrl[TAIL], ring, READER_WAITING, self._my_data, deadline,
                       "no data from the peer", spin=True)
        head, tail = ctrl[HEAD], ctrl[TAIL]
        pos = tail & ring.mask
        n = min(head - tail, len(view), ring.capacity - pos)
        view[:n] = ring.data[pos:pos + n]
        ctrl[TAIL] = tail + n
        if ctrl[WRITER_WAITING]:
            self._peer_space.ring()
        return n

    def _send_views(self, views: Sequence[Bytes], deadline: float) -> None:
        if self._closed:
            raise TransportClosed("connection is closed")
        ring = self._tx
        ctrl, cap = ring.ctrl, ring.capacity
        head = ctrl[HEAD]
        free = cap - (head - ctrl[TAIL])
        pos = head & ring.mask
        if sum(map(len, views)) <= min(free, cap - pos):
            # fast path: the whole message fits without waiting or wrapping; no per-part bookkeeping
            data = ring.data
            for v in views:
                n = len(v)
                data[pos:pos + n] = v
                pos += n
                head += n
            views = ()
        for v in views:
            v = memoryview(v).cast("B")
            off = 0
            while off < len(v):
                free = cap - (head - ctrl[TAIL])
                if free == 0:
                    ctrl[HEAD] = head           # publish what is written before waiting for space
                    if ctrl[READER_WAITING]:
                        self._peer_data.ring()
                    self._wait(lambda: cap - (head - ctrl[TAIL]) > 0, ring, WRITER_WAITING,
                               self._my_space, deadline, "the peer did not drain the ring")
                    self._check_peer()
                    continue
                pos = head & ring.mask
                n = min(free, len(v) - off, cap - pos)
                ring.data[pos:pos + n] = v[off:off + n]
                off += n
                head += n
        ctrl[HEAD] = head
        if ctrl[READER_WAITING]:
            self._peer_data.ring()

    def close(self) -> None:
        """Mark the ring closed, wake the peer, drop the liveness socket. The mapping and the
        doorbell descriptors are released by a finalizer when the last user lets go: another thread
        may still be inside a wait, and a reused descriptor number must never get our writes."""
        if self._closed:
            return
        self._closed = True
        try:
            self._tx.ctrl[CLOSED] = 1
        except ValueError:
            pass
        self._peer_data.ring()
        self._peer_space.ring()
        self._my_data.ring()     # our own waiting threads notice the close now
        self._my_space.ring()
        for region in self._regions:
            region.close()
        try:
            self._live.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- one-sided -----------------------------------------------------------------------------
    def register(self, buffer: Bytes | int) -> "ShmRegion":
        region = ShmRegion(buffer)
        self._regions.append(region)
        return region

    def _map(self, remote: RemoteRegion) -> memoryview:
        if remote.key not in self._maps:
            path = os.path.join(SHM_DIR, REGION_PREFIX + remote.key)
            # the key names a file: accept only what register() makes, so no path can be smuggled in
            if not REGION_KEY.fullmatch(remote.key) or remote.address != path:
                raise TransportError(f"region {remote.key!r} is not an shm region of this host")
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as e:
                raise TransportError(f"cannot open shm region {path}: {e}") from None
            try:
                mm = mmap.mmap(fd, remote.length)
            finally:
                os.close(fd)
            self._maps[remote.key] = (mm, memoryview(mm))
        return self._maps[remote.key][1]

    def put(self, remote: RemoteRegion, offset: int, data: Bytes, timeout: float | None = None) -> None:
        view = self._map(remote)
        if offset < 0 or offset + len(data) > remote.length:
            raise TransportError(f"put of {len(data)} bytes at {offset} is outside the region")
        view[offset:offset + len(data)] = data

    def get(self, remote: RemoteRegion, offset: int, length: int, timeout: float | None = None) -> bytes:
        view = self._map(remote)
        if offset < 0 or length < 0 or offset + length > remote.length:
            raise TransportError(f"get of {length} bytes at {offset} is outside the region")
        return bytes(view[offset:offset + length])

    def get_into(self, remote: RemoteRegion, offset: int, into: memoryview, timeout: float | None = None) -> None:
        """``get`` of ``len(into)`` bytes straight into a caller's buffer: one copy, no new bytes object
        (a reducer's segments land in one buffer it allocated once)."""
        view = self._map(remote)
        if offset < 0 or offset + len(into) > remote.length:
            raise TransportError(f"get of {len(into)} bytes at {offset} is outside the region")
        into[:] = view[offset:offset + len(into)]


def _release(mm: mmap.mmap, fds: list[int], liveness: socket.socket) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    liveness.close()
    try:
        mm.close()
    except BufferError:   # views still exported; the mapping goes when they do
        pass


class ShmRegion:
    """A named /dev/shm file the peer can map.

    Named ``hpcnet-region-<owner pid>-<token>``; unlinked on ``close``, when the object is collected
    or the interpreter exits, and -- for owners that were killed and could do none of that -- by the
    next process that registers a region, which removes files whose owner pid no longer exists.
    """

    def __init__(self, buffer: Bytes | int):
        src = None if isinstance(buffer, int) else memoryview(buffer).cast("B")
        self.length = buffer if isinstance(buffer, int) else len(src)
        if self.length <= 0:
            raise TransportError("cannot register an empty region")
        _sweep_stale_regions()
        self.key = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.path = os.path.join(SHM_DIR, REGION_PREFIX + self.key)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._unlink = weakref.finalize(self, _unlink_quietly, self.path)
        try:
            os.ftruncate(fd, self.length)
            self._mm = mmap.mmap(fd, self.length)
        except OSError:
            self._unlink()
            raise
        finally:
            os.close(fd)
        self.view = memoryview(self._mm)
        if src is not None:   # shared memory cannot adopt existing pages: start from their content
            self.view[:] = src
        self._closed = False

    def remote(self) -> RemoteRegion:
        return RemoteRegion("shm", self.path, self.key, self.length)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unlink()
        try:
            self.view.release()
            self._mm.close()
        except BufferError:   # someone still holds a view; the mapping goes with the process
            pass


REGION_KEY = re.compile(r"(\d+)-[0-9a-f]{16}")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sweep_stale_regions() -> None:
    """Remove region files whose owner process is gone (it was killed before it could clean up)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        m = REGION_KEY.fullmatch(name[len(REGION_PREFIX):]) if name.startswith(REGION_PREFIX) else None
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _unlink_quietly(os.path.join(SHM_DIR, name))


def _new_mapping(capacity: int) -> tuple[int, mmap.mmap]:
    fd = os.memfd_create("pytest-hpcnet-shm", os.MFD_CLOEXEC)
    size = 2 * (CTRL + capacity)
    os.ftruncate(fd, size)
    return fd, mmap.mmap(fd, size)


_UCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (SO_PEERCRED, set by the kernel)."""
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid


class ShmListener:
    def __init__(self, host: str, port: int, buffers: str, default_timeout: float, capacity: int):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ports = [port] if port else [secrets.randbelow(40000) + 20000 for _ in range(50)]
        for p in ports:
            try:
                self._sock.bind(socket_name(host, p))
                break
            except OSError as e:
                err = e
        else:
            self._sock.close()
            raise TransportError(f"cannot listen on shm {host}:{port}: {err}")
        self._sock.listen(1024)
        self.address = (host, p)
        self._buffers, self._default_timeout, self._capacity = buffers, default_timeout, capacity

    def accept(self, timeout: float | None = None) -> ShmConnection:
        deadline = deadline_of(timeout, self._default_timeout)
        self._sock.settimeout(remaining(deadline))
        try:
            conn, _ = self._sock.accept()
        except socket.timeout:
            raise TransportTimeout("no connection within the timeout") from None
        except OSError as e:
            raise TransportClosed(f"listener on shm {self.address} closed: {e}") from None
        uid = peer_uid(conn)
        if uid != os.geteuid():   # an abstract socket has no file permissions: check who connected
            conn.close()
            raise PeerRefused(f"shm peer runs as uid {uid}, not this run's uid {os.geteuid()}")
        memfd, mm = _new_mapping(self._capacity)
        fds = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(4)]
        try:
            # Its own short timeout, not what is left of the accept wait (which may be ~0). There is
            # no reply to wait for: the rings are ready before the descriptors leave, and a client
            # that dies before mapping them shows up as EOF on the liveness socket.
            conn.settimeout(HANDSHAKE_TIMEOUT)
            socket.send_fds(conn, [json.dumps({"capacity": self._capacity}).encode()], [memfd, *fds])
        except (OSError, ValueError) as e:
            for fd in fds:
                os.close(fd)
            mm.close()
            conn.close()
            if isinstance(e, TransportError):
                raise
            raise TransportClosed(f"shm handshake failed: {e}") from None
        finally:
            os.close(memfd)
        return ShmConnection(mm, self._capacity, True, fds, conn, make_buffers(self._buffers),
                             self._default_timeout)

    def close(self) -> None:
        self._sock.close()


class ShmTransport:
    name = "shm"

    def __init__(self, default_timeout: float = DEFAULT_TIMEOUT, capacity: int = RING_CAPACITY):
        if capacity <= 0 or capacity & (capacity - 1):
            raise TransportError(f"ring capacity must be a power of two, got {capacity}")
        self.default_timeout, self.capacity = default_timeout, capacity

    def listen(self, host: str, port: int, buffers: str = "pooled") -> ShmListener:
        make_buffers(buffers)
        return ShmListener(host, port, buffers, self.default_timeout, self.capacity)

    def connect(self, address: tuple[str, int], timeout: float | None = None,
                buffers: str = "pooled") -> ShmConnection:
        deadline = deadline_of(timeout, self.default_timeout)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(remaining(deadline))
            sock.connect(socket_name(*address))
            if peer_uid(sock) != os.geteuid():
                raise PeerRefused(f"shm server {address[0]}:{address[1]} runs as uid {peer_uid(sock)}, "
                                  f"not ours ({os.geteuid()})")
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 5)
            if len(fds) != 5:
                for fd in fds:
                    os.close(fd)
                raise TransportClosed(f"shm server {address[0]}:{address[1]} sent a bad handshake")
            capacity = int(json.loads(msg)["capacity"])
            try:
                mm = mmap.mmap(fds[0], 2 * (CTRL + capacity))
            finally:
                os.close(fds[0])
        except socket.timeout:
            sock.close()
            raise TransportTimeout(f"shm connect to {address[0]}:{address[1]} timed out") from None
        except (OSError, ValueError, KeyError) as e:
            sock.close()
            if isinstance(e, TransportError):
                raise
            raise TransportClosed(f"cannot connect to shm {address[0]}:{address[1]}: {e}") from None
        return ShmConnection(mm, capacity, False, fds[1:], sock, make_buffers(buffers), self.default_timeout)
