"""Registered memory, once per process: per RDMA device one context and protection domain, and a pool
of registered regions (receive and send slots, rendezvous staging and landing) that connections take
and give back. Closed in order at exit, after every live connection and listener."""

from __future__ import annotations

import atexit
import collections
import ctypes
import threading
import weakref



# -- per-device resources and registered memory, shared by the process ---------------------------------

class Registered:
    """A registered region over memory we own (ctypes), with a zero-copy memoryview of it."""

    def __init__(self, pv, pd, length: int, access: int):
        self.raw = (ctypes.c_char * length)()
        self.addr = ctypes.addressof(self.raw)
        self.length, self.access = length, access
        self.mr = pv.mr.MR(pd, length, access, address=self.addr)
        self.lkey, self.rkey = self.mr.lkey, self.mr.rkey
        self.view = memoryview(self.raw).cast("B")


class Device:
    def __init__(self, pv, name: str):
        self.pv, self.name = pv, name
        self.ctx = pv.device.Context(name=name)
        self.pd = pv.pd.PD(self.ctx)
        self._free: dict[tuple[int, int], list[Registered]] = collections.defaultdict(list)
        self._lock = threading.Lock()

    def region(self, length: int, access: int, exact: bool = False) -> Registered:
        """A registered region of at least ``length`` bytes (a power of two unless ``exact``)."""
        size = length if exact else max(4096, 1 << (max(length, 1) - 1).bit_length())
        with self._lock:
            free = self._free[(size, access)]
            if free:
                return free.pop()
        return Registered(self.pv, self.pd, size, access)

    def give_back(self, region: Registered) -> None:
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
            quiet_close(region.mr)
        quiet_close(self.ctx)   # closes what still depends on it (PD, CQs, QPs, MRs) in order


_devices: dict[str, Device] = {}
_devices_lock = threading.Lock()


live: "weakref.WeakSet" = weakref.WeakSet()        # open connections and listeners (closed first at exit)


@atexit.register
def _close_devices() -> None:
    """Tear the verbs objects down before the interpreter does: its arbitrary order crashes pyverbs.
    Connections and listeners first, each under its own lock, so a daemon thread still waiting on one
    sees it closed instead of polling a destroyed CQ."""
    for obj in list(live):
        try:
            obj.close()
        except Exception:
            pass
    with _devices_lock:
        devices = list(_devices.values())
        _devices.clear()
    for device in devices:
        device.close()


def shared_device(pv, name: str) -> Device:
    with _devices_lock:
        if name not in _devices:
            _devices[name] = Device(pv, name)
        return _devices[name]


def quiet_close(obj) -> bool:
    """Close a pyverbs object; False if that failed (teardown must not raise over the real error)."""
    if obj is None:
        return True
    try:
        obj.close()
        return True
    except Exception:
        return False
