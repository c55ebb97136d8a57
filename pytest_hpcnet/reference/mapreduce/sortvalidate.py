"""SortValidator for the ``sort`` job: the output holds exactly the input's records, sorted.

Checks, as Hadoop's SortValidator does: equal record counts, key bytes and value bytes, and equal
XOR of per-record hashes between input and output (this project also compares the sum of the hashes
mod 2^64, which XOR alone misses for a record duplicated twice); then that every output file
part-r-NNNNN is sorted by key and holds only records of its own hash partition. Success prints exactly
Hadoop's line ``SUCCESS! Validated the MapReduce framework's 'sort' successfully.``
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

from .randomwriter import Record, read_records
from .records import input_files
from .sort import hash_partition

SUCCESS_LINE = "SUCCESS! Validated the MapReduce framework's 'sort' successfully."
_PART_R = re.compile(r"^part-r-(\d{5})$")


def record_hash(key: bytes, value: bytes) -> int:
    """64-bit hash of one record; the key length is hashed too, so the key/value cut matters."""
    h = hashlib.blake2b(len(key).to_bytes(4, "big"), digest_size=8)
    h.update(key)
    h.update(value)
    return int.from_bytes(h.digest(), "big")


@dataclass
class RecordStats:
    """Order-free summary of a set of records; a map task computes one per file, the reduce adds them."""

    records: int = 0
    key_bytes: int = 0
    value_bytes: int = 0
    hash_xor: int = 0
    hash_sum: int = 0

    def add_records(self, records: list[Record]) -> "RecordStats":
        for key, value in records:
            h = record_hash(key, value)
            self.records += 1
            self.key_bytes += len(key)
            self.value_bytes += len(value)
            self.hash_xor ^= h
            self.hash_sum = (self.hash_sum + h) & 0xFFFFFFFFFFFFFFFF
        return self

    def combine(self, other: "RecordStats") -> "RecordStats":
        return RecordStats(self.records + other.records, self.key_bytes + other.key_bytes,
                           self.value_bytes + other.value_bytes, self.hash_xor ^ other.hash_xor,
                           (self.hash_sum + other.hash_sum) & 0xFFFFFFFFFFFFFFFF)


def order_errors(name: str, records: list[Record], partition: int | None, reduces: int) -> list[str]:
    """A reduce output file's problems: keys going down, records of another partition."""
    errors = []
    for i in range(1, len(records)):
        if records[i][0] < records[i - 1][0]:
            errors.append(f"{name}: record {i} is out of order (key {records[i][0][:16].hex()}... "
                          f"< previous {records[i - 1][0][:16].hex()}...)")
            break
    if partition is not None:
        for i, (key, _) in enumerate(records):
            if hash_partition(key, reduces) != partition:
                errors.append(f"{name}: record {i} belongs to partition {hash_partition(key, reduces)},"
                              f" not {partition}")
                break
    return errors


@dataclass
class SortValidation:
    ok: bool
    lines: list[str] = field(default_factory=list)
    input_stats: RecordStats = field(default_factory=RecordStats)
    output_stats: RecordStats = field(default_factory=RecordStats)


def sortvalidate(indir: str | os.PathLike, outdir: str | os.PathLike) -> SortValidation:
    in_files = input_files(indir, "sortvalidate INDIR")
    out_files = input_files(outdir, "sortvalidate OUTDIR")
    stats_in = RecordStats()
    for path in in_files:
        stats_in = stats_in.combine(RecordStats().add_records(read_records(path)))
    stats_out = RecordStats()
    problems: list[str] = []
    all_parts = all(_PART_R.match(p.name) for p in out_files)
    for path in out_files:
        records = read_records(path)
        stats_out = stats_out.combine(RecordStats().add_records(records))
        partition = int(_PART_R.match(path.name).group(1)) if all_parts else None
        problems += order_errors(path.name, records, partition, len(out_files))
    for label, a, b in (("records", stats_in.records, stats_out.records),
                        ("key bytes", stats_in.key_bytes, stats_out.key_bytes),
                        ("value bytes", stats_in.value_bytes, stats_out.value_bytes),
                        ("record hash XOR", stats_in.hash_xor, stats_out.hash_xor),
                        ("record hash sum", stats_in.hash_sum, stats_out.hash_sum)):
        if a != b:
            shown = (f"{a:016x}", f"{b:016x}") if "hash" in label else (a, b)
            problems.append(f"{label} differ: input {shown[0]}, output {shown[1]}")
    lines = [f"FAILED: {p}" for p in problems] or [SUCCESS_LINE]
    return SortValidation(not problems, lines, stats_in, stats_out)

