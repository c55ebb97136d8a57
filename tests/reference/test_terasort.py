"""TeraSort: key order, Hadoop's sampler and partitioner, splits, and the local job end to end."""

from __future__ import annotations

import bisect
import os
import random

import numpy as np
import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference.mapreduce import partition as pt
from pytest_hpcnet.reference.mapreduce import records as rec
from pytest_hpcnet.reference.mapreduce import terasort as ts
from pytest_hpcnet.reference.mapreduce.teragen import teragen
from pytest_hpcnet.reference.mapreduce.teravalidate import terachecksum, teravalidate

# Bytes that trip signed compares (0x7f/0x80), NUL-stripping string dtypes (0x00) and 0xff
TRICKY = bytes([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF])


def tricky_keys(rng: random.Random, n: int) -> list[bytes]:
    """Keys sharing long prefixes, so ties in the first 8 bytes are common."""
    return [bytes(rng.choice(TRICKY) for _ in range(10)) if rng.random() < 0.5
            else b"\x80" * 8 + bytes(rng.choice(TRICKY) for _ in range(2)) for _ in range(n)]


def as_records(keys: list[bytes], tag: bool = True) -> np.ndarray:
    rows = [k + (i.to_bytes(8, "big") if tag else b"\x00" * 8) + b"v" * 82 for i, k in enumerate(keys)]
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(-1, 100)


def test_sort_records_matches_python_sorted():
    keys = tricky_keys(random.Random(1), 3000)
    records = as_records(keys)
    got = [r.tobytes() for r in rec.sort_records(records)]
    want = sorted((r.tobytes() for r in records), key=lambda r: r[:10])     # stable like ours
    assert got == want


def test_sort_records_with_few_ties_is_stable():
    # mostly distinct keys plus a few groups sharing the high 8 bytes (the tie-fixing path)
    rng = random.Random(5)
    keys = [rng.randbytes(10) for _ in range(3000)]
    for g in range(5):
        prefix = rng.randbytes(8)
        keys += [prefix + bytes(rng.choice(TRICKY) for _ in range(2)) for _ in range(7)]
    rng.shuffle(keys)
    records = as_records(keys)
    got = [r.tobytes() for r in rec.sort_records(records)]
    assert got == sorted((r.tobytes() for r in records), key=lambda r: r[:10])


def test_misordered_positions():
    keys = [b"\x00" * 10, b"\x80" + b"\x00" * 9, b"\x7f" + b"\xff" * 9, b"\x7f" + b"\xff" * 9]
    assert rec.misordered_positions(as_records(keys)).tolist() == [2]


def test_partition_matches_bisect_right():
    rng = random.Random(2)
    keys = tricky_keys(rng, 4000)
    points = sorted(tricky_keys(rng, 9))
    got = pt.partition(as_records(keys), points)
    assert got.tolist() == [bisect.bisect_right(points, k) for k in keys]


def test_partition_without_split_points_is_zero():
    assert pt.partition(as_records([b"a" * 10, b"b" * 10]), []).tolist() == [0, 0]


def test_choose_split_points_uses_hadoops_float_rounding():
    keys = [bytes([i]) * 10 for i in range(10)]
    random.Random(3).shuffle(keys)
    # step = 10/3 in float32; round(3.333) = 3, round(6.667) = 7
    assert pt.choose_split_points(keys, 3) == [bytes([3]) * 10, bytes([7]) * 10]
    assert pt.choose_split_points(keys, 1) == []
    with pytest.raises(pt.PartitionError, match=r"more partitions than input keys \(11 > 10\)"):
        pt.choose_split_points(keys, 11)


def test_sampler_reads_first_records_of_evenly_spaced_splits(tmp_path):
    # 25 files of 4 records: 25 splits, 10 samples, every 2nd split, 100000 // 10 = all 4 records each
    files = []
    for f in range(25):
        p = tmp_path / f"part-m-{f:05d}"
        p.write_bytes(as_records([bytes([f, r]) * 5 for r in range(4)]).tobytes())
        files.append(p)
    splits = rec.input_splits(files)
    assert len(splits) == 25
    sampled = pt.sample_keys(splits)
    assert sorted(sampled) == sorted(bytes([f, r]) * 5 for f in range(0, 20, 2) for r in range(4))
    # 20 // 10 = 2 records from each sampled split
    assert sorted(pt.sample_keys(splits, sample_size=20)) == sorted(
        bytes([f, r]) * 5 for f in range(0, 20, 2) for r in range(2))


def test_sampler_limits_records_per_split(tmp_path):
    p = tmp_path / "part-m-00000"
    p.write_bytes(as_records([bytes([r]) * 10 for r in range(50)]).tobytes())
    splits = rec.input_splits([p], split_bytes=1000)           # 10 records per split, 5 splits
    assert [s.record_range() for s in splits] == [(i * 10, 10) for i in range(5)]
    # 15 // 5 = 3 records from the start of each split, splits in order
    want = [bytes([10 * s + r]) * 10 for s in range(5) for r in range(3)]
    assert pt.sample_keys(splits, sample_size=15) == want


