"""The datanode's packet pipeline in the native core (``impl=native``; issue 17).

``stream`` hands one block's packet stream to ``core.BlockStream``: the upstream and downstream
connections and the replica's files, already set up by the Python datanode. The native side receives
each packet, forwards the frame as it came, verifies every chunk (CRC-32C with SSE4.2, or CRC-32),
writes data and checksums, and acknowledges upstream, all without the GIL: a middle node relays the
next node's acknowledgements on a thread of its own, the tail acknowledges from its receiving thread.
What happens once per block stays in Python: checks, connecting, opening and finishing the replica.
The client's end is ``core.PacketWriter`` (``pipeline.py``). Over tcp a read's reply goes out of the
core too (``serve_read``), and the client's ``core.BlockReader`` receives it (``sequential.py``).

It speaks tcp, and verbs through the native core's verbs end (``transport_for`` gives ``impl=native``
components that end): the same framed bytes go over either, so every mix of native and Python nodes,
and of native and pyverbs ends, is one pipeline.
"""

from __future__ import annotations

from ...errors import ConfigError
from .. import native as core_module
from ..transport.base import TransportClosed
from .blockfiles import META_BASE
from .errors import ChecksumError, DfsError

IMPLS = core_module.IMPLS


def _why_not_native(transport: str) -> str | None:
    """Why the native pipeline cannot run over ``transport`` here, or None."""
    if transport == "tcp":
        return None
    if transport == "verbs":
        from ..transport.verbs import native as native_verbs
        why = native_verbs.unavailable()
        return None if why is None else f"the native verbs end cannot run here: {why}"
    return f"the native packet pipeline speaks tcp and verbs, not {transport}"


def resolve_impl(impl: str | None, transport: str, where: str = "datanode impl") -> str:
    """``auto``/None: native where the core is installed and speaks ``transport`` here, else python."""
    if impl in (None, "", "auto"):
        return "native" if core_module.AVAILABLE and _why_not_native(transport) is None else "python"
    impl = core_module.resolve_impl(impl, where)
    why = _why_not_native(transport) if impl == "native" else None
    if why:
        raise ConfigError(f"{why}; use impl=python for {transport}", where)
    return impl


def endpoint(conn):
    """What the native core takes for one of the pipeline's connections: a tcp socket's descriptor, or
    the native verbs end's own connection object."""
    core_conn = getattr(conn, "_core", None)
    if core_conn is not None:
        return core_conn
    return conn.sock.fileno()


def stream(up, down, writer, index: int, label: str, packet_timeout: float, log) -> None:
    """Run the packet stream of one block (after the setup ack went up) to its end: the replica is
    made final before the last ack leaves, dropped on a checksum error, and otherwise left under
    construction for a pipeline recovery (the caller's ``writer.close()``)."""
    block_stream = core_module.core.BlockStream(
        endpoint(up), endpoint(down) if down is not None else None, writer.data.fileno(),
        writer.meta.fileno(), writer.bpc, writer.checksum, index, writer.length, label, packet_timeout,
        bytes(getattr(up, "_carry", b"")), writer.sync_behind)
    last, abort = None, True
    try:
        end, length, seq, message = block_stream.receive()
        writer.length = length
        abort = end == "upstream"
        if end == "last":
            writer.finish()        # final (renamed; synced if so set) before the last ack leaves
            last = seq
        elif end == "checksum":
            writer.abandon()
        elif end != "upstream" or "closed the connection" not in message:
            log(f"pipeline dropped: {message}")
    finally:
        block_stream.finish(last, packet_timeout, abort)


def serves_reads(conn) -> bool:
    """Whether a native datanode sends a read's reply on ``conn`` from the core: over tcp. Over the
    native verbs end the core's one message per packet measured 0.6x the Python loop's in the
    Soft-RoCE guest, so there the Python loop sends it."""
    return getattr(conn, "transport", None) == "tcp"


def serve_read(conn, replica, offset: int, length: int, packet: int, bpc: int, kind: str, label: str,
               timeout: float) -> None:
    """Send the data frames of a ``read_block`` reply (``length`` bytes at ``offset`` of ``replica``, a
    ``BlockDir.open_range``) on the tcp connection ``conn`` from the native core, the data from the
    page cache, at most ``packet`` bytes each. DfsError when the replica failed between frames (the
    connection is in step: the caller says so in an ``error`` frame); a connection that failed, maybe
    mid-frame, is closed and raises TransportClosed."""
    data, meta, size = replica
    try:
        reason = core_module.core.serve_block_read(conn.sock.fileno(), data.fileno(), meta.fileno(), META_BASE,
                                                   size, offset, length, packet, bpc, kind, label, timeout)
    except OSError as e:        # TimeoutError included
        conn.close()
        raise TransportClosed(f"sending to {conn.peer} failed: {e}") from None
    if reason:
        raise DfsError(reason)


def read_into(conn, into, offset: int, label: str, timeout: float):
    """Receive the reply to the ``read_block`` just sent on the tcp connection ``conn`` into ``into``
    (the block's bytes from ``offset``) in the native core, every chunk verified. None when it all
    came; else ``(kind, reason)``: ``refused`` (the datanode's own error; the connection is still in
    step), ``checksum`` or ``broken`` (it is not: close it)."""
    return core_module.core.read_block_into(endpoint(conn), into, offset, label, timeout)


def read_failure(kind: str, reason: str, datanode: str, block_id: int) -> DfsError:
    """The error a failed native read (``read_into``, ``core.BlockReader``) raises."""
    if kind == "checksum":
        return ChecksumError(reason)
    if kind == "broken":
        return DfsError(f"datanode {datanode}: read of block {block_id} failed: {reason}")
    return DfsError(reason)

