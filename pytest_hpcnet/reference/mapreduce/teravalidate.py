"""TeraValidate and TeraChecksum, with Hadoop's checks and report format.

Hadoop runs one map per file and a single reduce. The map (``validate_file``) emits
``<file>:begin``/``<file>:end`` with the file's first and last key, an ``error`` for each key smaller
than the one before it (``misorder in <file> between <hex> and <hex>``), and the file's ``checksum``
(sum of CRC32 over each 100-byte record). The reduce (``reduce_validations``) sees those keys in byte
order: it sums the checksums, passes errors on, and walks begin/end keys in filename order reporting
``bad key partitioning`` where a key goes down. The report lines are ``key<TAB>value``; a valid run's
report is exactly ``checksum<TAB><lowercase hex, no leading zeros>``. Empty input files emit nothing,
so an input of only empty files gives an empty report (as Hadoop's does).

Keys in messages print as Hadoop's BytesWritable does: two lowercase hex digits per byte,
space-separated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path

import numpy as np

from .records import committed_output, input_files, misordered_positions, part_name, read_records, record_count
from .teragen import MASK128, record_checksum

ERROR = "error"
CHECKSUM = "checksum"
READ_BLOCK_RECORDS = 1 << 18


def key_text(key: bytes) -> str:
    return key.hex(" ")


@dataclass
class FileValidation:
    """What one map task found in one file."""

    name: str
    records: int = 0
    first_key: bytes | None = None
    last_key: bytes | None = None
    checksum: int = 0
    errors: list[str] = field(default_factory=list)

    def emitted(self) -> list[tuple[str, str | bytes]]:
        """The map's output pairs, as Hadoop's ValidateMapper writes them."""
        if self.records == 0:
            return []
        out: list[tuple[str, str | bytes]] = [(f"{self.name}:begin", self.first_key)]
        out += [(ERROR, e) for e in self.errors]
        out += [(f"{self.name}:end", self.last_key), (CHECKSUM, format(self.checksum, "x"))]
        return out


def validate_file(path: str | os.PathLike, name: str | None = None) -> FileValidation:
    """The map task: order check and checksum of one file, read in blocks."""
    path = Path(path)
    result = FileValidation(name or path.name)
    total = record_count(path)
    previous = None  # last record of the previous block, to check across block edges
    for first in range(0, total, READ_BLOCK_RECORDS):
        block = read_records(path, first, READ_BLOCK_RECORDS)
        checked = block if previous is None else np.concatenate([previous, block])
        for i in misordered_positions(checked):
            result.errors.append(f"misorder in {result.name} between {key_text(checked[i - 1, :10].tobytes())}"
                                 f" and {key_text(checked[i, :10].tobytes())}")
        result.checksum += record_checksum(block)
        previous = block[-1:]
        if result.first_key is None:
            result.first_key = block[0, :10].tobytes()
    if total:
        result.last_key = previous[0, :10].tobytes()
    result.records = total
    result.checksum &= MASK128
    return result


def reduce_validations(files: list[FileValidation]) -> list[str]:
    """The single reduce: the report lines, in the order Hadoop's reducer writes them."""
    pairs = [p for f in files for p in f.emitted()]
    pairs.sort(key=lambda kv: kv[0].encode())          # the shuffle's key order (stable for values)
    lines: list[str] = []
    last_name = last_key = None
    for key, group in groupby(pairs, key=lambda kv: kv[0]):
        values = [v for _, v in group]
        if key == ERROR:
            lines += [f"{ERROR}\t{v}" for v in values]
        elif key == CHECKSUM:
            total = sum(int(v, 16) for v in values) & MASK128
            lines.append(f"{CHECKSUM}\t{total:x}")
        else:
            value = values[0]
            if last_key is not None and value < last_key:
                lines.append(f"{ERROR}\tbad key partitioning:\n  file {last_name} key {key_text(last_key)}"
                             f"\n  file {key} key {key_text(value)}")
            last_name, last_key = key, value
    return lines


def teravalidate(outdir: str | os.PathLike, reportdir: str | os.PathLike | None = None) -> list[str]:
    """Validate a TeraSort output dir; write the report to ``reportdir``/part-r-00000 (with
    ``_SUCCESS``) when given. Returns the report lines (an entry may span lines, as Hadoop's
    partitioning error does)."""
    files = input_files(outdir, "teravalidate OUTDIR")
    lines = reduce_validations([validate_file(p) for p in files])
    if reportdir is not None:
        with committed_output(reportdir, "teravalidate REPORTDIR") as tmp:
            (tmp / part_name("r", 0)).write_text("".join(line + "\n" for line in lines))
    return lines


def is_valid_report(lines: list[str]) -> bool:
    return len(lines) == 1 and lines[0].startswith(CHECKSUM + "\t")


def terachecksum(directory: str | os.PathLike) -> int:
    """TeraChecksum: the 128-bit sum of the CRC32 of every record under ``directory``, in any order."""
    total = 0
    for path in input_files(directory, "terachecksum DIR"):
        for first in range(0, record_count(path), READ_BLOCK_RECORDS):
            total += record_checksum(read_records(path, first, READ_BLOCK_RECORDS))
    return total & MASK128
