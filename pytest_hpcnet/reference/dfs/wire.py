"""Messages between block-store processes, and the per-chunk checksums.

A message is one transport frame: a 4-byte big-endian length of a JSON header, the header, then an
optional binary payload (checksums and data for packets). JSON keeps the control fields readable in
logs; the payload travels as memoryviews, never re-encoded.
"""

from __future__ import annotations

import json
import struct
from . import checksums
from .errors import ProtocolError

BYTES_PER_CHECKSUM = 512          # HDFS dfs.bytes-per-checksum default
PACKET_SIZE = 64 * 1024           # data bytes per packet (HDFS dfs.client-write-packet-size default)
MAX_HEADER = 64 * 1024
# Largest frame a datanode accepts: a packet of up to 16 MiB of data plus its checksums and header.
MAX_MESSAGE = 16 * 1024 * 1024 + (16 * 1024 * 1024 // BYTES_PER_CHECKSUM) * 4 + MAX_HEADER
_HLEN = struct.Struct(">I")


def encode(header: dict, *payload) -> list:
    """The parts of one message (hand them to ``Connection.send``)."""
    body = json.dumps(header, separators=(",", ":")).encode()
    return [_HLEN.pack(len(body)) + body, *payload]


def decode(view: memoryview) -> tuple[dict, memoryview]:
    """(header, payload view) of a received message; garbage raises ProtocolError."""
    if len(view) < 4:
        raise ProtocolError(f"message of {len(view)} bytes is too short for a header")
    (n,) = _HLEN.unpack(view[:4])
    if n > MAX_HEADER or n > len(view) - 4:
        raise ProtocolError(f"header length {n} is impossible in a {len(view)}-byte message")
    try:
        header = json.loads(bytes(view[4:4 + n]))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    return header, view[4 + n:]


def decode_request(view: memoryview) -> tuple[dict, memoryview]:
    header, payload = decode(view)
    if not isinstance(header.get("op"), str):
        raise ProtocolError("request header has no 'op'")
    return header, payload


def request(conn, header: dict, *payload, timeout: float | None = None) -> dict:
    """Send a message and return the header of the reply; an error reply raises ProtocolError."""
    conn.send(encode(header, *payload), timeout=timeout)
    msg = conn.recv(timeout=timeout, max_length=MAX_MESSAGE)
    try:
        reply, _ = decode(msg.view)
    finally:
        msg.release()
    return reply


def chunk_crcs(data, bpc: int = BYTES_PER_CHECKSUM, kind: str = checksums.DEFAULT) -> bytes:
    """Big-endian CRC of every ``bpc``-byte chunk of ``data`` (the last chunk may be short)."""
    return checksums.chunk_sums(data, bpc, kind)


def verify_chunks(data, crcs, bpc: int, where: str, offset: int = 0, kind: str = checksums.DEFAULT) -> None:
    """Raise ChecksumError naming ``where`` and the byte offset of the first chunk that differs."""
    checksums.verify(data, crcs, bpc, where, offset, kind)
