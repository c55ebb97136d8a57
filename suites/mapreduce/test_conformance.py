"""Conformance of the MapReduce tools run as jobs on the cluster: TeraGen's bytes, TeraValidate's
verdicts, TeraSort and Sort output that validates, empty input."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from pytest_hpcnet.cluster.model import cross_host_reason
from pytest_hpcnet.reference.mapreduce import sortvalidate
from pytest_hpcnet.reference.mapreduce.engine.config import parse_config
from pytest_hpcnet.reference.mapreduce.engine import jobs
from pytest_hpcnet.reference.mapreduce.records import SUCCESS_MARKER

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "teragen.toml"
CASES = tomllib.loads(GOLDEN.read_text())["case"]
CONFIGS = ["transport=tcp,intermediate=local,shuffle=fetch", "transport=shm,intermediate=local,shuffle=fetch",
           "transport=tcp,intermediate=shared,shuffle=fetch", "transport=shm,intermediate=shared,shuffle=direct"]


def _id(case):
    return f"rows={case['rows']},start={case['start']},maps={case['maps']}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_teragen_job_matches_golden_digests(engine, shared_dir, case):
    """Digests derived from the spec by an independent generator (fixtures/golden/teragen.toml); the
    cases include 1 row and map counts that do not divide the rows."""
    out = shared_dir / "gen"
    result = jobs.teragen(engine, case["rows"], out, maps=case["maps"], start_row=case["start"])
    digests = [hashlib.sha256((out / f"part-m-{i:05d}").read_bytes()).hexdigest() for i in range(case["maps"])]
    assert digests == case["sha256"]
    assert result.details["checksum"] == case["checksum"] and result.records == case["rows"]
    assert (out / SUCCESS_MARKER).exists()
    if case["start"] == 0 and case["rows"]:
        assert (out / "part-m-00000").read_bytes()[:10] == b"JimGrayRIP"


@pytest.mark.parametrize("config", CONFIGS)
def test_terasort_output_validates_with_teragen_checksum(engine, shared_dir, config, needs_one_host):
    needs_one_host(parse_config(config).transport)
    gen = jobs.teragen(engine, 50_001, shared_dir / "in", maps=3)
    result = jobs.terasort(engine, shared_dir / "in", shared_dir / "out", reduces=5, config=config, maps=7)
    check = jobs.teravalidate(engine, shared_dir / "out", shared_dir / "report")
    assert check.details["lines"] == [f"checksum\t{gen.details['checksum']}"]
    assert result.records == 50_001 and len(result.details["partition_records"]) == 5
    assert (shared_dir / "report" / "part-r-00000").read_text() == f"checksum\t{gen.details['checksum']}\n"


@pytest.fixture
def sorted_output(engine, shared_dir):
    jobs.teragen(engine, 20_000, shared_dir / "in", maps=2)
    jobs.terasort(engine, shared_dir / "in", shared_dir / "out", reduces=3)
    return shared_dir / "out"


def test_teravalidate_catches_a_swapped_record(engine, sorted_output):
    part = sorted_output / "part-r-00001"
    data = bytearray(part.read_bytes())
    data[500:600], data[600:700] = data[600:700], data[500:600]
    part.write_bytes(bytes(data))
    lines = jobs.teravalidate(engine, sorted_output).details["lines"]
    errors = [line for line in lines if line.startswith("error\t")]
    assert len(errors) == 1 and "misorder in part-r-00001 between" in errors[0]
    assert lines[0].startswith("checksum\t")     # still reported (it does not depend on order), sorted first


def test_teravalidate_catches_a_mispartitioned_file(engine, sorted_output):
    a, b = sorted_output / "part-r-00000", sorted_output / "part-r-00002"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    result = jobs.teravalidate(engine, sorted_output)
    assert not result.details["valid"]
    assert any("bad key partitioning" in line for line in result.details["lines"])


def test_sort_job_output_validates(engine, shared_dir, cluster):
    transport = "shm" if cross_host_reason("shm", cluster.nodes) is None else "tcp"   # netns: tcp
    jobs.randomwriter(engine, shared_dir / "in", 2 << 20, maps=3, seed=11)
    result = jobs.sort(engine, shared_dir / "in", shared_dir / "out", reduces=4, config=f"transport={transport}")
    check = sortvalidate.sortvalidate(shared_dir / "in", shared_dir / "out")
    assert check.ok, check.lines
    assert check.lines == [sortvalidate.SUCCESS_LINE] and result.records == check.input_stats.records


def test_empty_input_is_handled(engine, shared_dir):
    jobs.teragen(engine, 0, shared_dir / "in", maps=2)
    result = jobs.terasort(engine, shared_dir / "in", shared_dir / "out", reduces=2)
    assert result.records == 0 and (shared_dir / "out" / SUCCESS_MARKER).exists()
    assert jobs.teravalidate(engine, shared_dir / "out").details["lines"] == []   # Hadoop's empty report
    jobs.randomwriter(engine, shared_dir / "kv", 0, maps=2)
    jobs.sort(engine, shared_dir / "kv", shared_dir / "kv-out", reduces=2)
    assert sortvalidate.sortvalidate(shared_dir / "kv", shared_dir / "kv-out").ok
