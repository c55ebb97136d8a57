"""Map output on disk, the shuffle server every worker runs, and the reducers' fetch client.

Map output layout (Hadoop's ``file.out`` + ``file.out.index``): one data file per map attempt holding
the segments of every reduce back to back, and an index of R+1 byte offsets (int64, little-endian),
so segment r is ``data[index[r]:index[r+1]]``. Both are written under a temporary name and renamed,
so a reader never sees half a file and a re-run attempt never collides with a dead one.

The shuffle server (the ShuffleHandler role) listens on a transport (``tcp``, ``shm``) and answers
requests ``{"root": "local"|"shared", "path": <map output path relative to the root>, "reduce": r}``
with one message: a status byte (0 = ok) and the segment bytes, or status 1 and an error text. On a
transport with one-sided access (shm, verbs) a request may add ``"one_sided": true``: the server
then reads the segment into a registered region and replies status 2 with the region's descriptor and
the segment's size, and the reducer ``get``s the bytes itself -- the RDMA-READ shape of the shuffle,
one copy on each side instead of streaming through the message ring. Each connection has one region,
reused (and grown) for its next replies, since setting up and mapping fresh shared memory per segment
costs more than the copy; the reducer asks again only after reading, and the region goes with the
connection.

Over ``verbs`` a worker with ``impl=native`` serves and fetches through the native core's verbs end
(``transport/verbs/native.py``) where it can run, else through pyverbs: the same protocol, so either
kind of reducer fetches from either kind of server. The native reducer READs each segment straight
into its landing buffer (``get_into``); the pyverbs one READs into a bounce buffer and copies. It only
reads map output under its own roots (no ``..``, no absolute paths), and a bad request gets an error
reply while the server keeps serving everyone else.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import asdict
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

import numpy as np

from ....errors import HpcnetError
from ... import auth
from ...serving import DEFAULT_LIMITS, Limits, Server
from ... import native
from ...transport import RemoteRegion, TransportClosed, TransportError, TransportTimeout, transport_for

OK, ERROR, REGION = b"\x00", b"\x01", b"\x02"
ONE_SIDED_TRANSPORTS = ("shm", "verbs")
MIN_REGION = 1 << 20
MAX_REQUEST = 64 * 1024
MAX_INDEX_BYTES = 8 * (1 << 20)      # a million reduces
MAX_SEGMENT = 1 << 30                # the largest segment a reducer accepts from a server
DATA_SUFFIX, INDEX_SUFFIX = ".out", ".index"


class FetchError(HpcnetError):
    """A reducer could not get a segment; ``node`` names the node whose server failed (or None)."""

    def __init__(self, message: str, node: str | None = None):
        self.node = node
        super().__init__(message)


# -- map output files --------------------------------------------------------------------------------

def write_map_output(base: Path, segments: list) -> list[int]:
    """Write segments (bytes-like or uint8 arrays) as ``base.out`` + ``base.index``; return their sizes."""
    segments = [np.ascontiguousarray(s).reshape(-1) if isinstance(s, np.ndarray) else s for s in segments]

    def write(f):
        for s in segments:
            f.write(s)
        return [s.nbytes if isinstance(s, np.ndarray) else len(s) for s in segments]
    return write_map_output_with(base, write)


def write_map_output_with(base: Path, write) -> list[int]:
    """``write(f)`` puts the segments back to back into the open data file ``f`` and returns their
    sizes; this writes the index and renames both into place (the native map spills this way)."""
    base.parent.mkdir(parents=True, exist_ok=True)
    data, index = base.with_name(base.name + DATA_SUFFIX), base.with_name(base.name + INDEX_SUFFIX)
    tmp_data, tmp_index = data.with_name("." + data.name + ".tmp"), index.with_name("." + index.name + ".tmp")
    with open(tmp_data, "wb") as f:
        sizes = [int(n) for n in write(f)]
    offsets = np.zeros(len(sizes) + 1, dtype="<i8")
    np.cumsum(sizes, out=offsets[1:])
    tmp_index.write_bytes(offsets.tobytes())
    os.rename(tmp_data, data)
    os.rename(tmp_index, index)
    return sizes


def segment_range(base: Path, reduce: int) -> tuple[Path, int, int]:
    """(data file, offset, length) of segment ``reduce`` of the map output at ``base``."""
    with _open_nofollow(base.with_name(base.name + INDEX_SUFFIX)) as f:
        raw = f.read(MAX_INDEX_BYTES + 1)
    if len(raw) > MAX_INDEX_BYTES or len(raw) % 8:
        raise FetchError(f"{base}: index file is not a map output index")
    index = np.frombuffer(raw, dtype="<i8")
    if not 0 <= reduce < len(index) - 1:
        raise FetchError(f"{base}: no segment {reduce} (map output has {len(index) - 1} segments)")
    start, end = int(index[reduce]), int(index[reduce + 1])
    return base.with_name(base.name + DATA_SUFFIX), start, end - start


def read_segment(base: Path, reduce: int, into: memoryview | None = None) -> bytes | None:
    """Segment ``reduce`` of the map output at ``base`` (the direct-read path and the server's); with
    ``into`` (a buffer of the segment's length) read into it and return None."""
    path, start, length = segment_range(base, reduce)
    if start < 0 or length < 0:
        raise FetchError(f"{base}: index of segment {reduce} is corrupt")
    with _open_nofollow(path) as f:
        f.seek(start)
        if into is None:
            data = f.read(length)
            got = len(data)
        else:
            data, got = None, f.readinto(into)
    if got != length:
        raise FetchError(f"{base}: segment {reduce} is truncated ({got} of {length} bytes)")
    return data


def resolve(roots: dict[str, Path], root: str, path: str) -> Path:
    """The map output ``path`` under root ``root``; refuse anything that would escape the root."""
    if root not in roots:
        raise FetchError(f"unknown root {root!r} (this server has {sorted(roots)})")
    if not isinstance(path, str):
        raise FetchError("path must be a string")
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise FetchError(f"refusing path {path!r}: must be relative and stay inside the root")
    return roots[root] / rel


def resolve_served(roots: dict[str, Path], root: str, path: str) -> Path:
    """``resolve`` for the shuffle server: the real path (symlinks followed) of the map output's
    directory must still lie inside the root's real path, and the files are then opened with
    ``O_NOFOLLOW``, so a symlink planted under the root cannot lead out of it."""
    base = resolve(roots, root, path)
    real_root = os.path.realpath(roots[root])
    real_dir = os.path.realpath(base.parent)
    if os.path.commonpath([real_root, real_dir]) != real_root:
        raise FetchError(f"refusing path {path!r}: it leads outside the {root} root")
    return Path(real_dir) / base.name


def _open_nofollow(path: Path):
    try:
        return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FetchError(f"refusing {path.name}: it is a symlink") from None
        raise


# -- the server ----------------------------------------------------------------------------------------

class ShuffleServer:
    """Serves map output segments over one transport to authenticated reducers (``serving.Server``)."""

    def __init__(self, transport: str, host: str, roots: dict[str, Path], limits: Limits = DEFAULT_LIMITS,
                 impl: str | None = None):
        self.transport = transport
        # native: tcp replies of whole segments go by sendfile (zero-copy); python: read, then send
        impl = native.resolve_impl(impl, "shuffle server impl")
        self.sendfile = impl == "native" and transport == "tcp"
        self.roots = {k: Path(v) for k, v in roots.items()}
        transport_impl = transport_for(transport, impl)
        self.native_verbs = getattr(transport_impl, "native", False)   # the worker reports which end serves
        self._listener = transport_impl.listen(host, 0)
        self.address = tuple(self._listener.address)
        self._stop = threading.Event()
        self._regions: set = set()     # live one-sided regions, closed with the server
        self.limits = limits
        self._server = Server(self._listener, self._serve, f"shuffle-{transport}", limits).start()

    def _serve(self, conn) -> None:
        region = None      # one-sided replies go through one region per connection, grown as needed and
        idle_until = time.monotonic() + self.limits.idle_timeout
        try:               # reused: the reducer asks again only after it has read the last reply
            while not self._stop.is_set():
                try:
                    msg = conn.recv(timeout=1.0, max_length=MAX_REQUEST)
                except TransportTimeout:
                    if time.monotonic() > idle_until:
                        return            # an idle reducer connection: it reconnects when it needs us
                    continue
                idle_until = time.monotonic() + self.limits.idle_timeout
                try:
                    request = json.loads(bytes(msg.view))
                    msg.release()
                    base = resolve_served(self.roots, request["root"], request["path"])
                    reduce = int(request["reduce"])
                    _, _, length = segment_range(base, reduce)
                    if request.get("one_sided") and self.transport in ONE_SIDED_TRANSPORTS and length:
                        if region is None or region.length < length:
                            # grow geometrically: the reducer keeps each old mapping until it hangs up
                            size = max(length, MIN_REGION, 2 * region.length if region is not None else 0)
                            if region is not None:
                                region.close()
                                self._regions.discard(region)
                            region = conn.register(size)
                            self._regions.add(region)
                        read_segment(base, reduce, into=region.view[:length])
                        reply = [REGION, json.dumps({"region": asdict(region.remote()), "size": length}).encode()]
                    elif self.sendfile:
                        reply = self._sendfile(conn, base, reduce)
                    else:
                        reply = [OK, read_segment(base, reduce)]
                except (ValueError, KeyError, TypeError, AttributeError, OSError, FetchError) as e:
                    reply = [ERROR, f"bad shuffle request: {e}".encode()]
                if reply is not None:
                    conn.send(reply, timeout=60)
        except TransportError:
            return                    # the reducer went away (or sent an oversized frame)
        finally:
            if region is not None:
                region.close()
                self._regions.discard(region)
            conn.close()

    @staticmethod
    def _sendfile(conn, base: Path, reduce: int) -> None:
        """Send segment ``reduce`` as an OK reply straight from the page cache (``sendfile``, native
        core): the frame's length and status, then the file range. Checked before the first byte goes
        out (a bad request gets an ERROR reply as on the Python path); a failure after it closes the
        connection, since the reply can no longer be completed in step."""
        path, start, length = segment_range(base, reduce)
        if start < 0 or length < 0:
            raise FetchError(f"{base}: index of segment {reduce} is corrupt")
        with _open_nofollow(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size < start + length:
                raise FetchError(f"{base}: segment {reduce} is truncated ({max(0, size - start)} of {length} bytes)")
            conn.send_file(OK, f.fileno(), start, length, f"segment {reduce}", 60.0)
        return None

    def close(self) -> None:
        """Stop accepting and release every region (the serving threads are daemons: at process exit
        nothing else would unlink the shared memory)."""
        self._stop.set()
        self._server.stop()
        for region in list(self._regions):
            region.close()
        self._regions.clear()


# -- the client ----------------------------------------------------------------------------------------

_idle: dict[tuple, list] = {}      # (transport, impl, address) -> [(connection, when it went idle)]
_idle_lock = threading.Lock()
IDLE_SECONDS = 2.0


def _checkout(transport: str, address, timeout: float, impl: str = "python"):
    """A connection to a shuffle server: an idle one kept from an earlier fetch, or a new one. Reusing
    connections across reduce tasks saves the connect (and shm's ring set-up) and lets the server reuse
    its one-sided region."""
    key = (transport, impl, tuple(address))
    with _idle_lock:
        if _idle.get(key):
            return _idle[key].pop()[0]
    return auth.connect(transport_for(transport, impl), address, timeout=timeout)


def _checkin(transport: str, address, conn, impl: str = "python") -> None:
    with _idle_lock:
        _idle.setdefault((transport, impl, tuple(address)), []).append((conn, time.monotonic()))


def close_idle(older_than: float = IDLE_SECONDS) -> int:
    """Close kept connections unused for ``older_than`` seconds (an idle shm connection still costs its
    server a wake-up every few ms); the worker calls this from its heartbeat loop. Returns how many."""
    now, stale = time.monotonic(), []
    with _idle_lock:
        for key, conns in _idle.items():
            stale += [c for c, t in conns if now - t >= older_than]
            conns[:] = [(c, t) for c, t in conns if now - t < older_than]
    for conn in stale:
        conn.close()
    return len(stale)


def fetch_from(transport: str, address, node: str, requests: list[dict], timeout: float = 60,
               into: list[memoryview] | None = None, impl: str = "python") -> list[bytes] | None:
    """Fetch several segments from one node's server over one connection, in order. With ``into`` (a
    writable view per request, each the length the map reported) each segment lands in its view and
    None is returned; a reply of another length is a FetchError, since the segment is then truncated
    or corrupt. Over tcp with ``impl="native"`` and ``into``, the compiled core does each exchange
    (request out, segment straight into its view, GIL released); over verbs with ``impl="native"`` the
    native end RDMA-READs each segment into its view."""
    try:
        conn = _checkout(transport, address, timeout, impl)
    except TransportError as e:
        raise FetchError(f"cannot reach the shuffle server of {node} at {address}: {e}", node) from None
    out = []
    one_sided = transport in ONE_SIDED_TRANSPORTS
    try:
        for k, request in enumerate(requests):
            target = into[k] if into is not None else None
            if target is not None and impl == "native" and transport == "tcp" and conn.in_step():
                _fetch_native(conn, node, request, target, timeout)
                continue
            conn.send([json.dumps(dict(request, one_sided=one_sided)).encode()], timeout=timeout)
            msg = conn.recv(timeout=timeout, max_length=MAX_SEGMENT + 1)
            try:
                status, body = bytes(msg.view[:1]), msg.view[1:]
                if status == REGION:
                    reply = json.loads(bytes(body))
                    if not 0 <= int(reply["size"]) <= min(MAX_SEGMENT, int(reply["region"]["length"])):
                        raise FetchError(f"shuffle server of {node} offered a {reply['size']}-byte segment")
                    _check_size(target, int(reply["size"]), node, request)
                    region = RemoteRegion(**reply["region"])
                    if target is None:
                        out.append(conn.get(region, 0, reply["size"], timeout=timeout))
                    elif hasattr(conn, "get_into"):
                        conn.get_into(region, 0, target, timeout=timeout)
                    else:
                        target[:] = conn.get(region, 0, reply["size"], timeout=timeout)
                elif status == OK:
                    _check_size(target, len(body), node, request)
                    if target is None:
                        out.append(bytes(body))
                    else:
                        target[:] = body
                else:
                    raise FetchError(f"shuffle server of {node}: {bytes(body).decode(errors='replace')}")
            finally:
                msg.release()
    except TransportError as e:
        conn.close()
        raise FetchError(f"fetching from {node} failed: {e}", node) from None
    except FetchError:
        if not conn.closed:                     # the server answered (or we refused its answer): in step
            _checkin(transport, address, conn, impl)
        raise
    except BaseException:
        conn.close()
        raise
    _checkin(transport, address, conn, impl)
    return None if into is not None else out


def _fetch_native(conn, node: str, request: dict, target: memoryview, timeout: float) -> None:
    """One exchange by the native core; a reply it could not take whole leaves the connection out of
    step, so that closes it (TransportClosed, which the caller turns into a FetchError)."""
    body = json.dumps(dict(request, one_sided=False)).encode()
    try:
        status, length, text = native.core.fetch_segment_into(conn.sock.fileno(), body, target, timeout)
    except OSError as e:           # TimeoutError included
        raise TransportClosed(f"{e}") from None
    if status == OK[0] and length == len(target):
        return
    if status == OK[0] or text is None:
        conn.close()
        _check_size(target, length, node, request)
        raise FetchError(f"shuffle server of {node} sent a {length}-byte reply with status {status}")
    raise FetchError(f"shuffle server of {node}: {bytes(text).decode(errors='replace')}")


def _check_size(target: memoryview | None, size: int, node: str, request: dict) -> None:
    """A reply must be the segment the map wrote: a shorter or longer one is truncated or corrupt. (Not
    the node's fault in the driver's eyes: FetchError without ``node``, so the reduce is retried.)"""
    if target is not None and size != len(target):
        raise FetchError(f"segment {request['reduce']} of {request['path']} from {node} is {size} bytes, "
                         f"but the map wrote {len(target)}: truncated or corrupt")


class KeptBuffer:
    """One reduce's landing buffer, kept by its worker for the next reduce (one at a time per worker).

    Why keep it: on this project's VMs the guest hands freed memory back to its host (virtio-balloon
    free page reporting), and the first touch of such memory costs about 5 s per GB (250 MB: 1.2 s
    fresh, 0.07 s recycled within the process), more than the merge itself. Up to ``MAX_KEPT`` bytes
    are kept; a larger reduce gets a buffer of its own."""

    MAX_KEPT = 1 << 30

    def __init__(self):
        self._array = None

    def take(self, nbytes: int) -> memoryview:
        if self._array is not None and self._array.size >= nbytes:
            return memoryview(self._array).cast("B")[:nbytes]
        array = np.empty(nbytes, dtype=np.uint8)
        if nbytes <= self.MAX_KEPT:
            self._array = array
        return memoryview(array).cast("B")


def fetch_segments(sources: list[dict], reduce: int, transport: str, roots: dict[str, Path],
                   direct: bool, parallel: int = 4, impl: str = "python",
                   buffer: KeptBuffer | None = None) -> tuple[list, float]:
    """All segments of reduce ``reduce``, in map order, and the seconds it took.

    ``sources``: per map, ``{"node", "root", "path", "server"}`` and, from the driver, ``"sizes"`` (the
    map's segment lengths). With ``direct`` the segments are read from this node's own view of the root
    (the shared dir); otherwise they are fetched from each source's ``server`` address, one connection
    per serving node, up to ``parallel`` at once (Hadoop's parallel copies).

    Where every source has ``sizes``, the segments land in one buffer allocated once at their total
    size (fresh memory is what a reduce pays most for here: faulting and zeroing pages), and are
    returned as views of it (of ``buffer``'s memory where given: the views are valid until its next
    use); a segment of another length than the map wrote is a FetchError."""
    t0 = time.perf_counter()
    views = _preallocated(sources, reduce, buffer)
    if direct:
        data = []
        for i, s in enumerate(sources):
            base = resolve(roots, s["root"], s["path"])
            if views is None:
                data.append(read_segment(base, reduce))
                continue
            _, _, length = segment_range(base, reduce)
            _check_size(views[i], length, s["node"], {"reduce": reduce, "path": s["path"]})
            read_segment(base, reduce, into=views[i])
            data.append(views[i])
        return data, time.perf_counter() - t0
    by_server: dict[tuple, list[int]] = {}
    for i, s in enumerate(sources):
        by_server.setdefault((s["node"], tuple(s["server"])), []).append(i)
    data: list = [None] * len(sources) if views is None else list(views)

    def pull(key):
        node, address = key
        wanted = by_server[key]
        reqs = [{"root": sources[i]["root"], "path": sources[i]["path"], "reduce": reduce} for i in wanted]
        if views is not None:
            fetch_from(transport, address, node, reqs, into=[views[i] for i in wanted], impl=impl)
            return
        for i, seg in zip(wanted, fetch_from(transport, address, node, reqs, impl=impl)):
            data[i] = seg

    if by_server:
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(by_server)))) as pool:
            for f in [pool.submit(pull, key) for key in by_server]:
                f.result()
    return data, time.perf_counter() - t0


def _preallocated(sources: list[dict], reduce: int, buffer: KeptBuffer | None = None) -> list[memoryview] | None:
    """One view per source into a single buffer of the segments' total size, or None where a source
    does not say its sizes."""
    if not all(isinstance(s.get("sizes"), list) and 0 <= reduce < len(s["sizes"]) for s in sources):
        return None
    sizes = [int(s["sizes"][reduce]) for s in sources]
    if any(n < 0 or n > MAX_SEGMENT for n in sizes):
        raise FetchError(f"the driver's segment sizes for reduce {reduce} are out of range: {sizes}")
    whole = (buffer or KeptBuffer()).take(sum(sizes))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return [whole[offsets[i]:offsets[i + 1]] for i in range(len(sizes))]
