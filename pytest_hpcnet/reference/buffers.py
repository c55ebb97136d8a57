"""Message buffers, two designs: ``pooled`` (RPCoIB style) and ``naive`` (default Hadoop RPC style).

Both count what they do so a test can prove the difference instead of assuming it:

- ``allocations``: message-sized buffers created (a pool refill counts, a pool hit does not);
- ``copies`` / ``bytes_copied``: copies of message bytes into intermediate memory that *our* code makes.
  The final transfer into the transport (the socket or the shared-memory ring) is the wire itself and
  is not counted, in either design; neither are copies protobuf makes while parsing;
- ``pool_hits`` / ``pool_misses``: buffers handed out from / not found in the pool.

``pooled`` keeps pre-registered buffers in power-of-two size classes. The class handed out is chosen
by message-size locality: the pool remembers the classes the last few messages needed and hands out
the largest of them when it fits, so a stream of similar-sized messages keeps reusing one class
instead of spreading over neighbours. On receive, a transport posts a buffer of the predicted class
*before* it knows the message size (``acquire_predicted``), so a message that fits arrives with one
read -- length prefix and body together -- straight into the buffer the application gets a view of;
only a misprediction (copy into a bigger buffer) or a pipelining peer (surplus carried to the next
message) costs a counted copy. Outgoing messages are sent as a gather list of memoryviews
(zero-copy framing). ``naive`` allocates a fresh buffer per received message, copies it out to
``bytes``, and joins the parts of every outgoing message into one new buffer, as Hadoop's default
RPC does with its per-call byte arrays.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

Bytes = bytes | bytearray | memoryview

MIN_CLASS = 6            # 64 B: smaller messages share one class
HISTORY = 8              # how many recent messages the locality predictor remembers
MAX_FREE_PER_CLASS = 16  # bound on idle buffers per class, so a burst of big messages is not kept


@dataclass
class BufferStats:
    allocations: int = 0
    copies: int = 0
    bytes_copied: int = 0
    pool_hits: int = 0
    pool_misses: int = 0
    messages: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class Received:
    """One received message: ``view`` is valid until ``release()`` (pooled buffers go back then)."""

    __slots__ = ("view", "_release")

    def __init__(self, view: memoryview, release: Callable[[], None] | None = None):
        self.view = view
        self._release = release

    def release(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release()

    def tobytes(self) -> bytes:
        return bytes(self.view)


def size_class(nbytes: int) -> int:
    """The power-of-two class (exponent) that holds ``nbytes``."""
    return max(MIN_CLASS, (max(nbytes, 1) - 1).bit_length())


class NaiveBuffers:
    """Allocate and copy per message."""

    name = "naive"

    def __init__(self):
        self.stats = BufferStats()
        self._lock = threading.Lock()

    def acquire(self, nbytes: int) -> tuple[memoryview, Callable[[], None] | None]:
        """A writable buffer of exactly ``nbytes`` for an incoming message, and how to give it back."""
        with self._lock:
            self.stats.allocations += 1
        return memoryview(bytearray(nbytes)), None

    def finish(self, view: memoryview, release) -> Received:
        """The message as the application sees it: copied out to ``bytes`` (allocation + copy)."""
        data = bytes(view)
        with self._lock:
            self.stats.allocations += 1
            self.stats.copies += 1
            self.stats.bytes_copied += len(data)
            self.stats.messages += 1
        return Received(memoryview(data))

    def gather(self, parts: Sequence[Bytes]) -> list[Bytes]:
        """What to hand to the transport for one outgoing message: one freshly joined buffer."""
        data = b"".join(parts)
        with self._lock:
            self.stats.allocations += 1
            self.stats.copies += 1
            self.stats.bytes_copied += len(data)
        return [data]


class PooledBuffers:
    """Pre-allocated power-of-two buffers reused by message-size locality; zero-copy framing."""

    name = "pooled"
    read_ahead = True   # transports may post a predicted-size buffer before the size is known

    PREALLOCATE = (64, 4096, 65536)

    def __init__(self, preallocate: Sequence[int] | None = PREALLOCATE):
        self.stats = BufferStats()
        self._lock = threading.Lock()
        self._free: dict[int, list[bytearray]] = collections.defaultdict(list)
        self._recent: collections.deque[int] = collections.deque(maxlen=HISTORY)
        self._predicted: int | None = None   # max(self._recent), kept current so the hot path needs no max()
        self._warm = False
        if preallocate is not None:
            self.warm(preallocate)

    def warm(self, preallocate: Sequence[int] = PREALLOCATE) -> None:
        """Register the pool's buffers (up front, not on the message path). A server's connection is
        warmed only once its peer has been admitted: a flood of strangers costs no buffers."""
        if self._warm:
            return
        self._warm = True
        for nbytes in preallocate:
            cls = size_class(nbytes)
            self._free[cls].append(bytearray(1 << cls))

    def predicted_class(self) -> int | None:
        """The class recent messages needed (the largest of the last few), or None before any."""
        return self._predicted

    def _remember(self, cls: int) -> None:
        """Feed the predictor (lock held)."""
        recent = self._recent
        dropped = recent[0] if len(recent) == HISTORY else None
        recent.append(cls)
        if self._predicted is None or cls > self._predicted:
            self._predicted = cls
        elif dropped == self._predicted and cls != dropped:
            self._predicted = max(recent)   # the largest just left the window

    def acquire(self, nbytes: int) -> tuple[memoryview, Callable[[], None]]:
        need = size_class(nbytes)
        with self._lock:
            self._remember(need)
            buf = None
            predicted = self._predicted
            for cls in (predicted, need):   # locality first, then the exact class
                if cls >= need and self._free[cls]:
                    buf = self._free[cls].pop()
                    break
            if buf is None:
                self.stats.pool_misses += 1
                self.stats.allocations += 1
                buf = bytearray(1 << predicted)
            else:
                self.stats.pool_hits += 1
        return memoryview(buf)[:nbytes], lambda: self._give_back(buf)

    def acquire_predicted(self, at_least: int = 0) -> tuple[memoryview, Callable[[], None]]:
        """A whole buffer of the class recent messages needed (at least ``at_least`` bytes), for a
        receive whose size is not known yet. Does not feed the predictor: ``record`` does, once the
        real size is known."""
        cls = self._predicted or MIN_CLASS
        if at_least > 1 << cls:
            cls = size_class(at_least)
        with self._lock:
            free = self._free[cls]
            if free:
                buf = free.pop()
                self.stats.pool_hits += 1
            else:
                buf = bytearray(1 << cls)
                self.stats.pool_misses += 1
                self.stats.allocations += 1
        return memoryview(buf), lambda: self._give_back(buf)

    def record(self, nbytes: int) -> None:
        """Feed the locality predictor with the size a message turned out to need."""
        with self._lock:
            self._remember(size_class(nbytes))

    def finish_recorded(self, view: memoryview, release, nbytes: int) -> Received:
        """``record(nbytes)`` and ``finish(view, release)`` in one step (one lock round trip)."""
        cls = size_class(nbytes)
        with self._lock:
            self._remember(cls)
            self.stats.messages += 1
        return Received(view, release)

    def count_copy(self, nbytes: int) -> None:
        with self._lock:
            self.stats.copies += 1
            self.stats.bytes_copied += nbytes

    def _give_back(self, buf: bytearray) -> None:
        cls = len(buf).bit_length() - 1   # pool buffers are exact powers of two
        with self._lock:
            free = self._free[cls]
            if len(free) < MAX_FREE_PER_CLASS:
                free.append(buf)

    def finish(self, view: memoryview, release) -> Received:
        with self._lock:
            self.stats.messages += 1
        return Received(view, release)

    def gather(self, parts: Sequence[Bytes]) -> list[Bytes]:
        return list(parts)


BUFFERS: dict[str, type] = {"pooled": PooledBuffers, "naive": NaiveBuffers}


def make_buffers(name: str, cold: bool = False):
    """A fresh buffer manager by name (``pooled`` or ``naive``); ``cold``: no buffers registered until
    ``warm()`` (an accepted connection whose peer is not admitted yet)."""
    from ..errors import ConfigError

    try:
        cls = BUFFERS[name]
        return cls(preallocate=None) if cold and cls is PooledBuffers else cls()
    except KeyError:
        raise ConfigError(f"unknown buffer design {name!r}; choose one of {sorted(BUFFERS)}",
                          where="buffers") from None