def test_input_splits_follow_the_slop_rule(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(b"x" * 1100)     # 1.1 x split size: one split
    b.write_bytes(b"x" * 1101)     # a bit more: two
    c.write_bytes(b"")
    splits = rec.input_splits([a, b, c], split_bytes=1000)
    assert [(s.path.name, s.start, s.length) for s in splits] == [
        ("a", 0, 1100), ("b", 0, 1000), ("b", 1000, 101), ("c", 0, 0)]


def test_split_owns_records_starting_inside_it(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(as_records([bytes([i]) * 10 for i in range(10)]).tobytes())
    parts = [rec.Split(p, 0, 250), rec.Split(p, 250, 300), rec.Split(p, 550, 450)]
    got = [s.read()[:, 0].tolist() for s in parts]
    assert got == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]


def test_partition_file_round_trip(tmp_path):
    points = [b"\x00" * 10, b"JimGrayRIP", b"\xff" * 10]
    pt.write_partition_file(tmp_path / "p", points)
    assert (tmp_path / "p").read_bytes()[:11] == b"\x0a" + b"\x00" * 10
    assert pt.read_partition_file(tmp_path / "p") == points


def test_map_sort_partition_and_merge():
    rng = random.Random(4)
    keys = tricky_keys(rng, 2000)
    points = sorted(tricky_keys(rng, 3))
    halves = [as_records(keys[:1000]), as_records(keys[1000:])]
    per_map = [ts.map_sort_partition(h, points) for h in halves]
    for r in range(4):
        merged = ts.merge_segments([segs[r] for segs in per_map])
        got = [row[:10].tobytes() for row in merged]
        assert got == sorted(k for k in keys if bisect.bisect_right(points, k) == r)


@pytest.mark.parametrize("rows,maps,reduces", [(5000, 3, 4), (1, 1, 1), (20, 2, 7)])
def test_terasort_output_validates_with_teragens_checksum(tmp_path, rows, maps, reduces):
    gen = teragen(rows, tmp_path / "in", maps=maps)
    result = ts.terasort(tmp_path / "in", tmp_path / "out", reduces=reduces, split_bytes=40_000)
    assert result.records == rows
    assert teravalidate(tmp_path / "out") == [f"checksum\t{gen.checksum_hex}"]
    assert terachecksum(tmp_path / "out") == gen.checksum
    names = sorted(os.listdir(tmp_path / "out"))
    assert names == ["_SUCCESS", "_partition.lst"] + [f"part-r-{r:05d}" for r in range(reduces)]
    assert pt.read_partition_file(tmp_path / "out" / "_partition.lst") == result.split_points
    everything = b"".join((tmp_path / "in" / f"part-m-{m:05d}").read_bytes() for m in range(maps))
    want = sorted((everything[i:i + 100] for i in range(0, len(everything), 100)), key=lambda r: r[:10])
    got = b"".join((tmp_path / "out" / f"part-r-{r:05d}").read_bytes() for r in range(reduces))
    assert got == b"".join(want)


def test_terasort_needs_enough_sampled_keys(tmp_path):
    teragen(5, tmp_path / "in")
    with pytest.raises(pt.PartitionError, match=r"\(7 > 5\)"):
        ts.terasort(tmp_path / "in", tmp_path / "out", reduces=7)
    assert not (tmp_path / "out").exists()


def test_terasort_of_empty_input(tmp_path):
    teragen(0, tmp_path / "in", maps=2)
    result = ts.terasort(tmp_path / "in", tmp_path / "out", reduces=3)
    assert result.partition_records == [0, 0, 0]
    assert teravalidate(tmp_path / "out") == []


def test_failed_terasort_leaves_no_output(tmp_path, monkeypatch):
    teragen(100, tmp_path / "in")

    def broken(segments):
        raise RuntimeError("reduce crashed")
    monkeypatch.setattr(ts, "merge_segments", broken)
    with pytest.raises(RuntimeError, match="reduce crashed"):
        ts.terasort(tmp_path / "in", tmp_path / "out", reduces=2)
    assert sorted(os.listdir(tmp_path)) == ["in"]           # no output dir, no temporary dir


def test_terasort_bad_arguments(tmp_path):
    teragen(10, tmp_path / "in")
    with pytest.raises(ConfigError, match="reduce count"):
        ts.terasort(tmp_path / "in", tmp_path / "out", reduces=0)
    with pytest.raises(ConfigError, match="already exists"):
        ts.terasort(tmp_path / "in", tmp_path / "in", reduces=1)
    with pytest.raises(ConfigError, match="not a directory"):
        ts.terasort(tmp_path / "nope", tmp_path / "out")
