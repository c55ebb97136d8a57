"""The ``verbs`` transport: RDMA through pyverbs, RC queue pairs connected with rdma_cm.

Shape (the RPCoIB / RDMA-Hadoop design):

- **Connection setup** with the asynchronous rdma_cm API (one event channel per listener and per
  client connection) and an *external* RC QP that we create and move INIT -> RTR -> RTS with the
  attributes ``rdma_init_qp_attr`` gives. Our own QP, CQ and completion channel, because pyverbs'
  CMID-owned ones only send whole MRs and wait with the GIL held.
- **Never blocking inside pyverbs.** pyverbs calls librdmacm/libibverbs without releasing the GIL, so
  a blocking ``rdma_get_cm_event`` or ``ibv_get_cq_event`` would freeze every thread of the process
  (a server and client in one process would deadlock). Both channel descriptors are set non-blocking
  and waited on with ``poll()`` from Python (which releases the GIL); pyverbs hides the descriptors,
  so they are found as the one new ``/proc/self/fd`` entry of their kind after creating the channel.
- **Registered memory once:** per device one context and protection domain for the process; receive
  slots, send slots and rendezvous staging/landing regions come from a process-wide pool of
  registered regions and go back to it when a connection closes.
- **Eager** messages (up to ``EAGER`` bytes) are copied into a registered send slot and SENT into one
  of the peer's ``RECV_DEPTH`` posted receive slots. **Rendezvous** for larger ones: the sender copies
  into a registered staging region and sends its (address, rkey, length); the receiver RDMA-READs it
  into a registered landing region and answers FIN, which frees the staging region.
- **Credits:** a sender may only have as many SENDs outstanding as the peer has posted receives. Each
  header carries the count of receives its sender has re-posted so far; when enough are unreported
  and nothing goes the other way, the receiver RDMA-WRITEs that count into the peer's credit word, so
  returning credits never consumes a receive (no credit deadlock). Where each side's credit word is
  travels in a HELLO message each way (rdma-core 44's pyverbs drops rdma_cm private data).
- **Completions:** poll the CQ, spin ``SPIN_SECONDS``, then arm the CQ and ``poll()`` the completion
  channel. Waits for credits are capped at ``WAIT_SLICE`` so credit-word updates (which raise no
  completion) are seen, and so are waits that share the connection with another waiting thread; a
  lone waiter sleeps until a completion, the next probe or its deadline (idle connections cost
  nothing between probes).
- **Failures are exceptions, never hangs:** no RDMA device / unroutable address -> ``TransportError``;
  peer gone (its CLOSE, a DISCONNECTED event, a failed work request after the RC retries; an idle
  connection probes its peer with a NOP after ``PROBE_IDLE`` s, backing off to ``PROBE_MAX``) ->
  ``TransportClosed``; a QP error -> ``TransportClosed`` naming the work-completion status; every
  wait has a deadline.

Addresses: rdma_cm cannot use 127.0.0.1 (loopback has no RDMA device), so a loopback or wildcard host
is replaced by this machine's RDMA address: ``$HPCNET_VERBS_HOST`` or the first IPv4 address in the
GID table of an ACTIVE RDMA port. ``Listener.address`` reports the address actually used.

The framing above the eager/rendezvous messages is the byte stream of ``StreamConnection`` (4-byte
length + body), so ``send_raw``/``recv_raw`` (Hadoop's ``hrpc`` preamble) work as on tcp.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import errno
import fcntl
import ipaddress
import itertools
import os
import random
import select
import struct
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from ...timeouts import scaled
from ..buffers import Bytes, make_buffers
from .base import (DEFAULT_TIMEOUT, RemoteRegion, StreamConnection, TransportClosed, TransportError,
                   TransportTimeout, deadline_of)

RECV_DEPTH = 32                 # receives posted per connection = the peer's send credits
SLOT = 8192                     # bytes per eager slot (header included)
HDR = struct.Struct("<BxxxIQ")  # kind, payload length, receives the sender has re-posted (cumulative)
EAGER = SLOT - HDR.size
RNDV = struct.Struct("<QQIQ")   # RTS payload: address, length, rkey, tag
TAG = struct.Struct("<Q")       # FIN payload
DATA, RTS, FIN, CLOSE, NOP, HELLO = 1, 2, 3, 4, 5, 6
SEND_SLOTS = RECV_DEPTH
SEND_DEPTH = SEND_SLOTS + 32    # send queue: SENDs plus RDMA READ/WRITEs and credit writes
CQ_DEPTH = RECV_DEPTH + SEND_DEPTH + 8
SPIN_SECONDS = float(os.environ.get("HPCNET_VERBS_SPIN_US", "50")) * 1e-6   # busy-poll before blocking
WAIT_SLICE = 0.02
PROBE_IDLE = 1.0                # first idle probe; each further one waits twice as long ...
PROBE_MAX = 8.0                 # ... up to this, until the connection carries messages again
QP_TIMEOUT = 16                 # 4.096 us * 2^16 = 268 ms per try; with RETRY tries a dead peer shows in ~2 s
RETRY = 6
CONNECT_TIMEOUT_MS = int(scaled(5000))   # rdma_cm's address and route resolution
ACCEPT_SLICE = 0.2              # an accept() waiting for a connection looks for close() this often
CREDIT_BATCH = RECV_DEPTH // 4
_SEND_BASE, _RDMA_BASE, _CREDIT_WR = 1 << 16, 1 << 32, (1 << 48)


MAX_RENDEZVOUS = 128 * 1024 * 1024   # largest message any service accepts (ipc.maximum.data.length)


class VerbsUnavailable(TransportError):
    """pyverbs is missing or there is no usable RDMA device."""


def load_pyverbs() -> SimpleNamespace:
    """pyverbs' modules, with the enum module of either API (``libibverbs_enums`` from rdma-core 59,
    ``enums`` before). Raises VerbsUnavailable saying what to install."""
    try:
        from pyverbs import cmid, cq, device, mr, pd, qp, wr
        from pyverbs.pyverbs_error import PyverbsError
    except ImportError as e:
        raise VerbsUnavailable(
            f"the verbs transport needs pyverbs, which does not import here ({e}); install the "
            "distribution's rdma-core Python package (Debian/Ubuntu: apt install python3-pyverbs)") from None
    try:
        import pyverbs.libibverbs_enums as enums
    except ImportError:
        import pyverbs.enums as enums
    try:
        import pyverbs.librdmacm_enums as cm_enums
    except ImportError:
        import pyverbs.cm_enums as cm_enums
    return SimpleNamespace(cmid=cmid, cq=cq, device=device, mr=mr, pd=pd, qp=qp, wr=wr, e=enums,
                           ce=cm_enums, Error=PyverbsError)


def unavailable_reason() -> str | None:
    """Why the verbs transport cannot run in this process (pyverbs missing, no ACTIVE RDMA port with an
    address), or None when it can. Cached: the answer does not change while the process runs."""
    global _unavailable
    if _unavailable is None:
        try:
            load_pyverbs()
            rdma_host("127.0.0.1")
            _unavailable = ""
        except VerbsUnavailable as e:
            _unavailable = str(e)
    return _unavailable or None


_unavailable: str | None = None


def looks_usable() -> bool:
    """A cheap check (no pyverbs import): pyverbs is installed and an ACTIVE RDMA port has an address."""
    import importlib.util
    try:
        found = importlib.util.find_spec("pyverbs") is not None
    except (ImportError, ValueError):
        found = False
    return found and bool(os.environ.get("HPCNET_VERBS_HOST") or gid_ipv4_addresses())


# -- addresses ---------------------------------------------------------------------------------------

def gid_ipv4_addresses(sysfs: Path = Path("/sys/class/infiniband")) -> list[str]:
    """IPv4 addresses in the GID tables of ACTIVE RDMA ports (RoCE v2 GIDs are ::ffff:a.b.c.d)."""
    found = []
    for port in sorted(sysfs.glob("*/ports/*")):
        try:
            if "ACTIVE" not in (port / "state").read_text():
                continue
        except OSError:
            continue
        for index in range(16):   # the table has hundreds of (mostly empty) entries; IPs come first
            try:
                raw = (port / "gids" / str(index)).read_text().strip().replace(":", "")
            except OSError:
                break
            if len(raw) == 32 and raw[:24] == "00000000000000000000ffff":
                addr = str(ipaddress.IPv4Address(bytes.fromhex(raw[24:])))
                if addr not in found:
                    found.append(addr)
    return found


def rdma_host(host: str, sysfs: Path = Path("/sys/class/infiniband")) -> str:
    """The address rdma_cm should use for ``host``: itself, unless it is loopback or the wildcard."""
    try:
        special = host == "localhost" or ipaddress.ip_address(host).is_loopback or \
            ipaddress.ip_address(host).is_unspecified
    except ValueError:
        special = False
    if not special:
        return host
    override = os.environ.get("HPCNET_VERBS_HOST")
    if override:
        return override
    addresses = gid_ipv4_addresses(sysfs)
    if not addresses:
        raise VerbsUnavailable(f"no ACTIVE RDMA port with an IPv4 address to use for {host} (rdma_cm "
                               "cannot use loopback); set HPCNET_VERBS_HOST or bind an RDMA device to a netdev")
    return addresses[0]


# -- file descriptors pyverbs does not expose ----------------------------------------------------------

_fd_lock = threading.Lock()


def _fds(kind: str) -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if kind in os.readlink(f"/proc/self/fd/{name}"):
                out.add(int(name))
        except OSError:
            continue
    return out


def _with_new_fd(create, kind: str):
    """Call ``create()`` and return (its result, the one new descriptor of ``kind``, made non-blocking)."""
    with _fd_lock:
        before = _fds(kind)
        obj = create()
        new = _fds(kind) - before
    if len(new) != 1:
        raise TransportError(f"cannot find the descriptor of a new {kind} (found {sorted(new)})")
    fd = new.pop()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    return obj, fd


def _readable(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))


def _readable_fds(fds: Sequence[int], timeout: float) -> set[int]:
    """Which of ``fds`` are readable, waiting up to ``timeout`` s for one to be."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(max(0.0, timeout) * 1000)}


