"""RandomWriter: seeded random binary key/value records, the input of the ``sort`` benchmark.

Like Hadoop's RandomWriter, every map writes records until it has written its share of the bytes
(key + value bytes; the last record may overshoot), with key lengths drawn from [10, 1000) and value
lengths from [0, 20000) (Hadoop's defaults: min + nextInt(max - min)). Map i draws from a generator
seeded with (seed, i), so a re-run map task writes the same file.

File format ("framed KV", this project's own; Hadoop writes SequenceFiles instead)::

    magic  b"HPCNKV1\\n"                                  8 bytes
    then per record:
      key length    uint32 big-endian
      value length  uint32 big-endian
      key bytes, value bytes

Keys order as unsigned bytes, shorter prefix first (Python ``bytes`` order, like BytesWritable).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ...errors import ConfigError
from .records import RecordFormatError, committed_output, part_name
from .teragen import split_ranges

MAGIC = b"HPCNKV1\n"
_LENGTHS = struct.Struct(">II")
KEY_RANGE = (10, 1000)
VALUE_RANGE = (0, 20000)

Record = tuple[bytes, bytes]


def encode_records(records: Iterable[Record]) -> bytes:
    parts = [MAGIC]
    for key, value in records:
        parts += [_LENGTHS.pack(len(key), len(value)), key, value]
    return b"".join(parts)


def decode_records(data: bytes, where: str = "framed KV data") -> list[Record]:
    if data[:len(MAGIC)] != MAGIC:
        raise RecordFormatError(f"{where}: not a framed KV file (bad magic)")
    records, pos, end = [], len(MAGIC), len(data)
    view = memoryview(data)
    while pos < end:
        if pos + 8 > end:
            raise RecordFormatError(f"{where}: truncated record header at byte {pos}")
        klen, vlen = _LENGTHS.unpack_from(data, pos)
        pos += 8
        if pos + klen + vlen > end:
            raise RecordFormatError(f"{where}: record at byte {pos - 8} runs past the end of the file")
        records.append((bytes(view[pos:pos + klen]), bytes(view[pos + klen:pos + klen + vlen])))
        pos += klen + vlen
    return records


def write_records(path: str | os.PathLike, records: Iterable[Record]) -> None:
    Path(path).write_bytes(encode_records(records))


def read_records(path: str | os.PathLike) -> list[Record]:
    return decode_records(Path(path).read_bytes(), str(path))


def _check_range(name: str, bounds: tuple[int, int]) -> None:
    lo, hi = bounds
    if not 0 <= lo <= hi:
        raise ConfigError(f"need 0 <= min <= max, got {lo}..{hi}", name)


def random_records(budget: int, seed: int, map_index: int, key_range: tuple[int, int] = KEY_RANGE,
                   value_range: tuple[int, int] = VALUE_RANGE) -> Iterator[Record]:
    """One map's records: draw until ``budget`` key+value bytes have been written."""
    _check_range("key_range", key_range)
    _check_range("value_range", value_range)
    rng = np.random.default_rng([seed, map_index])
    remaining = budget
    while remaining > 0:
        klen = key_range[0] + (int(rng.integers(key_range[1] - key_range[0])) if key_range[1] > key_range[0] else 0)
        vlen = value_range[0] + (int(rng.integers(value_range[1] - value_range[0]))
                                 if value_range[1] > value_range[0] else 0)
        if klen + vlen == 0:
            raise ConfigError("key and value lengths are both 0: the map would never finish", "randomwriter")
        yield rng.bytes(klen), rng.bytes(vlen)
        remaining -= klen + vlen


@dataclass
class RandomWriterResult:
    records: int
    bytes: int                 # key + value bytes, as Hadoop's BYTES_WRITTEN counter counts them
    files: list[Path] = field(default_factory=list)


def write_random_split(path: str | os.PathLike, total_bytes: int, map_index: int, maps: int, seed: int,
                       key_range: tuple[int, int] = KEY_RANGE,
                       value_range: tuple[int, int] = VALUE_RANGE) -> RandomWriterResult:
    """One map task: its share of ``total_bytes`` into ``path``."""
    _, budget = split_ranges(total_bytes, maps)[map_index]
    records = list(random_records(budget, seed, map_index, key_range, value_range))
    write_records(path, records)
    return RandomWriterResult(len(records), sum(len(k) + len(v) for k, v in records), [Path(path)])


def randomwriter(outdir: str | os.PathLike, total_bytes: int, maps: int = 1, seed: int = 0,
                 key_range: tuple[int, int] = KEY_RANGE,
                 value_range: tuple[int, int] = VALUE_RANGE) -> RandomWriterResult:
    """Write ``maps`` files part-m-NNNNN with about ``total_bytes`` of random records, atomically."""
    if total_bytes < 0:
        raise ConfigError(f"byte count must be >= 0, got {total_bytes}", "--bytes")
    split_ranges(total_bytes, maps)      # validates maps
    total = RandomWriterResult(0, 0)
    with committed_output(outdir, "randomwriter OUTDIR") as tmp:
        for i in range(maps):
            part = write_random_split(tmp / part_name("m", i), total_bytes, i, maps, seed, key_range, value_range)
            total.records += part.records
            total.bytes += part.bytes
    total.files = [Path(outdir) / part_name("m", i) for i in range(maps)]
    return total
