"""Conformance of the MapReduce tools on the target under test (``--hpcnet-target``: the reference
engine, or Apache Hadoop's own programs on a MiniCluster): TeraGen's bytes against golden digests,
TeraSort output that TeraValidate accepts with TeraGen's checksum, TeraValidate catching a swapped
record and a mispartitioned file, Sort output that SortValidator accepts, empty input.

Written once against the ``target`` fixture's workloads; a workload the target lacks skips, naming it.
``scratch.local(name)`` is a directory here (the tests read and change its files), ``scratch.path(name)``
a place on the target's own file system.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from pytest_hpcnet.reference.mapreduce.records import SUCCESS_MARKER
from pytest_hpcnet.reference.mapreduce.teragen import teragen as ref_teragen
from pytest_hpcnet.reference.mapreduce.terasort import terasort as ref_terasort

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "teragen.toml"
CASES = tomllib.loads(GOLDEN.read_text())["case"]


def _id(case):
    return f"rows={case['rows']},start={case['start']},maps={case['maps']}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_teragen_job_matches_golden_digests(target, scratch, case):
    """Digests derived from the spec by an independent generator (fixtures/golden/teragen.toml); the
    cases include 1 row and map counts that do not divide the rows."""
    out = scratch.local("gen")
    result = target.teragen(case["rows"], out, maps=case["maps"], start_row=case["start"])
    digests = [hashlib.sha256((out / f"part-m-{i:05d}").read_bytes()).hexdigest() for i in range(case["maps"])]
    assert digests == case["sha256"]
    assert result.details["checksum"] == case["checksum"] and result.records == case["rows"]
    assert (out / SUCCESS_MARKER).exists()
    if case["start"] == 0 and case["rows"]:
        assert (out / "part-m-00000").read_bytes()[:10] == b"JimGrayRIP"


def test_terasort_output_validates_with_teragen_checksum(target, scratch, target_config):
    gen = target.teragen(50_001, scratch.path("in"), maps=3)
    result = target.terasort(scratch.path("in"), scratch.path("out"), reduces=3, config=target_config, maps=7)
    check = target.teravalidate(scratch.path("out"), scratch.path("report"))
    assert check.details["lines"] == [f"checksum\t{gen.details['checksum']}"] and check.details["valid"]
    assert result.records == 50_001


@pytest.fixture
def sorted_output(scratch):
    """TeraSort output made here by the single-process reference tools: the data the validator is shown."""
    ref_teragen(20_000, scratch.local("in"), maps=2)
    ref_terasort(scratch.local("in"), scratch.local("out"), reduces=3)
    return scratch.local("out")


def test_teravalidate_catches_a_swapped_record(target, scratch, sorted_output):
    part = sorted_output / "part-r-00001"
    data = bytearray(part.read_bytes())
    data[500:600], data[600:700] = data[600:700], data[500:600]
    part.write_bytes(bytes(data))
    result = target.teravalidate(sorted_output, scratch.local("report"))
    errors = [line for line in result.details["lines"] if line.startswith("error\t")]
    assert not result.details["valid"]
    assert len(errors) == 1 and "misorder in part-r-00001 between" in errors[0]


def test_teravalidate_catches_a_mispartitioned_file(target, scratch, sorted_output):
    a, b = sorted_output / "part-r-00000", sorted_output / "part-r-00002"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    result = target.teravalidate(sorted_output, scratch.local("report"))
    assert not result.details["valid"]
    assert any("bad key partitioning" in line for line in result.details["lines"])


def test_sort_job_output_validates(target, scratch):
    target.randomwriter(scratch.path("in"), 1 << 20, maps=2)
    target.sort(scratch.path("in"), scratch.path("out"), reduces=3)
    check = target.sortvalidate(scratch.path("in"), scratch.path("out"))
    assert check.details["valid"], check.details["lines"]


def test_empty_input_is_handled(target, scratch):
    target.teragen(0, scratch.local("in"), maps=2)
    result = target.terasort(scratch.local("in"), scratch.local("out"), reduces=2)
    assert result.records == 0 and (scratch.local("out") / SUCCESS_MARKER).exists()
    assert target.teravalidate(scratch.local("out"), scratch.local("report")).details["lines"] == []
    target.randomwriter(scratch.local("kv"), 0, maps=2)
    target.sort(scratch.local("kv"), scratch.local("kv-out"), reduces=2)
    assert target.sortvalidate(scratch.local("kv"), scratch.local("kv-out")).details["valid"]
