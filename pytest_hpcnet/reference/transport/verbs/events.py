"""Waiting without blocking inside pyverbs: the descriptors pyverbs hides (found in /proc/self/fd and
made non-blocking), poll() on them from Python, rdma_cm events, and bringing a QP up with rdma_cm's
attributes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import threading
import time
from typing import Sequence

from ..base import TransportError, TransportTimeout
from .wire import QP_TIMEOUT, RETRY


# -- file descriptors pyverbs does not expose ----------------------------------------------------------

fd_lock = threading.Lock()


def fds_of(kind: str) -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if kind in os.readlink(f"/proc/self/fd/{name}"):
                out.add(int(name))
        except OSError:
            continue
    return out


def with_new_fd(create, kind: str, attempts: int = 3):
    """Call ``create()`` and return (its result, the one new descriptor of ``kind``, made non-blocking).

    The descriptor is the one that appeared across the call. Code that does not take ``fd_lock`` can
    close a descriptor of the same kind meanwhile, and the new one then reuses its number (none appears),
    or open one (two appear): librdmacm closing a device's context with its last id, the native core in
    this process, a pyverbs object the garbage collector frees. Seen once in the guest: a server's accept
    failed with none found. The object is then closed and made again."""
    for _ in range(attempts):
        with fd_lock:
            before = fds_of(kind)
            obj = create()
            new = fds_of(kind) - before
            if len(new) == 1:
                break
            with contextlib.suppress(Exception):
                obj.close()
    else:
        raise TransportError(f"cannot find the descriptor of a new {kind} (found {sorted(new)}, "
                             f"{attempts} tries)")
    fd = new.pop()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    return obj, fd


def readable(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))


def readable_fds(fds: Sequence[int], timeout: float) -> set[int]:
    """Which of ``fds`` are readable, waiting up to ``timeout`` s for one to be."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(max(0.0, timeout) * 1000)}


def poke(fd: int | None) -> None:
    """Make an eventfd readable (wakes whoever polls it)."""
    if fd is not None:
        with contextlib.suppress(OSError):
            os.eventfd_write(fd, 1)


def drain(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):   # EAGAIN: nobody poked
            os.eventfd_read(fd)


def cm_event(pv, channel, fd: int, deadline: float):
    """Read one rdma_cm event without blocking in C: (type, the event). The caller acks it."""
    while True:
        ev = try_cm_event(pv, channel, fd, deadline)
        if ev is not None:
            return ev.event_type, ev


def try_cm_event(pv, channel, fd: int, deadline: float):
    """Wait (in Python) until the channel is readable, then read an event; None if another reader
    took it. Raises TransportTimeout at the deadline."""
    if not readable(fd, deadline - time.monotonic()):
        if time.monotonic() >= deadline:
            raise TransportTimeout("no rdma_cm event within the timeout")
        return None
    try:
        return pv.cmid.CMEvent(channel)
    except pv.Error as e:
        if getattr(e, "error_code", None) in (errno.EAGAIN, errno.EWOULDBLOCK) or "temporarily" in str(e):
            return None
        raise TransportError(f"reading an rdma_cm event failed: {e}") from None


def event_name(pv, kind: int) -> str:
    for name in dir(pv.ce):
        if name.startswith("RDMA_CM_EVENT_") and getattr(pv.ce, name) == kind:
            return name[len("RDMA_CM_EVENT_"):]
    return str(kind)


def connect_qp(pv, cm_id, qp) -> None:
    """Move our external QP through INIT -> RTR -> RTS with the attributes rdma_cm computed."""
    for state in (pv.e.IBV_QPS_INIT, pv.e.IBV_QPS_RTR, pv.e.IBV_QPS_RTS):
        attr, mask = cm_id.init_qp_attr(state)
        if state == pv.e.IBV_QPS_RTS:
            attr.timeout, attr.retry_cnt, attr.rnr_retry = QP_TIMEOUT, RETRY, 7
            mask |= pv.e.IBV_QP_TIMEOUT | pv.e.IBV_QP_RETRY_CNT | pv.e.IBV_QP_RNR_RETRY
        qp.modify(attr, mask)
        if state == pv.e.IBV_QPS_INIT:
            yield   # receives may be posted from INIT on; the caller posts them here
