"""TeraSort's sampled total-order partitioner.

Sampling follows Hadoop's TeraInputFormat.writePartitionFile: take min(10, #splits) splits spread
evenly over the split list (every ``#splits // samples``-th), read the first ``100000 // samples``
records of each, sort the keys, and pick split point i (1 <= i < R) at index round(step * i) with
step = N / R in single precision, exactly as Hadoop computes it. A key goes to the number of split
points that are <= it (Hadoop's trie returns the first split point greater than the key), so
partition r holds keys in [point[r-1], point[r]).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ...errors import ConfigError, HpcnetError
from .records import KEY_LENGTH, Split, input_splits, key_columns, keys_as_records

DEFAULT_SAMPLE_SIZE = 100_000
DEFAULT_SAMPLE_SPLITS = 10
PARTITION_FILENAME = "_partition.lst"


class PartitionError(HpcnetError):
    """Split points cannot be chosen (fewer sampled keys than reduces)."""


def sample_keys(splits: list[Split], sample_size: int = DEFAULT_SAMPLE_SIZE,
                sample_splits: int = DEFAULT_SAMPLE_SPLITS) -> list[bytes]:
    """The sampled keys, unsorted, read from the splits Hadoop would pick."""
    samples = min(sample_splits, len(splits))
    if samples == 0:
        return []
    per_sample = sample_size // samples
    step = len(splits) // samples
    keys: list[bytes] = []
    for i in range(samples):
        block = splits[step * i].read(limit=per_sample)
        raw = np.ascontiguousarray(block[:, :KEY_LENGTH]).tobytes()
        keys += [raw[j:j + KEY_LENGTH] for j in range(0, len(raw), KEY_LENGTH)]
    return keys


def choose_split_points(keys: list[bytes], reduces: int) -> list[bytes]:
    """R-1 split points from the sampled keys (Hadoop's TextSampler.createPartitions)."""
    if reduces < 1:
        raise ConfigError(f"reduce count must be >= 1, got {reduces}", "reduces")
    if reduces == 1:
        return []
    if reduces > len(keys):
        raise PartitionError(f"Requested more partitions than input keys ({reduces} > {len(keys)})")
    ordered = sorted(keys)
    step = np.float32(len(ordered)) / np.float32(reduces)
    # Java's Math.round(float): floor(x + 0.5), here on the exact float32 product
    return [ordered[math.floor(float(step * np.float32(i)) + 0.5)] for i in range(1, reduces)]


def sample_split_points(inputs: list[str | os.PathLike] | list[Split], reduces: int,
                        sample_size: int = DEFAULT_SAMPLE_SIZE,
                        sample_splits: int = DEFAULT_SAMPLE_SPLITS) -> list[bytes]:
    """Split points for ``reduces`` partitions sampled from input files (or ready-made splits). An
    empty input needs no split points: every partition is empty."""
    splits = inputs if all(isinstance(s, Split) for s in inputs) else input_splits([Path(p) for p in inputs])
    if reduces == 1:
        return []
    keys = sample_keys(splits, sample_size, sample_splits)
    if not keys:
        return []
    return choose_split_points(keys, reduces)


def partition(records: np.ndarray, split_points: list[bytes]) -> np.ndarray:
    """Partition index per record (``records`` is (n, >=10) uint8: records or bare keys); intp array.
    Without split points everything goes to partition 0."""
    n = len(records)
    if not split_points or n == 0:
        return np.zeros(n, dtype=np.intp)
    hi, lo = key_columns(records)
    s_hi, s_lo = key_columns(keys_as_records(split_points))
    left = np.searchsorted(s_hi, hi, side="left")
    right = np.searchsorted(s_hi, hi, side="right")
    result = left.astype(np.intp)
    tied = np.flatnonzero(right > left)    # split points share the high 8 bytes: decide on the low 2
    if len(tied):
        for h in np.unique(hi[tied]):
            idx = tied[hi[tied] == h]
            g0, g1 = np.searchsorted(s_hi, h, "left"), np.searchsorted(s_hi, h, "right")
            result[idx] = g0 + np.searchsorted(s_lo[g0:g1], lo[idx], side="right")
    return result


def write_partition_file(path: str | os.PathLike, split_points: list[bytes]) -> None:
    """Split points as Hadoop writes ``_partition.lst``: each a Text (one-byte vint length 10, bytes)."""
    with open(path, "wb") as f:
        for key in split_points:
            f.write(bytes([len(key)]) + key)


def read_partition_file(path: str | os.PathLike) -> list[bytes]:
    data = Path(path).read_bytes()
    points, i = [], 0
    while i < len(data):
        n = data[i]
        if n > 127 or i + 1 + n > len(data):
            raise PartitionError(f"{path}: malformed partition file at byte {i}")
        points.append(data[i + 1:i + 1 + n])
        i += 1 + n
    return points
