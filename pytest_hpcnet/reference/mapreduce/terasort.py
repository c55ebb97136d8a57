"""TeraSort in one process: the correctness reference for the distributed engine, and the ``terasort``
command when no cluster is given.

The task-level pieces are what the engine's tasks call: ``map_sort_partition`` (a map task: sort its
split's records and cut them into one sorted segment per reduce) and ``merge_segments`` (a reduce
task: merge the sorted segments it fetched). ``terasort`` strings them together with Hadoop's sampler
and commits ``part-r-NNNNN`` + ``_partition.lst`` + ``_SUCCESS`` atomically.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from .partition import PARTITION_FILENAME, partition, sample_split_points, write_partition_file
from .records import (DEFAULT_SPLIT_BYTES, RECORD_LENGTH, committed_output, input_files, input_splits,
                      part_name, sort_records)


def map_sort_partition(records: np.ndarray, split_points: list[bytes]) -> list[np.ndarray]:
    """One map task's output: ``len(split_points)+1`` segments, segment r sorted and holding the
    records of partition r."""
    ordered = sort_records(records)
    parts = partition(ordered, split_points)      # non-decreasing, because the records are sorted
    bounds = np.searchsorted(parts, np.arange(len(split_points) + 2), side="left")
    return [ordered[bounds[r]:bounds[r + 1]] for r in range(len(split_points) + 1)]


def merge_segments(segments: list[np.ndarray]) -> np.ndarray:
    """One reduce task: merge sorted segments into one sorted array (numpy's stable sort finds the runs)."""
    if not segments:
        return np.empty((0, RECORD_LENGTH), dtype=np.uint8)
    return sort_records(np.concatenate(segments))


@dataclass
class TeraSortResult:
    records: int
    split_points: list[bytes]
    partition_records: list[int]
    phase_seconds: dict[str, float] = field(default_factory=dict)   # sample, map, reduce (incl. write)


def terasort(indir: str | os.PathLike, outdir: str | os.PathLike, reduces: int = 1,
             split_bytes: int = DEFAULT_SPLIT_BYTES, progress=None) -> TeraSortResult:
    """Sort the 100-byte records under ``indir`` into ``reduces`` totally ordered files in ``outdir``.
    ``progress(n)`` hears of n bytes mapped, then of n bytes written by the reduces (2x the input)."""
    advance = progress or (lambda n: None)
    if reduces < 1:
        raise ConfigError(f"reduce count must be >= 1, got {reduces}", "--reduces")
    files = input_files(indir, "terasort INDIR")
    if Path(outdir).exists():
        raise ConfigError(f"output directory {str(outdir)!r} already exists", "terasort OUTDIR")
    splits = input_splits(files, split_bytes)
    t0 = time.perf_counter()
    points = sample_split_points(splits, reduces)
    t1 = time.perf_counter()
    per_reduce: list[list[np.ndarray]] = [[] for _ in range(reduces)]
    for split in splits:
        records = split.read()
        for r, segment in enumerate(map_sort_partition(records, points)):
            per_reduce[r].append(segment)
        advance(records.nbytes)
    t2 = time.perf_counter()
    sizes = []
    with committed_output(outdir, "terasort OUTDIR") as tmp:
        write_partition_file(tmp / PARTITION_FILENAME, points)
        for r in range(reduces):
            merged = merge_segments(per_reduce[r])
            per_reduce[r] = []                     # drop the map segments as soon as they are merged
            merged.tofile(tmp / part_name("r", r))
            sizes.append(len(merged))
            advance(merged.nbytes)
    t3 = time.perf_counter()
    return TeraSortResult(sum(sizes), points, sizes, {"sample": t1 - t0, "map": t2 - t1, "reduce": t3 - t2})
