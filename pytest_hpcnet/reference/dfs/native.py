"""The datanode's packet pipeline in the native core (``impl=native``; issue 17).

``stream`` hands one block's packet stream to ``core.BlockStream``: the upstream and downstream tcp
sockets and the replica's files, already set up by the Python datanode. The native side receives each
packet, forwards the frame as it came, verifies every chunk (CRC-32C with SSE4.2, or CRC-32), writes
data and checksums, and relays acknowledgements upstream on its own thread, all without the GIL.
What happens once per block stays in Python: checks, connecting, opening and finishing the replica.
"""

from __future__ import annotations

from ...errors import ConfigError
from .. import native as core_module

IMPLS = core_module.IMPLS


def resolve_impl(impl: str | None, transport: str, where: str = "datanode impl") -> str:
    """``auto``/None: native where the core is installed and the transport is tcp, else python."""
    if impl in (None, "", "auto"):
        return "native" if core_module.AVAILABLE and transport == "tcp" else "python"
    impl = core_module.resolve_impl(impl, where)
    if impl == "native" and transport != "tcp":
        raise ConfigError(f"the native packet pipeline speaks tcp, not {transport}; use impl=python "
                          f"for {transport}", where)
    return impl


def stream(up, down, writer, index: int, label: str, packet_timeout: float, log) -> None:
    """Run the packet stream of one block (after the setup ack went up) to its end: the replica is
    made final before the last ack leaves, dropped on a checksum error, and otherwise left under
    construction for a pipeline recovery (the caller's ``writer.close()``)."""
    block_stream = core_module.core.BlockStream(
        up.sock.fileno(), down.sock.fileno() if down is not None else -1, writer.data.fileno(),
        writer.meta.fileno(), writer.bpc, writer.checksum, index, writer.length, label, packet_timeout,
        bytes(getattr(up, "_carry", b"")))
    last, abort = None, True
    try:
        end, length, seq, message = block_stream.receive()
        writer.length = length
        abort = end == "upstream"
        if end == "last":
            writer.finish()        # renamed into place (page cache) before the last ack leaves
            last = seq
        elif end == "checksum":
            writer.abandon()
        elif end != "upstream" or "closed the connection" not in message:
            log(f"pipeline dropped: {message}")
    finally:
        block_stream.finish(last, packet_timeout, abort)
