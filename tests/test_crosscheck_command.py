"""``hpcnet crosscheck --target reference``: the command end to end on a local:2 cluster of its own
(small TeraGen and TeraSort jobs, seconds): the per-job table in run order, the per-configuration
summary and one verdict per metric. Hadoop's side runs in suites/crosscheck (marker ``hadoop``)."""

from __future__ import annotations

import re

import pytest

from pytest_hpcnet.cli import main as hpcnet_main
from pytest_hpcnet.report.crosscheck import METRICS, read_verdict

BASELINE, CANDIDATE = "transport=tcp,intermediate=local", "transport=tcp,intermediate=shared"


@pytest.mark.parametrize("job", ["teragen", "terasort"])
def test_crosscheck_on_the_reference_prints_records_and_verdicts(capsys, tmp_path, job):
    code = hpcnet_main(["crosscheck", "--target", "reference", "--cluster", "local:2", "--workdir", str(tmp_path),
                        "--config", BASELINE, "--config", CANDIDATE, "--repeat", "2", "--", job, "1M"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [ln.split() for ln in out.splitlines() if re.match(rf"^transport=\S+\s+\d\s+{job}-[0-9a-f]{{8}}\s", ln)]
    assert [(r[0], r[1]) for r in rows] == [(BASELINE, "0"), (CANDIDATE, "0"), (BASELINE, "1"), (CANDIDATE, "1")]
    assert all(r[3:5] == ["FINISHED", "SUCCEEDED"] and float(r[6]) > 0 and r[7] == "-" for r in rows)
    assert "elapsed median (ms)" in out and "vcoreSeconds median" in out
    verdicts = [v for v in map(read_verdict, out.splitlines()) if v]
    assert [(v["candidate"], v["baseline"], v["metric"], v["n"]) for v in verdicts] == \
        [(CANDIDATE, BASELINE, m, 2) for m in METRICS]
    assert all(v["consistent"] for v in verdicts), out
    assert not list(tmp_path.rglob("part-*")), "the runs' outputs were left behind"
