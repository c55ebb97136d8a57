"""The verbs listener and transport: rdma_cm listen/accept and connect (address and route resolution,
the HELLO exchange), each connection built on ``connection.VerbsConnection``."""

from __future__ import annotations

import random
import threading
import time

from ..base import DEFAULT_TIMEOUT, TransportClosed, TransportError, TransportTimeout, deadline_of
from ...buffers import make_buffers
from .connection import VerbsConnection
from .events import cm_event, event_name, fd_lock, readable, try_cm_event, with_new_fd
from .loader import VerbsUnavailable, load_pyverbs, rdma_host
from .memory import live, quiet_close, shared_device
from .wire import ACCEPT_SLICE, CONNECT_TIMEOUT_MS, HELLO, RETRY


# -- listener and transport ------------------------------------------------------------------------------

class VerbsListener:
    def __init__(self, pv, host: str, port: int, buffers: str, default_timeout: float):
        self.pv, self._buffers, self._default_timeout = pv, buffers, default_timeout
        ce = pv.ce
        self.host = rdma_host(host)
        self._channel, self._fd = with_new_fd(pv.cmid.CMEventChannel, "rdma_cm")
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
                quiet_close(self._id)
        else:
            quiet_close(self._channel)
            raise VerbsUnavailable(f"cannot listen for RDMA connections on {self.host}:{port or '(any)'}: "
                                   f"{last} (is there an RDMA device on that address?)")
        self.address = (self.host, candidate)
        self.device = shared_device(pv, self._id.dev_name)
        live.add(self)

    def accept(self, timeout: float | None = None) -> VerbsConnection:
        pv = self.pv
        deadline = deadline_of(timeout, self._default_timeout)
        while True:
            if not readable(self._fd, min(deadline - time.monotonic(), ACCEPT_SLICE)):
                if self._closed:
                    raise TransportClosed(f"listener on {self.address} closed")
                if time.monotonic() >= deadline:
                    raise TransportTimeout("no RDMA connection within the timeout")
                continue
            with self._event_lock:   # close() takes it too: the channel is never read while destroyed
                if self._closed:
                    raise TransportClosed(f"listener on {self.address} closed")
                ev = try_cm_event(pv, self._channel, self._fd, time.monotonic() + 1)
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
                    quiet_close(child)
                raise TransportError(f"accepting an RDMA connection failed: {e}") from None
            with self._event_lock:
                self._children.add(conn)
            return conn

    def _forget(self, conn: VerbsConnection) -> None:
        with self._event_lock:
            self._children.discard(conn)
            quiet_close(conn.cm_id)
            if self._closed and not self._children:
                self._close_channel()

    def _close_channel(self) -> None:
        """Only once no child id is left: destroying a child writes to the channel's descriptor, which
        after the channel is gone may be some other file's."""
        with fd_lock:
            quiet_close(self._channel)
        self._channel = None

    def close(self) -> None:
        with self._event_lock:
            if self._closed:
                return
            self._closed = True
            quiet_close(self._id)
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
        channel, fd = with_new_fd(pv.cmid.CMEventChannel, "rdma_cm")
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
            device = shared_device(pv, cm_id.dev_name)
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
                quiet_close(cm_id)
                quiet_close(channel)
            if isinstance(e, pv.Error):
                raise TransportClosed(f"RDMA connection to {where} failed: {e}") from None
            raise

    def _expect(self, channel, fd: int, deadline: float, want: int, where: str, step: str, keep: bool = False):
        pv = self.pv
        try:
            kind, ev = cm_event(pv, channel, fd, deadline)
        except TransportTimeout:
            raise TransportTimeout(f"{step} for {where} timed out") from None
        if kind == want:
            if keep:
                return ev
            ev.ack_cm_event()
            return None
        ev.ack_cm_event()
        name = event_name(pv, kind)
        if kind in (pv.ce.RDMA_CM_EVENT_REJECTED,):
            raise TransportClosed(f"RDMA connection to {where} refused (nobody listening there?)")
        if kind in (pv.ce.RDMA_CM_EVENT_ADDR_ERROR, pv.ce.RDMA_CM_EVENT_ROUTE_ERROR):
            raise VerbsUnavailable(f"{where} is not reachable over RDMA ({name} during {step})")
        raise TransportClosed(f"RDMA connection to {where} failed: {name} during {step}")
