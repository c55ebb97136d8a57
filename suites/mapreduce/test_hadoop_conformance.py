"""The MapReduce conformance checks that hold for any stack, run on Apache Hadoop.

Selected with ``--hpcnet-target hadoop`` (the reference target's own jobs are checked by
test_conformance.py): Hadoop's TeraGen against the golden digests the reference is held to, TeraSort
output that TeraValidate accepts with TeraGen's checksum, TeraValidate catching a swapped record, and
Sort output that SortValidator accepts. One MiniCluster serves the whole session.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from pytest_hpcnet.targets.hadoop import jobs

pytestmark = pytest.mark.hadoop

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "teragen.toml"
# Hadoop's TeraGen always starts at row 0; the golden cases that do apply to it.
CASES = [c for c in tomllib.loads(GOLDEN.read_text())["case"] if c["start"] == 0 and c["rows"] > 0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"rows={c['rows']},maps={c['maps']}")
def test_teragen_matches_golden_digests(hadoop_target, tmp_path, case):
    rt, mc = hadoop_target
    result = jobs.teragen(rt, case["rows"], f"file://{tmp_path / 'gen'}", maps=case["maps"], conf_dir=mc.conf_dir)
    digests = [hashlib.sha256((tmp_path / "gen" / f"part-m-{i:05d}").read_bytes()).hexdigest()
               for i in range(case["maps"])]
    assert digests == case["sha256"]
    assert f"{result.details['checksum']:x}" == case["checksum"]


def test_terasort_output_validates_with_teragen_checksum(hadoop_target):
    rt, mc = hadoop_target
    gen = jobs.teragen(rt, 50_001, "/conformance/in", maps=3, conf_dir=mc.conf_dir)
    jobs.terasort(rt, "/conformance/in", "/conformance/out", reduces=3, conf_dir=mc.conf_dir)
    check = jobs.teravalidate(rt, "/conformance/out", "/conformance/report", conf_dir=mc.conf_dir)
    assert check.details["lines"] == [f"checksum\t{gen.details['checksum']:x}"]


def test_teravalidate_catches_a_swapped_record(hadoop_target, tmp_path):
    from pytest_hpcnet.reference.mapreduce.teragen import teragen as ref_teragen
    from pytest_hpcnet.reference.mapreduce.terasort import terasort as ref_terasort
    rt, mc = hadoop_target
    ref_teragen(20_000, tmp_path / "in", maps=2)
    ref_terasort(tmp_path / "in", tmp_path / "out", reduces=3)
    part = tmp_path / "out" / "part-r-00001"
    data = bytearray(part.read_bytes())
    data[500:600], data[600:700] = data[600:700], data[500:600]
    part.write_bytes(bytes(data))
    result = jobs.teravalidate(rt, f"file://{tmp_path / 'out'}", f"file://{tmp_path / 'report'}",
                               conf_dir=mc.conf_dir)
    assert not result.details["valid"]
    assert any("misorder" in line and "part-r-00001" in line for line in result.details["errors"])


def test_sort_job_output_validates(hadoop_target):
    rt, mc = hadoop_target
    jobs.randomwriter(rt, "/conformance/rw", 1 << 20, maps=2, conf_dir=mc.conf_dir)
    jobs.sort(rt, "/conformance/rw", "/conformance/sorted", reduces=3, conf_dir=mc.conf_dir)
    assert jobs.sortvalidate(rt, "/conformance/rw", "/conformance/sorted", conf_dir=mc.conf_dir).details["valid"]