def _poke(fd: int | None) -> None:
    """Make an eventfd readable (wakes whoever polls it)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.eventfd_write(fd, 1)


def _drain(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):   # EAGAIN: nobody poked
            os.eventfd_read(fd)


# -- per-device resources and registered memory, shared by the process ---------------------------------

class _Registered:
    """A registered region over memory we own (ctypes), with a zero-copy memoryview of it."""

    def __init__(self, pv, pd, length: int, access: int):
        self.raw = (ctypes.c_char * length)()
        self.addr = ctypes.addressof(self.raw)
        self.length, self.access = length, access
        self.mr = pv.mr.MR(pd, length, access, address=self.addr)
        self.lkey, self.rkey = self.mr.lkey, self.mr.rkey
        self.view = memoryview(self.raw).cast("B")


class _Device:
    def __init__(self, pv, name: str):
        self.pv, self.name = pv, name
        self.ctx = pv.device.Context(name=name)
        self.pd = pv.pd.PD(self.ctx)
        self._free: dict[tuple[int, int], list[_Registered]] = collections.defaultdict(list)
        self._lock = threading.Lock()

    def region(self, length: int, access: int, exact: bool = False) -> _Registered:
        """A registered region of at least ``length`` bytes (a power of two unless ``exact``)."""
        size = length if exact else max(4096, 1 << (max(length, 1) - 1).bit_length())
        with self._lock:
            free = self._free[(size, access)]
            if free:
                return free.pop()
        return _Registered(self.pv, self.pd, size, access)

    def give_back(self, region: _Registered) -> None:
        with self._lock:
            free = self._free[(region.length, region.access)]
            if len(free) < 16:
                free.append(region)
                return
        region.mr.close()


    def close(self) -> None:
        with self._lock:
            regions = [r for free in self._free.values() for r in free]
            self._free.clear()
        for region in regions:
            _quiet_close(region.mr)
        _quiet_close(self.ctx)   # closes what still depends on it (PD, CQs, QPs, MRs) in order


_devices: dict[str, _Device] = {}
_devices_lock = threading.Lock()


_live: "weakref.WeakSet" = weakref.WeakSet()        # open connections and listeners


@atexit.register
def _close_devices() -> None:
    """Tear the verbs objects down before the interpreter does: its arbitrary order crashes pyverbs.
    Connections and listeners first, each under its own lock, so a daemon thread still waiting on one
    sees it closed instead of polling a destroyed CQ."""
    for obj in list(_live):
        try:
            obj.close()
        except Exception:
            pass
    with _devices_lock:
        devices = list(_devices.values())
        _devices.clear()
    for device in devices:
        device.close()


def _device(pv, name: str) -> _Device:
    with _devices_lock:
        if name not in _devices:
            _devices[name] = _Device(pv, name)
        return _devices[name]


def _cm_event(pv, channel, fd: int, deadline: float):
    """Read one rdma_cm event without blocking in C: (type, the event). The caller acks it."""
    while True:
        ev = _try_cm_event(pv, channel, fd, deadline)
        if ev is not None:
            return ev.event_type, ev


def _try_cm_event(pv, channel, fd: int, deadline: float):
    """Wait (in Python) until the channel is readable, then read an event; None if another reader
    took it. Raises TransportTimeout at the deadline."""
    if not _readable(fd, deadline - time.monotonic()):
        if time.monotonic() >= deadline:
            raise TransportTimeout("no rdma_cm event within the timeout")
        return None
    try:
        return pv.cmid.CMEvent(channel)
    except pv.Error as e:
        if getattr(e, "error_code", None) in (errno.EAGAIN, errno.EWOULDBLOCK) or "temporarily" in str(e):
            return None
        raise TransportError(f"reading an rdma_cm event failed: {e}") from None


def _event_name(pv, kind: int) -> str:
    for name in dir(pv.ce):
        if name.startswith("RDMA_CM_EVENT_") and getattr(pv.ce, name) == kind:
            return name[len("RDMA_CM_EVENT_"):]
    return str(kind)


def _connect_qp(pv, cm_id, qp) -> None:
    """Move our external QP through INIT -> RTR -> RTS with the attributes rdma_cm computed."""
    for state in (pv.e.IBV_QPS_INIT, pv.e.IBV_QPS_RTR, pv.e.IBV_QPS_RTS):
        attr, mask = cm_id.init_qp_attr(state)
        if state == pv.e.IBV_QPS_RTS:
            attr.timeout, attr.retry_cnt, attr.rnr_retry = QP_TIMEOUT, RETRY, 7
            mask |= pv.e.IBV_QP_TIMEOUT | pv.e.IBV_QP_RETRY_CNT | pv.e.IBV_QP_RNR_RETRY
        qp.modify(attr, mask)
        if state == pv.e.IBV_QPS_INIT:
            yield   # receives may be posted from INIT on; the caller posts them here


# -- the connection --------------------------------------------------------------------------------------

class VerbsConnection(StreamConnection):
    transport = "verbs"

    def __init__(self, pv, device: _Device, cm_id, buffers, default_timeout: float, peer: tuple,
                 channel=None, channel_fd: int | None = None, owner=None):
        super().__init__(buffers, default_timeout)
        self.pv, self.device, self.cm_id, self.peer = pv, device, cm_id, peer
        self._channel, self._channel_fd, self._owner = channel, channel_fd, owner
        e = pv.e
        self._lock = threading.RLock()
        self.comp_channel, self._cc_fd = _with_new_fd(lambda: pv.cq.CompChannel(device.ctx), "infinibandevent")
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
        self._staging: dict[int, _Registered] = {}          # tag -> staging region until FIN
        self._tags = itertools.count(1)
        self._rdma_ids = itertools.count(_RDMA_BASE)
        self._rdma_done: set[int] = set()
        self._landing: _Registered | None = None
        self._bounce: _Registered | None = None
        self._retired: list[_Registered] = []               # outgrown regions, back to the pool at close
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
        _live.add(self)

    # -- setup ---------------------------------------------------------------------------------------
    def hello(self) -> bytes:
        """What the peer needs from us (the first message each way): where our credit word is."""
        return struct.pack("<QI", self._credit.addr, self._credit.rkey)

    def set_peer_hello(self, data: bytes) -> None:
        if len(data) >= 12:   # anything shorter is not our peer's; credits then only travel piggybacked
            self._peer_credit = struct.unpack_from("<QI", data)

    def bring_up(self) -> None:
        for _ in _connect_qp(self.pv, self.cm_id, self.qp):
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
                    if wid >= _SEND_BASE:
                        self._sq_used -= 1
                    continue
                if wid < RECV_DEPTH:
                    self._on_receive(wid, wc.byte_len)
                elif wid < _RDMA_BASE:
                    self._sq_used -= 1
                    self._free_send.append(wid - _SEND_BASE)
                else:
                    self._sq_used -= 1
                    if wid != _CREDIT_WR:
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
            self._credit_wr = pv.wr.SendWR(wr_id=_CREDIT_WR, opcode=pv.e.IBV_WR_RDMA_WRITE, num_sge=1,
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
                            _poke(self._wake_fd)
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
                woke = self._cc_fd in _readable_fds(fds, min(deadline - now, block))
                with self._lock:
                    if alone:
                        self._long_sleeper = None
                        _drain(self._wake_fd)
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
        if self._channel_fd is None or not _readable(self._channel_fd, 0):
            return
        try:
            ev = self.pv.cmid.CMEvent(self._channel)
        except self.pv.Error:
            return
        kind = ev.event_type
        ev.ack_cm_event()
        self._error = TransportClosed(f"RDMA connection to {self.peer} ended: {_event_name(self.pv, kind)}")

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
                wr_id=_SEND_BASE + slot, opcode=pv.e.IBV_WR_SEND, num_sge=1,
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

    def _landing_region(self, length: int) -> _Registered:
        if self._landing is None or self._landing.length < length:
            if self._landing is not None:
                self._retired.append(self._landing)
            self._landing = self.device.region(length, self.pv.e.IBV_ACCESS_LOCAL_WRITE)
        return self._landing

    def _rdma(self, opcode: int, local: _Registered, offset: int, length: int, remote_addr: int,
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

    def _bounce_region(self, length: int) -> _Registered:
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
            self._qp_destroyed = _quiet_close(self.qp)
            if self._owner is not None:
                self._owner._forget(self)
            else:
                _quiet_close(self.cm_id)
                with _fd_lock:
                    _quiet_close(self._channel)
            _quiet_close(self.cq)
            with _fd_lock:   # a descriptor number freed here must not confuse a concurrent discovery
                _quiet_close(self.comp_channel)
            if self._qp_destroyed:   # nothing can land in these any more: reuse them
                for region in (self._recv, self._send, self._credit, self._landing, self._bounce,
                               *self._retired, *self._staging.values()):
                    if region is not None:
                        self.device.give_back(region)
            self._staging.clear()
            if self._waiters:
                _poke(self._wake_fd)   # a waiter sleeping long sees the close now; it closes the fd
            else:
                self._close_wake_fd()
            _live.discard(self)


def _quiet_close(obj) -> bool:
    """Close a pyverbs object; False if that failed (teardown must not raise over the real error)."""
    if obj is None:
        return True
    try:
        obj.close()
        return True
    except Exception:
        return False


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
            _quiet_close(self._mr)
            self._mr = None


# -- listener and transport ------------------------------------------------------------------------------

class VerbsListener:
    def __init__(self, pv, host: str, port: int, buffers: str, default_timeout: float):
        self.pv, self._buffers, self._default_timeout = pv, buffers, default_timeout
        ce = pv.ce
        self.host = rdma_host(host)
        self._channel, self._fd = _with_new_fd(pv.cmid.CMEventChannel, "rdma_cm")
        self._event_lock = threading.Lock()   # an event is read and acked before any child is destroyed
        self._children: set[VerbsConnection] = set()
        self._closed = False
        ports = [port] if port else random.sample(range(20000, 60000), 40)
        last = None
        for candidate in ports:   # rdma_cm has no getsockname: port 0 means we pick a free one
            self._id = pv.cmid.CMID(creator=self._channel)
            try:
                ai = pv.cmid.AddrInfo(src=self.host, src_service=str(candidate), port_space=ce.RDMA_PS_TCP,
                                      flags=ce.RAI_PASSIVE)
                self._id.bind_addr(ai)
                self._id.listen(1024)
                break
            except pv.Error as e:
                last = e
                _quiet_close(self._id)
        else:
            _quiet_close(self._channel)
            raise VerbsUnavailable(f"cannot listen for RDMA connections on {self.host}:{port or '(any)'}: "
                                   f"{last} (is there an RDMA device on that address?)")
        self.address = (self.host, candidate)
        self.device = _device(pv, self._id.dev_name)
        _live.add(self)

    def accept(self, timeout: float | None = None) -> VerbsConnection:
        pv = self.pv
        deadline = deadline_of(timeout, self._default_timeout)
        while True:
            if not _readable(self._fd, min(deadline - time.monotonic(), ACCEPT_SLICE)):
                if self._closed:
                    raise TransportClosed(f"listener on {self.address} closed")
                if time.monotonic() >= deadline:
                    raise TransportTimeout("no RDMA connection within the timeout")
                continue
            with self._event_lock:   # close() takes it too: the channel is never read while destroyed
                if self._closed:
                    raise TransportClosed(f"listener on {self.address} closed")
                ev = _try_cm_event(pv, self._channel, self._fd, time.monotonic() + 1)
                if ev is None:
                    continue
                kind = ev.event_type
                if kind != pv.ce.RDMA_CM_EVENT_CONNECT_REQUEST:
                    ev.ack_cm_event()   # ESTABLISHED / DISCONNECTED of children: handled in-band
                    continue
                child = pv.cmid.CMID(creator=ev, listen_id=self._id)
                ev.ack_cm_event()
            conn = None
            try:
                conn = VerbsConnection(pv, self.device, child, make_buffers(self._buffers), self._default_timeout,
                                       peer=("rdma_cm", "peer"), owner=self)
                conn.bring_up()
                param = pv.cmid.ConnParam(resources=4, depth=4, retry=RETRY, rnr_retry=7)
                param.qpn = conn.qp.qp_num
                child.accept(param)
            except (pv.Error, TransportError) as e:
                if conn is not None:
                    conn.close()
                else:
                    _quiet_close(child)
                raise TransportError(f"accepting an RDMA connection failed: {e}") from None
            with self._event_lock:
                self._children.add(conn)
            return conn

    def _forget(self, conn: VerbsConnection) -> None:
        with self._event_lock:
            self._children.discard(conn)
            _quiet_close(conn.cm_id)
            if self._closed and not self._children:
                self._close_channel()

    def _close_channel(self) -> None:
        """Only once no child id is left: destroying a child writes to the channel's descriptor, which
        after the channel is gone may be some other file's."""
        with _fd_lock:
            _quiet_close(self._channel)
        self._channel = None

    def close(self) -> None:
        with self._event_lock:
            if self._closed:
                return
            self._closed = True
            _quiet_close(self._id)
            if not self._children:
                self._close_channel()


