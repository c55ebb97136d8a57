"""One verbs connection: eager send/receive with credits, rendezvous by RDMA READ, one-sided put/get
on registered regions, idle probes, and a close that never hangs (see the package's docstring)."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import os
import struct
import threading
import time
from typing import Sequence

from ..base import (RemoteRegion, StreamConnection, TransportClosed, TransportError, TransportTimeout, deadline_of)
from ...buffers import Bytes
from .events import connect_qp, drain, event_name, fd_lock, poke, readable, readable_fds, with_new_fd
from .memory import Device, Registered, live, quiet_close
from .wire import (CLOSE, CQ_DEPTH, CREDIT_BATCH, CREDIT_WR, DATA, EAGER, FIN, HDR, HELLO, MAX_RENDEZVOUS, NOP,
                   PROBE_IDLE, PROBE_MAX, RDMA_BASE, RECV_DEPTH, RNDV, RTS, SEND_BASE, SEND_DEPTH,
                   SEND_SLOTS, SLOT, SPIN_SECONDS, TAG, WAIT_SLICE)


# -- the connection --------------------------------------------------------------------------------------

class VerbsConnection(StreamConnection):
    transport = "verbs"

    def __init__(self, pv, device: Device, cm_id, buffers, default_timeout: float, peer: tuple,
                 channel=None, channel_fd: int | None = None, owner=None):
        super().__init__(buffers, default_timeout)
        self.pv, self.device, self.cm_id, self.peer = pv, device, cm_id, peer
        self._channel, self._channel_fd, self._owner = channel, channel_fd, owner
        e = pv.e
        self._lock = threading.RLock()
        self.comp_channel, self._cc_fd = with_new_fd(lambda: pv.cq.CompChannel(device.ctx), "infinibandevent")
        self.cq = pv.cq.CQ(device.ctx, CQ_DEPTH, None, self.comp_channel, 0)
        cap = pv.qp.QPCap(max_send_wr=SEND_DEPTH, max_recv_wr=RECV_DEPTH, max_send_sge=1, max_recv_sge=1)
        self.qp = pv.qp.QP(device.pd, pv.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self._recv = device.region(RECV_DEPTH * SLOT, e.IBV_ACCESS_LOCAL_WRITE, exact=True)
        self._send = device.region(SEND_SLOTS * SLOT, e.IBV_ACCESS_LOCAL_WRITE, exact=True)
        self._credit = device.region(64, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE, exact=True)
        self._credit.view[:16] = bytes(16)
        self._recv_wrs = [pv.wr.RecvWR(wr_id=i, num_sge=1, sg=[pv.wr.SGE(self._recv.addr + i * SLOT, SLOT,
                                                                       self._recv.lkey)])
                          for i in range(RECV_DEPTH)]
        self._free_send = list(range(SEND_SLOTS))
        self._send_wrs: dict[tuple[int, int], object] = {}   # (slot, size) -> SendWR, see _post_eager
        self._credit_wr = None
        self._sent = 0                 # SENDs posted (each used one peer receive)
        self._peer_reposted = 0        # receives the peer has re-posted, as far as we know
        self._reposted = 0             # receives we have re-posted
        self._reported = 0             # ... of which the peer has been told
        self._sq_used = 0
        self._rx: collections.deque = collections.deque()   # (kind, slot, payload view)
        self._chunk: memoryview | None = None
        self._chunk_release = None
        self._staging: dict[int, Registered] = {}          # tag -> staging region until FIN
        self._tags = itertools.count(1)
        self._rdma_ids = itertools.count(RDMA_BASE)
        self._rdma_done: set[int] = set()
        self._landing: Registered | None = None
        self._bounce: Registered | None = None
        self._retired: list[Registered] = []               # outgrown regions, back to the pool at close
        self._one_sided_lock = threading.Lock()
        self._peer_credit: tuple[int, int] | None = None     # (address, rkey) of the peer's credit word
        self._error: TransportError | None = None
        self._last_activity = time.monotonic()
        self._probes = 0                                    # NOPs since the last message either way
        self._regions: list[VerbsRegion] = []
        self._qp_destroyed = False
        self._waiters = 0                                   # threads inside _wait
        self._long_sleeper: int | None = None               # the one waiter blocked past WAIT_SLICE
        self._wake_fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        live.add(self)

    # -- setup ---------------------------------------------------------------------------------------
    def hello(self) -> bytes:
        """What the peer needs from us (the first message each way): where our credit word is."""
        return struct.pack("<QI", self._credit.addr, self._credit.rkey)

    def set_peer_hello(self, data: bytes) -> None:
        if len(data) >= 12:   # anything shorter is not our peer's; credits then only travel piggybacked
            self._peer_credit = struct.unpack_from("<QI", data)

    def bring_up(self) -> None:
        for _ in connect_qp(self.pv, self.cm_id, self.qp):
            for wr in self._recv_wrs:
                self.qp.post_recv(wr)
        self.cq.req_notify()

    # -- progress --------------------------------------------------------------------------------------
    def _progress(self) -> None:
        """Handle every completion waiting in the CQ (call with ``_lock`` held)."""
        e = self.pv.e
        while True:
            n, wcs = self.cq.poll(16)
            if n <= 0:
                return
            self._last_activity = time.monotonic()
            for wc in wcs:
                wid = wc.wr_id
                if wc.status != e.IBV_WC_SUCCESS:
                    if self._error is None:
                        self._error = TransportClosed(
                            f"RDMA connection to {self.peer} failed: work completion status {wc.status} "
                            f"({_wc_status_name(self.pv, wc.status)}); the peer is gone or the QP is in error")
                    if wid >= SEND_BASE:
                        self._sq_used -= 1
                    continue
                if wid < RECV_DEPTH:
                    self._on_receive(wid, wc.byte_len)
                elif wid < RDMA_BASE:
                    self._sq_used -= 1
                    self._free_send.append(wid - SEND_BASE)
                else:
                    self._sq_used -= 1
                    if wid != CREDIT_WR:
                        self._rdma_done.add(wid)

    def _on_receive(self, slot: int, nbytes: int) -> None:
        base = slot * SLOT
        kind, length, reposted = HDR.unpack_from(self._recv.view, base)
        self._peer_reposted = max(self._peer_reposted, reposted)
        if kind != NOP:
            self._probes = 0
        payload = self._recv.view[base + HDR.size: base + HDR.size + length]
        if kind in (DATA, RTS):
            self._rx.append((kind, slot, payload))
            return
        if kind == FIN:
            (tag,) = TAG.unpack(payload)
            region = self._staging.pop(tag, None)
            if region is not None:
                self.device.give_back(region)
        elif kind == CLOSE:
            self._rx.append((CLOSE, slot, payload))
            return
        elif kind == HELLO:
            first = self._peer_credit is None
            self.set_peer_hello(bytes(payload))
            if first and self._owner is not None and self._credits() > 0 and self._free_send:
                self._post_eager(HELLO, [self.hello()])   # the accepting side answers the client's
        self._repost(slot)

    def _repost(self, slot: int) -> None:
        if self._error is not None or self._closed:
            return
        self.qp.post_recv(self._recv_wrs[slot])
        self._reposted += 1
        if self._reposted - self._reported >= CREDIT_BATCH and self._peer_credit and self._sq_used < SEND_DEPTH:
            self._write_credits()

    def _write_credits(self) -> None:
        pv = self.pv
        struct.pack_into("<Q", self._credit.view, 8, self._reposted)
        if self._credit_wr is None:   # always the same words on both sides: made once
            self._credit_wr = pv.wr.SendWR(wr_id=CREDIT_WR, opcode=pv.e.IBV_WR_RDMA_WRITE, num_sge=1,
                                           sg=[pv.wr.SGE(self._credit.addr + 8, 8, self._credit.lkey)],
                                           send_flags=pv.e.IBV_SEND_SIGNALED)
            self._credit_wr.set_wr_rdma(self._peer_credit[1], self._peer_credit[0])
        self.qp.post_send(self._credit_wr)
        self._sq_used += 1
        self._reported = self._reposted

    def _credits(self) -> int:
        (written,) = struct.unpack_from("<Q", self._credit.view, 0)
        self._peer_reposted = max(self._peer_reposted, written)
        return RECV_DEPTH + self._peer_reposted - self._sent

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise TransportClosed(f"connection to {self.peer} is closed")

    def _raise_if_broken(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise TransportClosed(f"connection to {self.peer} is closed")

    def _wait(self, ready, deadline: float, what: str, watches_memory: bool = False):
        """Return ``ready()`` once it is true; spin briefly, then block on the completion channel.

        How long one block lasts: ``WAIT_SLICE`` when ``ready`` watches memory the peer RDMA-WRITEs
        (the credit word raises no completion) or when another thread waits on this connection too
        (it may take the completion this one waits for, and the channel's one event with it).
        Otherwise the only thread waiting sleeps until a completion, the next idle probe or the
        deadline: a server's idle connections each have a reader waiting, and a hundred of them
        waking every 20 ms kept a whole (emulated) CPU busy, starving the listener that accepts new
        connections. A thread that starts waiting while another sleeps long wakes it (``_wake_fd``)."""
        spin_until = time.monotonic() + SPIN_SECONDS
        me, registered = threading.get_ident(), False
        try:
            while True:
                with self._lock:
                    self._raise_if_closed()   # never touch the CQ after close() destroyed it
                    self._progress()
                    result = ready()
                    if result:
                        return result
                    self._raise_if_broken()
                    self._check_cm()
                now = time.monotonic()
                if now >= deadline:
                    raise TransportTimeout(f"{what} on the RDMA connection to {self.peer} did not complete "
                                           "within the timeout")
                if now < spin_until:
                    time.sleep(0)   # spin, but let this process's other threads have the GIL
                    continue
                with self._lock:
                    self._raise_if_closed()
                    if not registered:   # only blocking waiters count (a send that finds credits never does)
                        registered = True
                        self._waiters += 1
                        if self._long_sleeper is not None:
                            poke(self._wake_fd)
                    self.cq.req_notify()
                    self._progress()
                    result = ready()
                    if result:
                        return result
                    alone = not watches_memory and self._waiters == 1
                    if alone:   # checked and registered under the lock: a newcomer's poke is not lost
                        self._long_sleeper = me
                        fds = [self._cc_fd, self._wake_fd]
                        if self._channel_fd is not None:   # a client's rdma_cm events (DISCONNECTED)
                            fds.append(self._channel_fd)
                        block = max(WAIT_SLICE, self._last_activity + self._probe_after() - now)
                    else:
                        fds, block = [self._cc_fd], WAIT_SLICE
                woke = self._cc_fd in readable_fds(fds, min(deadline - now, block))
                with self._lock:
                    if alone:
                        self._long_sleeper = None
                        drain(self._wake_fd)
                    if woke:
                        self._raise_if_closed()
                        with contextlib.suppress(self.pv.Error):   # another thread took the event
                            self.comp_channel.get_cq_event(self.cq)
                            self.cq.ack_events(1)
                if not woke and time.monotonic() - self._last_activity > self._probe_after():
                    self._probe()
        finally:
            if registered:
                with self._lock:
                    self._waiters -= 1
                    if self._closed and not self._waiters:
                        self._close_wake_fd()

    def _close_wake_fd(self) -> None:
        if self._wake_fd is not None:
            os.close(self._wake_fd)
            self._wake_fd = None

    def _probe_after(self) -> float:
        """Idle seconds before the next probe: PROBE_IDLE, doubling with each unanswered-by-traffic
        probe up to PROBE_MAX (a hundred idle connections probing every second cost a CPU in the
        emulated guest; a dead peer is still noticed within PROBE_MAX plus the RC retries)."""
        return min(PROBE_MAX, PROBE_IDLE * (1 << min(self._probes, 8)))

    def _probe(self) -> None:
        """An idle connection sends a NOP: to a dead peer it fails after the RC retries."""
        with self._lock:
            self._last_activity = time.monotonic()
            self._probes += 1
            if not self._closed and self._error is None and self._credits() > 1 and self._free_send and self._sq_used < SEND_DEPTH:
                self._post_eager(NOP, [])

    def _check_cm(self) -> None:
        """A client connection has its own rdma_cm channel: any event after setup means it is over."""
        if self._channel_fd is None or not readable(self._channel_fd, 0):
            return
        try:
            ev = self.pv.cmid.CMEvent(self._channel)
        except self.pv.Error:
            return
        kind = ev.event_type
        ev.ack_cm_event()
        self._error = TransportClosed(f"RDMA connection to {self.peer} ended: {event_name(self.pv, kind)}")

    # -- sending ---------------------------------------------------------------------------------------
    def _post_eager(self, kind: int, views: Sequence[Bytes]) -> None:
        pv = self.pv
        if kind != NOP:
            self._probes = 0
        slot = self._free_send.pop()
        base = slot * SLOT
        dst = self._send.view
        pos = base + HDR.size
        for v in views:
            n = len(v) if not isinstance(v, memoryview) else v.nbytes
            dst[pos:pos + n] = v if not isinstance(v, memoryview) else v.cast("B")
            pos += n
        length = pos - base - HDR.size
        HDR.pack_into(dst, base, kind, length, self._reposted)
        self._reported = self._reposted
        # One work request per (slot, power-of-two size) made once and reused: building a pyverbs
        # SendWR + SGE per message costs more than posting it. The receiver reads the length from the
        # header, so the few extra bytes of a rounded-up size are never looked at.
        size = min(SLOT, max(64, 1 << (HDR.size + length - 1).bit_length()))
        wr = self._send_wrs.get((slot, size))
        if wr is None:
            wr = self._send_wrs[(slot, size)] = pv.wr.SendWR(
                wr_id=SEND_BASE + slot, opcode=pv.e.IBV_WR_SEND, num_sge=1,
                sg=[pv.wr.SGE(self._send.addr + base, size, self._send.lkey)], send_flags=pv.e.IBV_SEND_SIGNALED)
        self.qp.post_send(wr)
        self._sent += 1
        self._sq_used += 1

    def _send_message(self, kind: int, views: Sequence[Bytes], deadline: float) -> None:
        def ready():
            return self._credits() > 0 and self._free_send and self._sq_used < SEND_DEPTH
        self._wait(ready, deadline, "waiting for send credits", watches_memory=True)
        with self._lock:
            self._raise_if_broken()
            self._post_eager(kind, views)

    def _send_views(self, views: Sequence[Bytes], deadline: float) -> None:
        self._raise_if_broken()
        views = [memoryview(v).cast("B") for v in views]
        total = sum(v.nbytes for v in views)
        if total <= EAGER:
            self._send_message(DATA, views, deadline)
            return
        staging = self.device.region(total, self.pv.e.IBV_ACCESS_LOCAL_WRITE | self.pv.e.IBV_ACCESS_REMOTE_READ)
        pos = 0
        for v in views:
            staging.view[pos:pos + v.nbytes] = v
            pos += v.nbytes
        with self._lock:
            tag = next(self._tags)
            self._staging[tag] = staging     # the peer reads it; its FIN gives it back
        self._send_message(RTS, [RNDV.pack(staging.addr, total, staging.rkey, tag)], deadline)

    # -- receiving -------------------------------------------------------------------------------------
    def _recv_into(self, view: memoryview, deadline: float) -> int:
        if self._chunk is None:
            self._next_chunk(deadline)
        chunk = self._chunk
        n = min(len(view), chunk.nbytes)
        view[:n] = chunk[:n]
        if n == chunk.nbytes:
            self._chunk = None
            release, self._chunk_release = self._chunk_release, None
            if release is not None:
                with self._lock:
                    release()
        else:
            self._chunk = chunk[n:]
        return n

    def _next_chunk(self, deadline: float) -> None:
        kind, slot, payload = self._wait(lambda: self._rx and self._rx.popleft(), deadline, "receiving")
        if kind == CLOSE:
            with self._lock:
                self._error = TransportClosed(f"peer {self.peer} closed the connection")
            raise self._error
        if kind == DATA:
            self._chunk, self._chunk_release = payload, (lambda: self._repost(slot))
            return
        addr, length, rkey, tag = RNDV.unpack(payload)
        with self._lock:
            self._repost(slot)
        if length > MAX_RENDEZVOUS:      # the peer chose this size: never register more than the cap
            with self._lock:
                self._error = TransportClosed(f"peer {self.peer} offered a {length}-byte rendezvous "
                                              f"(limit {MAX_RENDEZVOUS})")
            raise self._error
        landing = self._landing_region(length)
        self._rdma(self.pv.e.IBV_WR_RDMA_READ, landing, 0, length, addr, rkey, deadline)
        self._send_message(FIN, [TAG.pack(tag)], deadline)
        self._chunk, self._chunk_release = landing.view[:length], None

    def _landing_region(self, length: int) -> Registered:
        if self._landing is None or self._landing.length < length:
            if self._landing is not None:
                self._retired.append(self._landing)
            self._landing = self.device.region(length, self.pv.e.IBV_ACCESS_LOCAL_WRITE)
        return self._landing

    def _rdma(self, opcode: int, local: Registered, offset: int, length: int, remote_addr: int,
              rkey: int, deadline: float) -> None:
        pv = self.pv
        self._wait(lambda: self._sq_used < SEND_DEPTH, deadline, "waiting for a send-queue slot")
        with self._lock:
            self._raise_if_broken()
            wid = next(self._rdma_ids)
            wr = pv.wr.SendWR(wr_id=wid, opcode=opcode, num_sge=1,
                              sg=[pv.wr.SGE(local.addr + offset, length, local.lkey)],
                              send_flags=pv.e.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(rkey, remote_addr)
            self.qp.post_send(wr)
            self._sq_used += 1

        def done():
            if wid in self._rdma_done:
                self._rdma_done.discard(wid)
                return True
            return False
        self._wait(done, deadline, "an RDMA READ/WRITE")

    # -- one-sided -------------------------------------------------------------------------------------
    def register(self, buffer: Bytes | int) -> "VerbsRegion":
        region = VerbsRegion(self, buffer)
        self._regions.append(region)
        return region

    def _check_remote(self, remote: RemoteRegion, offset: int, length: int, op: str) -> tuple[int, int]:
        if remote.transport != "verbs":
            raise TransportError(f"{op}: region of transport {remote.transport!r} given to verbs")
        if offset < 0 or length < 0 or offset + length > remote.length:
            raise TransportError(f"{op} of {length} bytes at {offset} is outside the {remote.length}-byte region")
        return int(remote.address, 16) + offset, int(remote.key)

    def put(self, remote: RemoteRegion, offset: int, data: Bytes, timeout: float | None = None) -> None:
        data = memoryview(data).cast("B")
        addr, rkey = self._check_remote(remote, offset, data.nbytes, "put")
        if not data.nbytes:
            return
        with self._one_sided_lock:
            local = self._bounce_region(data.nbytes)
            local.view[:data.nbytes] = data
            self._rdma(self.pv.e.IBV_WR_RDMA_WRITE, local, 0, data.nbytes, addr, rkey,
                       deadline_of(timeout, self.default_timeout))

    def get(self, remote: RemoteRegion, offset: int, length: int, timeout: float | None = None) -> bytes:
        addr, rkey = self._check_remote(remote, offset, length, "get")
        if not length:
            return b""
        with self._one_sided_lock:
            local = self._bounce_region(length)
            self._rdma(self.pv.e.IBV_WR_RDMA_READ, local, 0, length, addr, rkey,
                       deadline_of(timeout, self.default_timeout))
            return bytes(local.view[:length])

    def _bounce_region(self, length: int) -> Registered:
        """This connection's registered bounce buffer for put/get, grown as needed. Never shared: an
        operation that timed out may still land in it, so it goes back to the pool only with the QP."""
        if self._bounce is None or self._bounce.length < length:
            if self._bounce is not None:
                self._retired.append(self._bounce)
            self._bounce = self.device.region(length, self.pv.e.IBV_ACCESS_LOCAL_WRITE)
        return self._bounce

    # -- teardown --------------------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:   # tell the peer (best effort: only if a credit and a slot are free right now)
                self._progress()
                if self._error is None and self._credits() > 0 and self._free_send and self._sq_used < SEND_DEPTH:
                    self._post_eager(CLOSE, [])
                    end = time.monotonic() + 0.2
                    while self._sq_used and time.monotonic() < end and self._error is None:
                        self._progress()
            except (self.pv.Error, TransportError):
                pass
            # destroyed under the lock: another thread may be about to poll the CQ (it checks _closed)
            for region in self._regions:
                region.close()
            self._qp_destroyed = quiet_close(self.qp)
            if self._owner is not None:
                self._owner._forget(self)
            else:
                quiet_close(self.cm_id)
                with fd_lock:
                    quiet_close(self._channel)
            quiet_close(self.cq)
            with fd_lock:   # a descriptor number freed here must not confuse a concurrent discovery
                quiet_close(self.comp_channel)
            if self._qp_destroyed:   # nothing can land in these any more: reuse them
                for region in (self._recv, self._send, self._credit, self._landing, self._bounce,
                               *self._retired, *self._staging.values()):
                    if region is not None:
                        self.device.give_back(region)
            self._staging.clear()
            if self._waiters:
                poke(self._wake_fd)   # a waiter sleeping long sees the close now; it closes the fd
            else:
                self._close_wake_fd()
            live.discard(self)


def _wc_status_name(pv, status: int) -> str:
    for name in dir(pv.e):
        if name.startswith("IBV_WC_") and name.endswith("_ERR") and getattr(pv.e, name) == status:
            return name
    return "IBV_WC_SUCCESS" if status == 0 else str(status)


class VerbsRegion:
    """Registered memory the peer can put into / get from. Memory we own is registered directly; a
    caller's writable buffer is registered in place (so ``view`` aliases it, as on tcp); a read-only
    one is copied into a fresh region."""

    def __init__(self, conn: VerbsConnection, buffer: Bytes | int):
        e = conn.pv.e
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        self._mr = None
        if isinstance(buffer, int):
            self._raw = (ctypes.c_char * max(buffer, 1))()
            self.view = memoryview(self._raw).cast("B")[:buffer]
        else:
            source = memoryview(buffer).cast("B")
            if source.readonly:
                raise TransportError("cannot register read-only memory")
            self._raw = (ctypes.c_char * source.nbytes).from_buffer(source)
            self.view = source
        self.length = len(self.view)
        self._mr = conn.pv.mr.MR(conn.device.pd, max(self.length, 1), access, address=ctypes.addressof(self._raw))
        self.addr = ctypes.addressof(self._raw)

    def remote(self) -> RemoteRegion:
        return RemoteRegion("verbs", f"{self.addr:x}", str(self._mr.rkey), self.length)

    def close(self) -> None:
        if self._mr is not None:
            quiet_close(self._mr)
            self._mr = None
