"""On-disk formats shared by the data tools: TeraSort's fixed 100-byte records, input listing and splits,
and the atomic output commit (temporary dir, rename, ``_SUCCESS``) every job uses.

A map or reduce task works on numpy arrays of shape ``(n, 100)`` and dtype ``uint8``; keys are the first
10 bytes and compare as unsigned bytes. ``key_columns`` turns them into two integer columns (big-endian
high 8 bytes, low 2 bytes) so that numpy can sort and search them with the same order as Hadoop's
``Text.compareTo``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ...errors import ConfigError, HpcnetError

RECORD_LENGTH = 100
KEY_LENGTH = 10
VALUE_LENGTH = RECORD_LENGTH - KEY_LENGTH
SUCCESS_MARKER = "_SUCCESS"
# Hadoop's local file system block size; FileInputFormat cuts files into splits of about this size.
DEFAULT_SPLIT_BYTES = 32 * 1024 * 1024
SPLIT_SLOP = 1.1  # FileInputFormat keeps a tail of up to 10% of a split in the previous split


class RecordFormatError(HpcnetError):
    """An input file is not a whole number of records, or a framed file is malformed."""


def part_name(kind: str, index: int) -> str:
    """``part-m-00003`` for map output, ``part-r-00003`` for reduce output (Hadoop's names)."""
    return f"part-{kind}-{index:05d}"


def input_files(directory: str | os.PathLike, where: str = "input") -> list[Path]:
    """The data files of a job's input dir in filename order, skipping ``_``/``.`` names as Hadoop does."""
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError(f"{str(d)!r} is not a directory", where)
    files = []
    for p in sorted(d.iterdir(), key=lambda p: p.name.encode()):
        if p.name.startswith(("_", ".")):
            continue
        if not p.is_file():
            raise ConfigError(f"{str(p)!r} is not a regular file (subdirectories are not read)", where)
        files.append(p)
    return files


def record_count(path: Path) -> int:
    size = path.stat().st_size
    if size % RECORD_LENGTH:
        raise RecordFormatError(f"{path}: {size} bytes is not a whole number of {RECORD_LENGTH}-byte records")
    return size // RECORD_LENGTH


def read_records(path: str | os.PathLike, first: int = 0, count: int | None = None) -> np.ndarray:
    """Records ``first .. first+count`` of a file as an ``(n, 100)`` uint8 array."""
    path = Path(path)
    total = record_count(path)
    first = min(first, total)
    count = total - first if count is None else min(count, total - first)
    data = np.fromfile(path, dtype=np.uint8, count=count * RECORD_LENGTH, offset=first * RECORD_LENGTH)
    return data.reshape(-1, RECORD_LENGTH)


@dataclass(frozen=True)
class Split:
    """A byte range of an input file; it owns the records that *start* inside the range (Hadoop's rule)."""

    path: Path
    start: int
    length: int

    def record_range(self) -> tuple[int, int]:
        """(first record, record count) of this split."""
        first = -(-self.start // RECORD_LENGTH)
        end = -(-(self.start + self.length) // RECORD_LENGTH)
        return first, max(0, end - first)

    def read(self, limit: int | None = None) -> np.ndarray:
        first, count = self.record_range()
        return read_records(self.path, first, count if limit is None else min(count, limit))


def input_splits(files: list[Path], split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Split]:
    """Cut files into splits like FileInputFormat: ~split_bytes each, the last up to 1.1x; empty files
    give one empty split."""
    if split_bytes <= 0:
        raise ConfigError(f"split size must be positive, got {split_bytes}", "split_bytes")
    splits = []
    for path in files:
        size = path.stat().st_size
        offset = 0
        while size - offset > SPLIT_SLOP * split_bytes:
            splits.append(Split(path, offset, split_bytes))
            offset += split_bytes
        if size - offset > 0 or size == 0:
            splits.append(Split(path, offset, size - offset))
    return splits


def key_columns(records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys as (high 8 bytes as big-endian uint64, low 2 bytes as uint16): comparing the pair
    lexicographically is the unsigned byte order of the 10-byte key."""
    if records.ndim != 2 or records.shape[1] < KEY_LENGTH:
        raise ValueError(f"expected an (n, >=10) uint8 array, got shape {records.shape}")
    keys = np.ascontiguousarray(records[:, :KEY_LENGTH])
    hi = keys[:, :8].copy().view(">u8").ravel().astype(np.uint64)
    lo = keys[:, 8:10].copy().view(">u2").ravel().astype(np.uint16)
    return hi, lo


def keys_as_records(keys: list[bytes]) -> np.ndarray:
    """10-byte keys as an (n, 10) uint8 array, to reuse the record helpers on split points."""
    for k in keys:
        if len(k) != KEY_LENGTH:
            raise ValueError(f"key {k!r} is not {KEY_LENGTH} bytes")
    return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, KEY_LENGTH)


_MAX_TIED_GROUPS = 64  # beyond this many equal high-8-byte groups a full lexsort is cheaper


def key_order(records: np.ndarray) -> np.ndarray:
    """The stable permutation that sorts records by key. An unstable sort of the high 8 bytes is ~4x
    faster than a two-key lexsort; the rare groups that tie on those bytes are then re-sorted by
    (low 2 bytes, input position), which makes the result exactly the stable key order."""
    hi, lo = key_columns(records)
    order = np.argsort(hi)
    hs = hi[order]
    tied = np.flatnonzero(hs[1:] == hs[:-1])
    if len(tied) == 0:
        return order
    values = np.unique(hs[tied])
    if len(values) > _MAX_TIED_GROUPS:
        return np.lexsort((lo, hi))
    for h in values:
        a, b = np.searchsorted(hs, h, "left"), np.searchsorted(hs, h, "right")
        group = order[a:b]
        order[a:b] = group[np.lexsort((group, lo[group]))]
    return order


def sort_records(records: np.ndarray) -> np.ndarray:
    """Records sorted by key (stable: equal keys keep their input order)."""
    if len(records) < 2:
        return records.copy()
    return records[key_order(records)]


def misordered_positions(records: np.ndarray) -> np.ndarray:
    """Indices i (>= 1) where key[i] < key[i-1]."""
    if len(records) < 2:
        return np.empty(0, dtype=np.intp)
    hi, lo = key_columns(records)
    down = (hi[1:] < hi[:-1]) | ((hi[1:] == hi[:-1]) & (lo[1:] < lo[:-1]))
    return np.flatnonzero(down) + 1


@contextlib.contextmanager
def committed_output(outdir: str | os.PathLike, where: str = "output") -> Iterator[Path]:
    """Yield a temporary dir next to ``outdir``; on success rename it to ``outdir`` and mark it
    ``_SUCCESS``. On error remove it, so a failed job leaves no partial output. Like Hadoop, refuse an
    existing output dir."""
    out = Path(outdir)
    if out.exists():
        raise ConfigError(f"output directory {str(out)!r} already exists", where)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"parent directory of {str(out)!r} does not exist", where)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent))
    try:
        yield tmp
        (tmp / SUCCESS_MARKER).touch()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
