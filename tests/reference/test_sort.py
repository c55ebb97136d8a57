"""RandomWriter, the hash-partitioned sort and SortValidator."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference.mapreduce import randomwriter as rw
from pytest_hpcnet.reference.mapreduce import sort as so
from pytest_hpcnet.reference.mapreduce.records import RecordFormatError
from pytest_hpcnet.reference.mapreduce.sortvalidate import SUCCESS_LINE, sortvalidate


def java_hash_bytes(data: bytes) -> int:
    """WritableComparator.hashBytes, step by step in Java int arithmetic."""
    h = 1
    for b in data:
        h = (31 * h + (b - 256 if b > 127 else b)) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize("key", [b"", b"a", b"\x80\xff\x7f", bytes(range(256)) * 4, os.urandom(999)])
def test_bytes_hash_matches_java(key):
    assert so.bytes_hash(key) == java_hash_bytes(key)


def test_framed_format_round_trip_and_errors(tmp_path):
    records = [(b"", b""), (b"k", b"\x00" * 5), (b"\xff" * 300, b"")]
    rw.write_records(tmp_path / "f", records)
    data = (tmp_path / "f").read_bytes()
    assert data[:8] == b"HPCNKV1\n" and data[8:16] == b"\x00\x00\x00\x00\x00\x00\x00\x00"
    assert rw.read_records(tmp_path / "f") == records
    with pytest.raises(RecordFormatError, match="bad magic"):
        rw.decode_records(b"garbage!" + data[8:])
    with pytest.raises(RecordFormatError, match="past the end"):
        rw.decode_records(data[:-1])
    with pytest.raises(RecordFormatError, match="truncated record header"):
        rw.decode_records(data[:12])


def test_randomwriter_is_seeded_and_sized(tmp_path):
    a = rw.randomwriter(tmp_path / "a", 300_000, maps=3, seed=7)
    b = rw.randomwriter(tmp_path / "b", 300_000, maps=3, seed=7)
    c = rw.randomwriter(tmp_path / "c", 300_000, maps=3, seed=8)
    files = lambda d: [(d / f"part-m-{i:05d}").read_bytes() for i in range(3)]  # noqa: E731
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert files(tmp_path / "a") != files(tmp_path / "c")
    assert (tmp_path / "a" / "_SUCCESS").exists()
    records = [r for i in range(3) for r in rw.read_records(tmp_path / "a" / f"part-m-{i:05d}")]
    assert len(records) == a.records and a.records == b.records
    assert a.bytes == sum(len(k) + len(v) for k, v in records)
    assert all(10 <= len(k) < 1000 and 0 <= len(v) < 20000 for k, v in records)
    assert 300_000 <= a.bytes < 300_000 + 3 * (1000 + 20000)     # each map overshoots by < 1 record


def test_randomwriter_map_task_equals_its_file(tmp_path):
    rw.randomwriter(tmp_path / "out", 50_000, maps=2, seed=1, key_range=(10, 11), value_range=(90, 91))
    part = rw.write_random_split(tmp_path / "p1", 50_000, 1, 2, seed=1, key_range=(10, 11), value_range=(90, 91))
    assert (tmp_path / "p1").read_bytes() == (tmp_path / "out" / "part-m-00001").read_bytes()
    assert part.records == 250                       # 25000 bytes of 100-byte records


def test_randomwriter_bad_arguments(tmp_path):
    with pytest.raises(ConfigError, match="byte count"):
        rw.randomwriter(tmp_path / "o", -1)
    with pytest.raises(ConfigError, match="map count"):
        rw.randomwriter(tmp_path / "o", 10, maps=0)
    with pytest.raises(ConfigError, match="min <= max"):
        rw.randomwriter(tmp_path / "o", 10, key_range=(5, 2))
    with pytest.raises(ConfigError, match="never finish"):
        rw.randomwriter(tmp_path / "o", 10, key_range=(0, 0), value_range=(0, 0))
    assert not (tmp_path / "o").exists()


@pytest.fixture
def sorted_pair(tmp_path) -> tuple[Path, Path]:
    rw.randomwriter(tmp_path / "in", 400_000, maps=3, seed=3, key_range=(1, 40), value_range=(0, 3000))
    so.sort(tmp_path / "in", tmp_path / "out", reduces=3)
    return tmp_path / "in", tmp_path / "out"


def test_round_trip_validates(sorted_pair):
    indir, outdir = sorted_pair
    result = sortvalidate(indir, outdir)
    assert result.ok and result.lines == [SUCCESS_LINE]
    assert SUCCESS_LINE == "SUCCESS! Validated the MapReduce framework's 'sort' successfully."
    for r in range(3):
        records = rw.read_records(outdir / f"part-r-{r:05d}")
        assert [k for k, _ in records] == sorted(k for k, _ in records)
        assert {so.hash_partition(k, 3) for k, _ in records} <= {r}


def test_sort_equals_python_sort(sorted_pair):
    indir, outdir = sorted_pair
    inputs = [r for i in range(3) for r in rw.read_records(indir / f"part-m-{i:05d}")]
    outputs = [r for i in range(3) for r in rw.read_records(outdir / f"part-r-{i:05d}")]
    assert sorted(inputs) == sorted(outputs)


def _rewrite(path: Path, change) -> None:
    records = rw.read_records(path)
    change(records)
    rw.write_records(path, records)


def test_dropped_record_is_caught(sorted_pair):
    indir, outdir = sorted_pair
    _rewrite(outdir / "part-r-00001", lambda recs: recs.pop(5))
    result = sortvalidate(indir, outdir)
    assert not result.ok
    assert any(line.startswith("FAILED: records differ") for line in result.lines)


def test_altered_value_byte_is_caught(sorted_pair):
    indir, outdir = sorted_pair

    def flip(recs):
        i = next(i for i, (_, v) in enumerate(recs) if v)
        k, v = recs[i]
        recs[i] = (k, bytes([v[0] ^ 1]) + v[1:])
    _rewrite(outdir / "part-r-00002", flip)
    result = sortvalidate(indir, outdir)
    assert not result.ok
    assert [line.split(":")[1].strip().split(" differ")[0] for line in result.lines] == [
        "record hash XOR", "record hash sum"]           # counts and byte totals still agree


def test_misorder_is_caught(sorted_pair):
    indir, outdir = sorted_pair

    def swap(recs):
        i = next(i for i in range(len(recs) - 1) if recs[i][0] < recs[i + 1][0])
        recs[i], recs[i + 1] = recs[i + 1], recs[i]
    _rewrite(outdir / "part-r-00000", swap)
    lines = sortvalidate(indir, outdir).lines
    assert len(lines) == 1 and lines[0].startswith("FAILED: part-r-00000: record ") and "out of order" in lines[0]


def test_record_in_wrong_partition_is_caught(sorted_pair):
    indir, outdir = sorted_pair
    moved = rw.read_records(outdir / "part-r-00000")
    _rewrite(outdir / "part-r-00000", lambda recs: recs.clear())
    _rewrite(outdir / "part-r-00001", lambda recs: (recs.extend(moved), recs.sort(key=lambda r: r[0])))
    lines = sortvalidate(indir, outdir).lines
    assert len(lines) == 1 and "belongs to partition 0, not 1" in lines[0]


def test_duplicated_pair_caught_by_counts(sorted_pair):
    indir, outdir = sorted_pair
    _rewrite(outdir / "part-r-00001", lambda recs: recs.insert(0, recs[0]))
    assert not sortvalidate(indir, outdir).ok


def test_empty_input_sorts_and_validates(tmp_path):
    rw.randomwriter(tmp_path / "in", 0, maps=2)
    result = so.sort(tmp_path / "in", tmp_path / "out", reduces=2)
    assert result.partition_records == [0, 0]
    assert sortvalidate(tmp_path / "in", tmp_path / "out").lines == [SUCCESS_LINE]


def test_failed_sort_leaves_no_output(tmp_path, monkeypatch):
    rw.randomwriter(tmp_path / "in", 10_000)
    monkeypatch.setattr(so, "merge_sorted", lambda segments: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        so.sort(tmp_path / "in", tmp_path / "out", reduces=2)
    assert sorted(os.listdir(tmp_path)) == ["in"]
