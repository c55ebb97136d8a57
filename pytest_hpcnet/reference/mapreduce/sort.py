"""The ``sort`` job over RandomWriter's framed KV files, in one process (reference for the engine).

As in Hadoop's Sort example the partitioner is the hash partitioner: reduce r gets the records with
``(hash(key) & 0x7fffffff) % R == r`` where hash is BytesWritable's (h = 31*h + signed byte, from
h = 1, in 32 bits). So each output file is sorted, but the files are not ordered against each other.
Task-level pieces: ``map_partition_sort`` (a map task) and ``merge_sorted`` (a reduce task: k-way
merge of sorted segments).
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from ...errors import ConfigError
from .randomwriter import Record, read_records, write_records
from .records import committed_output, input_files, part_name

_POW31: list[np.ndarray] = [np.ones(1, dtype=np.uint64)]


def _powers_of_31(n: int) -> np.ndarray:
    """31^(n-1), ..., 31^0 mod 2^64 (only the low 32 bits matter); cached and grown on demand."""
    if len(_POW31[0]) < n:
        size = max(n, 2 * len(_POW31[0]))
        _POW31[0] = np.array([pow(31, i, 1 << 64) for i in range(size)], dtype=np.uint64)
    return _POW31[0][:n][::-1]


def bytes_hash(key: bytes) -> int:
    """Hadoop's WritableComparator.hashBytes as a signed 32-bit int."""
    n = len(key)
    signed = np.frombuffer(key, dtype=np.int8).astype(np.int64).astype(np.uint64)
    total = int(np.dot(signed, _powers_of_31(n))) if n else 0
    total = (total + pow(31, n, 1 << 64)) & 0xFFFFFFFF     # the initial h = 1 times 31^n
    return total - (1 << 32) if total >= 1 << 31 else total


def hash_partition(key: bytes, reduces: int) -> int:
    return (bytes_hash(key) & 0x7FFFFFFF) % reduces


def map_partition_sort(records: list[Record], reduces: int) -> list[list[Record]]:
    """One map task: one key-sorted segment per reduce."""
    segments: list[list[Record]] = [[] for _ in range(reduces)]
    for record in records:
        segments[hash_partition(record[0], reduces)].append(record)
    for segment in segments:
        segment.sort(key=itemgetter(0))
    return segments


def merge_sorted(segments: list[list[Record]]) -> list[Record]:
    """One reduce task: k-way merge of key-sorted segments."""
    return list(heapq.merge(*segments, key=itemgetter(0)))


@dataclass
class SortResult:
    records: int
    partition_records: list[int]


def sort(indir: str | os.PathLike, outdir: str | os.PathLike, reduces: int = 1) -> SortResult:
    """Sort every framed KV file under ``indir`` into ``reduces`` files part-r-NNNNN in ``outdir``."""
    if reduces < 1:
        raise ConfigError(f"reduce count must be >= 1, got {reduces}", "--reduces")
    files = input_files(indir, "sort INDIR")
    per_reduce: list[list[list[Record]]] = [[] for _ in range(reduces)]
    for path in files:
        for r, segment in enumerate(map_partition_sort(read_records(path), reduces)):
            per_reduce[r].append(segment)
    sizes = []
    with committed_output(outdir, "sort OUTDIR") as tmp:
        for r in range(reduces):
            merged = merge_sorted(per_reduce[r])
            write_records(tmp / part_name("r", r), merged)
            sizes.append(len(merged))
    return SortResult(sum(sizes), sizes)