class VerbsTransport:
    name = "verbs"

    def __init__(self, default_timeout: float = DEFAULT_TIMEOUT):
        self.pv = load_pyverbs()
        self.default_timeout = default_timeout

    def listen(self, host: str, port: int, buffers: str = "pooled") -> VerbsListener:
        make_buffers(buffers)
        return VerbsListener(self.pv, host, port, buffers, self.default_timeout)

    def connect(self, address: tuple[str, int], timeout: float | None = None,
                buffers: str = "pooled") -> VerbsConnection:
        pv, ce = self.pv, self.pv.ce
        host, port = rdma_host(str(address[0])), int(address[1])
        deadline = deadline_of(timeout, self.default_timeout)
        channel, fd = _with_new_fd(pv.cmid.CMEventChannel, "rdma_cm")
        cm_id = conn = None
        where = f"{host}:{port}"
        try:
            cm_id = pv.cmid.CMID(creator=channel)
            try:
                ai = pv.cmid.AddrInfo(dst=host, dst_service=str(port), port_space=ce.RDMA_PS_TCP)
                cm_id.resolve_addr(ai, CONNECT_TIMEOUT_MS)
            except pv.Error as e:
                raise VerbsUnavailable(f"cannot resolve {where} to an RDMA device: {e}") from None
            self._expect(channel, fd, deadline, ce.RDMA_CM_EVENT_ADDR_RESOLVED, where, "address resolution")
            cm_id.resolve_route(CONNECT_TIMEOUT_MS)
            self._expect(channel, fd, deadline, ce.RDMA_CM_EVENT_ROUTE_RESOLVED, where, "route resolution")
            device = _device(pv, cm_id.dev_name)
            conn = VerbsConnection(pv, device, cm_id, make_buffers(buffers), self.default_timeout,
                                   peer=(host, port), channel=channel, channel_fd=fd)
            param = pv.cmid.ConnParam(resources=4, depth=4, retry=RETRY, rnr_retry=7)
            param.qpn = conn.qp.qp_num
            cm_id.connect(param)
            self._expect(channel, fd, deadline, ce.RDMA_CM_EVENT_CONNECT_RESPONSE, where, "connecting")
            conn.bring_up()
            cm_id.establish()
            with conn._lock:   # credit words go in-band: rdma-core 44's pyverbs drops CM private data
                conn._post_eager(HELLO, [conn.hello()])
            return conn
        except BaseException as e:
            if conn is not None:
                conn.close()
            else:
                _quiet_close(cm_id)
                _quiet_close(channel)
            if isinstance(e, pv.Error):
                raise TransportClosed(f"RDMA connection to {where} failed: {e}") from None
            raise

    def _expect(self, channel, fd: int, deadline: float, want: int, where: str, step: str, keep: bool = False):
        pv = self.pv
        try:
            kind, ev = _cm_event(pv, channel, fd, deadline)
        except TransportTimeout:
            raise TransportTimeout(f"{step} for {where} timed out") from None
        if kind == want:
            if keep:
                return ev
            ev.ack_cm_event()
            return None
        ev.ack_cm_event()
        name = _event_name(pv, kind)
        if kind in (pv.ce.RDMA_CM_EVENT_REJECTED,):
            raise TransportClosed(f"RDMA connection to {where} refused (nobody listening there?)")
        if kind in (pv.ce.RDMA_CM_EVENT_ADDR_ERROR, pv.ce.RDMA_CM_EVENT_ROUTE_ERROR):
            raise VerbsUnavailable(f"{where} is not reachable over RDMA ({name} during {step})")
        raise TransportClosed(f"RDMA connection to {where} failed: {name} during {step}")
