"""TeraGen against a slow reference written straight from the spec, and against frozen digests."""

from __future__ import annotations

import hashlib
import math
import tomllib
import zlib
from pathlib import Path

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference.mapreduce import teragen as tg
from pytest_hpcnet.reference.mapreduce.records import SUCCESS_MARKER

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "teragen.toml"

# --- the independent reference: plain ints, one LCG step per row, record laid out field by field ---

REF_A = 0x2360ED051FC65DA44385DF649FCCF645
REF_C = 0x4A696D47726179524950202020202001
REF_MOD = 1 << 128


def ref_state(n: int) -> int:
    """x(n) = C * (A^n - 1) / (A - 1) mod 2^128 (geometric series; A - 1 is even, so divide exactly
    over a modulus enlarged by A - 1). Independent of the library's skip-ahead by squaring."""
    big = (REF_A - 1) * REF_MOD
    return (REF_C * ((pow(REF_A, n, big) - 1) // (REF_A - 1))) % REF_MOD


def ref_record(row: int, rand: int) -> bytes:
    digits = f"{rand:032X}"
    return (rand.to_bytes(16, "big")[:10] + b"\x00\x11" + f"{row:032X}".encode() + b"\x88\x99\xaa\xbb"
            + b"".join(digits[20 + i].encode() * 4 for i in range(12)) + b"\xcc\xdd\xee\xff")


def ref_rows(first: int, count: int) -> bytes:
    x = ref_state(first + 1)
    out = []
    for row in range(first, first + count):
        out.append(ref_record(row, x))
        x = (REF_A * x + REF_C) % REF_MOD
    return b"".join(out)


def ref_split(total: int, maps: int, start: int) -> list[tuple[int, int]]:
    bounds = [0] + [math.ceil(total * (i + 1) / maps) for i in range(maps)]
    return [(start + bounds[i], bounds[i + 1] - bounds[i]) for i in range(maps)]


def ref_checksum(data: bytes) -> int:
    return sum(zlib.crc32(data[i:i + 100]) for i in range(0, len(data), 100)) % REF_MOD


CASES = tomllib.loads(GOLDEN.read_text())["case"]


def test_reference_state_matches_stepping():
    x = 0
    for n in range(1, 50):
        x = (REF_A * x + REF_C) % REF_MOD
        assert ref_state(n) == x


def test_row_zero_key_is_jim_gray_rip():
    first = next(tg.generate_rows(0, 1))
    assert first[0, :10].tobytes() == b"JimGrayRIP"
    assert ref_rows(0, 1)[:10] == b"JimGrayRIP"


@pytest.mark.parametrize("first,count", [(0, 1), (0, 1000), (123456789, 1000), (7, 70_000),
                                         (2**62, 3), (tg.MAX_ROW, 1)])
def test_fast_generator_matches_reference(first, count):
    fast = b"".join(block.tobytes() for block in tg.generate_rows(first, count))
    assert fast == ref_rows(first, count)


def test_skip_ahead_matches_geometric_series():
    for n in (0, 1, 2, 1000, 123456790, 2**40 + 17, 2**63):
        assert tg.random_state(n) == ref_state(n)


def _case_id(case):
    return f"rows={case['rows']},maps={case['maps']},start={case['start']}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_teragen_files_match_reference_and_golden(tmp_path, case):
    out = tmp_path / "out"
    result = tg.teragen(case["rows"], out, maps=case["maps"], start_row=case["start"])
    names = sorted(p.name for p in out.iterdir())
    assert names == [SUCCESS_MARKER] + [f"part-m-{i:05d}" for i in range(case["maps"])]
    digests = []
    for i, (first, count) in enumerate(ref_split(case["rows"], case["maps"], case["start"])):
        data = (out / f"part-m-{i:05d}").read_bytes()
        assert data == ref_rows(first, count), f"part {i} differs from the reference"
        digests.append(hashlib.sha256(data).hexdigest())
    assert digests == case["sha256"]
    everything = b"".join((out / f"part-m-{i:05d}").read_bytes() for i in range(case["maps"]))
    assert result.rows == case["rows"]
    assert result.checksum == ref_checksum(everything)
    assert result.checksum_hex == case["checksum"]


def test_golden_covers_the_required_cases():
    keys = {(c["rows"], c["start"], c["maps"]) for c in CASES}
    assert {(1000, 0, 1), (1000, 123456789, 1), (1, 0, 1)} <= keys
    assert any(c["rows"] % c["maps"] for c in CASES)          # maps that don't divide the rows
    assert any(c["maps"] > c["rows"] for c in CASES)          # some maps get no rows


@pytest.mark.parametrize("total,maps", [(0, 1), (1, 1), (1, 4), (10, 3), (1000, 7), (999_999_999, 13)])
def test_split_ranges_cover_rows_in_order(total, maps):
    ranges = tg.split_ranges(total, maps, start_row=5)
    assert ranges == ref_split(total, maps, 5)
    assert sum(c for _, c in ranges) == total


def test_split_ranges_use_double_precision_like_java():
    # 2^53 + 1 rows is not representable as a double: Java's ceil(total * 1.0 / 1) gives 2^53
    total = 2**53 + 1
    ranges = tg.split_ranges(total, 1)
    assert ranges == [(0, 2**53)]


def test_teragen_split_equals_slice_of_whole(tmp_path):
    whole = ref_rows(0, 100)
    parts = [b"".join(b.tobytes() for b in tg.teragen_split(100, i, 3)) for i in range(3)]
    assert b"".join(parts) == whole
    result = tg.write_teragen_split(tmp_path / "p", 100, 1, 3)
    assert (tmp_path / "p").read_bytes() == parts[1]
    assert result.rows == 33 and result.checksum == ref_checksum(parts[1])


@pytest.mark.parametrize("kwargs,where", [
    (dict(rows=-1, maps=1), "rows"), (dict(rows=10, maps=0), "maps"),
    (dict(rows=10, maps=1, start_row=-3), "start"), (dict(rows=2, maps=1, start_row=tg.MAX_ROW), "teragen")])
def test_bad_arguments_raise_config_error(tmp_path, kwargs, where):
    with pytest.raises(ConfigError) as e:
        tg.teragen(outdir=tmp_path / "o", **kwargs)
    assert e.value.where == where
    assert not (tmp_path / "o").exists()


def test_existing_output_dir_is_refused(tmp_path):
    (tmp_path / "o").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        tg.teragen(10, tmp_path / "o")


def test_one_million_rows_checksum_matches_published_hadoop_runs():
    # Hadoop's TeraValidate prints "checksum<TAB>7a27e2d0d55de" for `teragen 1000000` (100 MB); the
    # value appears in public course scripts and run logs that check real Hadoop clusters.
    total = sum(tg.record_checksum(block) for block in tg.generate_rows(0, 1_000_000))
    assert format(total % 2**128, "x") == "7a27e2d0d55de"
