"""TeraValidate: Hadoop's report lines for valid data, misorder, bad partitioning and empty input."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference.mapreduce import teravalidate as tv
from pytest_hpcnet.reference.mapreduce.records import RecordFormatError
from pytest_hpcnet.reference.mapreduce.teragen import teragen


def records_of(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[i:i + 100] for i in range(0, len(data), 100)]


def write_records(path: Path, records: list[bytes]) -> None:
    path.write_bytes(b"".join(records))


def crc_sum_hex(records: list[bytes]) -> str:
    return format(sum(zlib.crc32(r) for r in records) % 2**128, "x")


def spaced_hex(key: bytes) -> str:
    return " ".join(f"{b:02x}" for b in key)


@pytest.fixture
def sorted_dir(tmp_path) -> tuple[Path, list[bytes]]:
    """Three files of TeraGen rows sorted by plain Python: a valid TeraSort output."""
    teragen(900, tmp_path / "gen", maps=2)
    rows = sorted((r for p in sorted((tmp_path / "gen").glob("part-m-*")) for r in records_of(p)),
                  key=lambda r: r[:10])
    out = tmp_path / "sorted"
    out.mkdir()
    for i in range(3):
        write_records(out / f"part-r-{i:05d}", rows[i * 300:(i + 1) * 300])
    (out / "_SUCCESS").touch()
    return out, rows


def test_valid_output_gives_exactly_the_checksum_line(sorted_dir, tmp_path):
    out, rows = sorted_dir
    lines = tv.teravalidate(out, tmp_path / "report")
    assert lines == [f"checksum\t{crc_sum_hex(rows)}"]
    assert (tmp_path / "report" / "part-r-00000").read_text() == f"checksum\t{crc_sum_hex(rows)}\n"
    assert (tmp_path / "report" / "_SUCCESS").exists()
    assert tv.is_valid_report(lines)


def test_checksum_equals_teragen_and_terachecksum(tmp_path):
    gen = teragen(1234, tmp_path / "gen", maps=3)
    assert tv.terachecksum(tmp_path / "gen") == gen.checksum
    all_rows = [r for p in sorted((tmp_path / "gen").glob("part-m-*")) for r in records_of(p)]
    assert gen.checksum_hex == crc_sum_hex(all_rows)


def test_swapped_record_is_reported_as_misorder(sorted_dir):
    out, rows = sorted_dir
    part = out / "part-r-00001"
    recs = records_of(part)
    recs[10], recs[11] = recs[11], recs[10]
    write_records(part, recs)
    lines = tv.teravalidate(out)
    assert lines == [f"checksum\t{crc_sum_hex(rows)}",           # content unchanged: same checksum
                     f"error\tmisorder in part-r-00001 between {spaced_hex(recs[10][:10])} and "
                     f"{spaced_hex(recs[11][:10])}"]
    assert not tv.is_valid_report(lines)


def test_mispartitioned_files_are_reported(sorted_dir):
    out, rows = sorted_dir
    a, b = out / "part-r-00000", out / "part-r-00001"
    a_recs, b_recs = records_of(a), records_of(b)
    write_records(a, b_recs)   # each file is still sorted, but file 0 now holds the larger keys
    write_records(b, a_recs)
    lines = tv.teravalidate(out)
    assert lines == [
        f"checksum\t{crc_sum_hex(rows)}",
        "error\tbad key partitioning:\n"
        f"  file part-r-00000:end key {spaced_hex(b_recs[-1][:10])}\n"
        f"  file part-r-00001:begin key {spaced_hex(a_recs[0][:10])}",
    ]    # file 1 (now the smallest keys) still ends below file 2's first key: one violation


def test_misorder_across_read_blocks_is_found(sorted_dir, monkeypatch):
    monkeypatch.setattr(tv, "READ_BLOCK_RECORDS", 7)
    out, _ = sorted_dir
    part = out / "part-r-00002"
    recs = records_of(part)
    recs[13], recs[14] = recs[14], recs[13]          # records 13|14 straddle the 7-record blocks
    write_records(part, recs)
    errors = [line for line in tv.teravalidate(out) if line.startswith("error")]
    assert errors == [f"error\tmisorder in part-r-00002 between {spaced_hex(recs[13][:10])} and "
                      f"{spaced_hex(recs[14][:10])}"]


def test_unsigned_key_order(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    low, high = b"\x7f" + b"\x00" * 99, b"\x80" + b"\x00" * 99   # signed compare would call this misorder
    write_records(d / "part-r-00000", [low, high])
    assert tv.teravalidate(d) == [f"checksum\t{crc_sum_hex([low, high])}"]
    write_records(d / "part-r-00000", [high, low])
    assert tv.teravalidate(d)[1] == f"error\tmisorder in part-r-00000 between 80 {'00 ' * 8}00 and 7f {'00 ' * 8}00"


def test_empty_input_gives_empty_report(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    assert tv.teravalidate(d, tmp_path / "r1") == []
    (d / "part-r-00000").touch()
    (d / "part-r-00001").touch()
    assert tv.teravalidate(d, tmp_path / "r2") == []
    assert (tmp_path / "r2" / "part-r-00000").read_text() == ""
    assert tv.terachecksum(d) == 0


def test_empty_file_between_others_is_skipped_in_partition_check(sorted_dir):
    out, rows = sorted_dir
    (out / "part-r-00001").write_bytes(b"")
    assert tv.teravalidate(out) == [f"checksum\t{crc_sum_hex(rows[:300] + rows[600:])}"]


def test_hidden_files_are_ignored(sorted_dir):
    out, rows = sorted_dir
    (out / "_partition.lst").write_bytes(b"\x0arandombyte")
    (out / ".part-r-00000.crc").write_bytes(b"xyz")
    assert tv.teravalidate(out) == [f"checksum\t{crc_sum_hex(rows)}"]


def test_partial_record_is_an_error(sorted_dir):
    out, _ = sorted_dir
    with open(out / "part-r-00002", "ab") as f:
        f.write(b"x" * 37)
    with pytest.raises(RecordFormatError, match="part-r-00002"):
        tv.teravalidate(out)


def test_missing_dir_and_existing_report_dir(tmp_path, sorted_dir):
    with pytest.raises(ConfigError, match="not a directory"):
        tv.teravalidate(tmp_path / "missing")
    out, _ = sorted_dir
    (tmp_path / "rep").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        tv.teravalidate(out, tmp_path / "rep")


def test_checksum_formatting_has_no_leading_zeros():
    f = tv.FileValidation("part-r-00000", records=1, first_key=b"a" * 10, last_key=b"a" * 10, checksum=0x0abc)
    assert tv.reduce_validations([f]) == ["checksum\tabc"]
