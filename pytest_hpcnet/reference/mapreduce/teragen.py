"""TeraGen: the GraySort input records, byte-identical to Hadoop's TeraGen (gensort 1.1 binary records).

Row n is built from x(n+1), where x(0) = 0 and x' = A*x + C mod 2^128. To generate a block of rows at
numpy speed the 128-bit states are held as four 32-bit limbs in uint64 arrays, and a whole vector of
consecutive states is advanced at once by the L-step map f^L (leapfrogging): if S holds x(k+1..k+L)
then f^L(S) holds x(k+L+1..k+2L). Skip-ahead uses plain Python ints (composition of affine maps by
squaring), so any start row costs O(log n).

A map task calls ``teragen_split`` (or ``write_teragen_split``) for its share of the rows;
``split_ranges`` reproduces Hadoop's RangeInputFormat assignment (including its double-precision ceil).
"""

from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ...errors import ConfigError
from .records import RECORD_LENGTH, committed_output, part_name

A = 0x2360ED051FC65DA44385DF649FCCF645
C = 0x4A696D47726179524950202020202001
MASK128 = (1 << 128) - 1
MAX_ROW = (1 << 63) - 1  # Hadoop keeps row numbers in a Java long
BLOCK_ROWS = 1 << 16      # rows generated per numpy block

_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def affine_power(n: int, a: int = A, c: int = C) -> tuple[int, int]:
    """(a_n, c_n) with f^n(x) = a_n*x + c_n mod 2^128, by repeated squaring of the affine map."""
    if n < 0:
        raise ValueError(f"negative step count {n}")
    ra, rc = 1, 0          # identity
    pa, pc = a, c          # f^(2^k)
    while n:
        if n & 1:          # r := p o r
            ra, rc = (pa * ra) & MASK128, (pa * rc + pc) & MASK128
        pa, pc = (pa * pa) & MASK128, (pa * pc + pc) & MASK128
        n >>= 1
    return ra, rc


def random_state(n: int) -> int:
    """x(n) = f^n(0); row r uses x(r+1)."""
    return affine_power(n)[1]


def _limbs(v: int) -> list[np.uint64]:
    return [np.uint64((v >> (32 * i)) & 0xFFFFFFFF) for i in range(4)]


def _apply_affine(x: list[np.ndarray], a: int, c: int) -> list[np.ndarray]:
    """a*x + c mod 2^128 on limb vectors (limb 0 least significant, each < 2^32 in a uint64)."""
    al, cl = _limbs(a), _limbs(c)
    cols = [np.full_like(x[0], cl[k]) for k in range(4)]
    for i in range(4):
        for j in range(4 - i):
            prod = x[i] * al[j]          # < 2^64; a product landing in limb 3 drops its high half
            cols[i + j] += prod & _M32
            if i + j < 3:
                cols[i + j + 1] += prod >> _S32
    out = []
    carry = np.zeros_like(x[0])
    for k in range(4):
        total = cols[k] + carry
        out.append(total & _M32)
        carry = total >> _S32
    return out


def _states(first_row: int, count: int) -> Iterator[list[np.ndarray]]:
    """Limb vectors of x(first_row+1 ..), in blocks of up to BLOCK_ROWS."""
    x = random_state(first_row + 1)
    block = [np.array([v], dtype=np.uint64) for v in _limbs(x)]
    width = 1
    while width < min(count, BLOCK_ROWS):   # double the vector: [S, f^width(S)]
        a, c = affine_power(width)
        block = [np.concatenate(p) for p in zip(block, _apply_affine(block, a, c))]
        width *= 2
    step = affine_power(width)
    done = 0
    while done < count:
        take = min(width, count - done)
        yield [limb[:take] for limb in block]
        done += take
        if done < count:
            block = _apply_affine(block, *step)


def _hex_digits(nibbles: np.ndarray) -> np.ndarray:
    return _HEX[nibbles]


