"""The block store's per-chunk checksum types: one big-endian 32-bit CRC per ``bpc`` bytes.

- ``crc32c``: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), HDFS's default
  ``dfs.checksum.type``. Computed by the native core (SSE4.2's ``crc32`` instruction) where it is
  installed; else by the table-driven pure-Python reference below (correct, about a thousand times
  slower: fine for conformance, not for speed).
- ``crc32``: CRC-32 (IEEE, zlib's; Hadoop's ``CRC32``), by the native core or ``zlib.crc32``.

``impl="python"`` asks for the Python computation explicitly (the Python pipeline's own cost, which
the checksum claims compare against).
"""

from __future__ import annotations

import zlib

from ..native import AVAILABLE, core
from .errors import ChecksumError, DfsError

KINDS = ("crc32c", "crc32")
DEFAULT = "crc32c"   # what a header that names no type means: HDFS's default
# What a writer picks when not told: CRC32C where the native core computes it, else zlib's CRC32 (C
# speed), since the pure-Python CRC32C (~10 MB/s here, less in the emulated guest) would measure itself
# instead of the transport. The replica's meta file records the type, so readers follow either.
PREFERRED = "crc32c" if AVAILABLE else "crc32"
LABELS = {"crc32c": "CRC32C", "crc32": "CRC32"}


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C of ``data`` in pure Python (the reference; ``crc32c(b"123456789") == 0xE3069283``)."""
    c = crc ^ 0xFFFFFFFF
    table = _TABLE
    for b in bytes(data):
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


_PY_CRC = {"crc32c": crc32c, "crc32": zlib.crc32}


def check_kind(kind) -> str:
    if kind not in KINDS:
        raise DfsError(f"unknown checksum type {str(kind)[:40]!r}; choose one of {list(KINDS)}")
    return kind


def chunk_sums(data, bpc: int, kind: str = DEFAULT, impl: str | None = None) -> bytes:
    """The checksum of every ``bpc``-byte chunk of ``data`` (the last chunk may be short)."""
    check_kind(kind)
    view = memoryview(data).cast("B")
    if AVAILABLE and impl != "python":
        return core.chunk_sums(view, bpc, kind)
    crc = _PY_CRC[kind]
    return b"".join(crc(view[i:i + bpc]).to_bytes(4, "big") for i in range(0, len(view), bpc))


def verify(data, sums, bpc: int, where: str, offset: int = 0, kind: str = DEFAULT,
           impl: str | None = None) -> None:
    """Raise ChecksumError (one line: ``where``, the byte offset of the first chunk that differs, the
    type) unless every chunk of ``data`` matches ``sums``."""
    check_kind(kind)
    view = memoryview(data).cast("B")
    expected = memoryview(sums).cast("B")
    chunks = (len(view) + bpc - 1) // bpc
    if len(expected) != 4 * chunks:
        raise ChecksumError(f"{where}: {len(expected)} checksum bytes for {len(view)} data bytes "
                            f"(expected {4 * chunks})")
    if AVAILABLE and impl != "python":
        bad = core.first_bad_chunk(view, expected, bpc, kind)
    else:
        actual = chunk_sums(view, bpc, kind, impl="python")
        bad = None if actual == expected else next(
            i for i in range(chunks) if actual[4 * i:4 * i + 4] != expected[4 * i:4 * i + 4])
    if bad is not None:
        raise ChecksumError(f"{where}: checksum mismatch in the chunk at byte {offset + bad * bpc} "
                            f"({LABELS[kind]} per {bpc} bytes)")
