"""The crosscheck workload and its report on the target under test (``--hpcnet-target``): two
configurations, two interleaved rounds, one per-job record per run in YARN's shape, and the paired
verdicts. Written once against the ``target`` fixture; a target without per-job records skips, naming
the workload. Job times are recorded as measurements (information: no absolute-time asserts).

``make hadoop-target`` leaves out the four-job crosscheck on Hadoop: the main run's
``test_hadoop.py`` runs the same workload there through ``hpcnet crosscheck --conf-dir`` (about two
minutes of JVMs, once per CI, not twice); the one-job record test runs in both.
"""

from __future__ import annotations

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.report.crosscheck import METRICS, read_verdict, report
from pytest_hpcnet.targets import JobRecord

ROWS = 10_000           # 1 MB of TeraGen rows: the job's own work is small beside a stack's start-up
ROUNDS = 2

# Per target, two configurations that differ in a setting the job goes through, and the job. The
# reference's differ in where map output lives (TeraSort's shuffle reads it; TeraGen is map-only and
# untouched by the engine's settings); Hadoop's in whether a small job runs inside the AM's JVM. Hadoop
# runs TeraGen: every job there costs JVM start-ups, and TeraSort would add an untimed TeraGen.
PLANS = {
    "reference": (("transport=tcp,intermediate=local", "transport=tcp,intermediate=shared"), "terasort"),
    "hadoop": (("default", "uber=off"), "teragen"),
}


@pytest.fixture
def plan(target):
    if not target.offers("crosscheck"):
        pytest.skip(str(target.missing("crosscheck", "it keeps no per-job record")))
    configs, job = PLANS.get(target.name, (tuple(target.sample_configs()[:2]), "teragen"))
    if len(set(configs)) < 2:
        pytest.skip(f"target {target.name!r} names fewer than two configurations to crosscheck")
    return list(configs), job


def test_a_job_leaves_a_record_in_yarns_shape(target, plan, scratch):
    result = target.teragen(ROWS, scratch.path("gen"), maps=2)
    record = target.job_record(result)
    assert isinstance(record, JobRecord) and record.id
    assert (record.state, record.finalStatus) == ("FINISHED", "SUCCEEDED")
    assert record.elapsedTime > 0 and record.vcoreSeconds > 0
    assert record.memorySeconds is None or record.memorySeconds > 0


def test_crosscheck_interleaves_records_and_judges(target, plan, measure):
    configs, job = plan
    runs = target.crosscheck(configs, ROUNDS, (job, ROWS))
    assert [(r.config, r.round) for r in runs] == [(c, i) for i in range(ROUNDS) for c in configs]
    assert len({r.record.id for r in runs}) == len(runs), "two runs share a job id"
    for r in runs:
        assert (r.record.state, r.record.finalStatus) == ("FINISHED", "SUCCEEDED")
        assert r.record.elapsedTime > 0 and r.record.vcoreSeconds > 0 and r.wall_s > 0
    text, succeeded = report(runs, configs)
    assert succeeded and "elapsed median (ms)" in text
    verdicts = [v for v in map(read_verdict, text.splitlines()) if v]
    assert [(v["candidate"], v["baseline"], v["metric"], v["n"]) for v in verdicts] == \
        [(configs[1], configs[0], m, ROUNDS) for m in METRICS]
    # Either word may come out of two rounds; what must hold is that the word follows from the figures
    assert all(v["consistent"] for v in verdicts), text
    params = {"rows": ROWS}
    for c in configs:
        mine = [r.record for r in runs if r.config == c]
        measure.record(
            measurement(f"crosscheck.{job}.elapsed", [m.elapsedTime / 1000 for m in mine], unit="s",
                        direction="lower", config=f"{target.name},{c}", params=params),
            measurement(f"crosscheck.{job}.vcore_seconds", [m.vcoreSeconds for m in mine], unit="vcore-s",
                        direction="lower", config=f"{target.name},{c}", params=params))


def test_crosscheck_refuses_an_unknown_configuration_before_any_job(target, plan):
    configs, job = plan
    with pytest.raises(ConfigError, match="carrier") as info:
        target.crosscheck([configs[0], f"{configs[0]},carrier=on"], ROUNDS, (job, ROWS))
    assert "\n" not in str(info.value)