def _nibbles(byte_cols: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k) nibbles, most significant first."""
    out = np.empty((byte_cols.shape[0], byte_cols.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = byte_cols >> 4
    out[:, 1::2] = byte_cols & 0x0F
    return out


def _build_records(limbs: list[np.ndarray], first_row: int) -> np.ndarray:
    n = len(limbs[0])
    rand = np.empty((n, 4), dtype=">u4")
    for k in range(4):
        rand[:, k] = limbs[3 - k]
    rand_bytes = rand.view(np.uint8).reshape(n, 16)
    rec = np.empty((n, RECORD_LENGTH), dtype=np.uint8)
    rec[:, 0:10] = rand_bytes[:, 0:10]
    rec[:, 10] = 0x00
    rec[:, 11] = 0x11
    rows = np.arange(first_row, first_row + n, dtype=np.uint64).astype(">u8")
    rec[:, 12:28] = ord("0")                      # the high 64 bits of the 128-bit row id are zero
    rec[:, 28:44] = _hex_digits(_nibbles(rows.view(np.uint8).reshape(n, 8)))
    rec[:, 44:48] = (0x88, 0x99, 0xAA, 0xBB)
    filler = _hex_digits(_nibbles(rand_bytes[:, 10:16]))      # hex digits 20..31 of the random number
    rec[:, 48:96] = np.repeat(filler, 4, axis=1)
    rec[:, 96:100] = (0xCC, 0xDD, 0xEE, 0xFF)
    return rec


def generate_rows(first_row: int, count: int) -> Iterator[np.ndarray]:
    """Records first_row .. first_row+count-1 as (n, 100) uint8 blocks."""
    if first_row < 0 or count < 0 or first_row + count - 1 > MAX_ROW:
        raise ConfigError(f"rows {first_row}..{first_row + count - 1} are outside 0..{MAX_ROW}", "teragen")
    row = first_row
    for limbs in _states(first_row, count):
        block = _build_records(limbs, row)
        row += len(block)
        yield block


def record_checksum(records: np.ndarray) -> int:
    """Sum of the CRC32 of every 100-byte record (not reduced mod 2^128; callers reduce)."""
    if len(records) == 0:
        return 0
    buf = memoryview(np.ascontiguousarray(records)).cast("B")
    crc = zlib.crc32
    crcs = np.fromiter((crc(buf[i:i + RECORD_LENGTH]) for i in range(0, len(buf), RECORD_LENGTH)),
                       dtype=np.uint64, count=len(records))
    return int(crcs.sum())


def split_ranges(total_rows: int, maps: int, start_row: int = 0) -> list[tuple[int, int]]:
    """(first row, row count) per map, as Hadoop's RangeInputFormat assigns them: map i ends at
    ceil(total * (i+1) / maps) computed in double precision; ``start_row`` shifts every range (the
    gensort ``-b`` option; Hadoop's TeraGen always starts at 0)."""
    if total_rows < 0:
        raise ConfigError(f"row count must be >= 0, got {total_rows}", "rows")
    if maps < 1:
        raise ConfigError(f"map count must be >= 1, got {maps}", "maps")
    if start_row < 0:
        raise ConfigError(f"start row must be >= 0, got {start_row}", "start")
    ranges, current = [], 0
    for i in range(maps):
        goal = math.ceil(float(total_rows) * float(i + 1) / maps)
        ranges.append((start_row + current, goal - current))
        current = goal
    return ranges


def teragen_split(total_rows: int, map_index: int, maps: int, start_row: int = 0) -> Iterator[np.ndarray]:
    """The record blocks map ``map_index`` of ``maps`` writes."""
    if not 0 <= map_index < maps:
        raise ConfigError(f"map index {map_index} is outside 0..{maps - 1}", "map_index")
    first, count = split_ranges(total_rows, maps, start_row)[map_index]
    return generate_rows(first, count)


@dataclass
class TeraGenResult:
    rows: int
    checksum: int                       # 128-bit sum of record CRC32s, as TeraValidate reports it
    files: list[Path] = field(default_factory=list)

    @property
    def checksum_hex(self) -> str:
        return format(self.checksum, "x")


def write_teragen_split(path: str | os.PathLike, total_rows: int, map_index: int, maps: int,
                        start_row: int = 0, progress=None) -> TeraGenResult:
    """One map task: write its records to ``path`` and return their row count and checksum.
    ``progress(n)`` is told of every block of n rows written."""
    rows = checksum = 0
    with open(path, "wb") as f:
        for block in teragen_split(total_rows, map_index, maps, start_row):
            block.tofile(f)
            rows += len(block)
            checksum += record_checksum(block)
            if progress is not None:
                progress(len(block))
    return TeraGenResult(rows, checksum & MASK128, [Path(path)])


def teragen(rows: int, outdir: str | os.PathLike, maps: int = 1, start_row: int = 0,
            progress=None) -> TeraGenResult:
    """Generate ``rows`` rows into ``outdir``/part-m-NNNNN (one file per map, empty ones included, as
    Hadoop writes them), committed atomically with ``_SUCCESS``; ``progress(n)`` hears of every n rows."""
    ranges = split_ranges(rows, maps, start_row)  # validate before touching the disk
    total = TeraGenResult(0, 0)
    with committed_output(outdir, "teragen OUTDIR") as tmp:
        for i in range(len(ranges)):
            part = write_teragen_split(tmp / part_name("m", i), rows, i, maps, start_row, progress)
            total.rows += part.rows
            total.checksum = (total.checksum + part.checksum) & MASK128
    total.files = [Path(outdir) / part_name("m", i) for i in range(len(ranges))]
    return total
