"""Job time per configuration on the embedded cluster, in paired rounds, with the phase breakdown
(sample / map / shuffle / reduce) recorded as measurements, and the suite's local claims checked.

Each test runs one (job, baseline, candidate) pair named by the local claims in claims.toml and
evaluates every local claim on that pair, so the claims file stays the one place configurations are
named. Input is small (TeraSort 200k rows = 20 MB, Sort 8 MiB) so the suite fits CI's budget.
"""

from __future__ import annotations

import pytest

from pytest_hpcnet.claims import load_claims
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.mapreduce.engine.config import parse_config
from pytest_hpcnet.workloads import mapreduce as wm

from .mapreduce_pairs import CLAIMS_FILE, PairRun, job_of

TERASORT_ROWS = 200_000
SORT_BYTES = 8 << 20
# the merge claim compares implementations, not engine configurations: test_native_merge_cost has it
LOCAL = [c for c in load_claims([CLAIMS_FILE]).values() if c.is_local and c.metric != wm.MERGE_METRIC]
MERGE_CLAIM = "mapreduce.local.terasort.native_vs_python.merge"
MERGE_ROUNDS = 30
PAIRS = sorted({(job_of(c), c.baseline, c.candidate) for c in LOCAL})


@pytest.fixture(scope="module")
def inputs(engine, cluster, tmp_path_factory):
    if cluster.shared is None:
        pytest.skip(f"cluster {cluster.source} has no shared dir for job input")
    made = {}

    def get(job):
        if job not in made:
            made[job] = wm.prepare_input(engine, job, cluster.shared, rows=TERASORT_ROWS, sort_bytes=SORT_BYTES)
        return made[job]
    return get


@pytest.mark.parametrize("job,baseline,candidate", PAIRS, ids=[f"{j}:{b}..{c}" for j, b, c in PAIRS])
def test_local_claims(engine, inputs, shared_dir, measure, claim, job, baseline, candidate, needs_one_host):
    for config in (baseline, candidate):
        needs_one_host(parse_config(config).transport)
    inp = inputs(job)
    run = PairRun(engine, measure, inp, baseline, candidate, shared_dir, reduces=len(engine.workers))
    try:
        claims = [c for c in LOCAL if (job_of(c), c.baseline, c.candidate) == (job, baseline, candidate)]
        for c in claims:
            claim(c.id, run.paired(c.metric))
    finally:
        run.record()
    for phase_name in ("map", "shuffle", "reduce"):
        assert all(r.phases[phase_name] >= 0 for r in run.base.results + run.cand.results)
    assert all(r.records == inp.records for r in run.base.results + run.cand.results)


def test_native_merge_cost(measure, claim):
    """The reduce's merge alone, the compiled core's against numpy's, on the same runs (400k records in
    16 runs), taking turns merge by merge in fresh processes, in CPU seconds (see
    ``wm.interleaved_merge_cost``): the design effect of the native merge, an enforced gate (`make
    canary` injects 20% into it)."""
    if not native.AVAILABLE:
        claim(MERGE_CLAIM, None, unavailable=native.WHY_NOT)
    paired = wm.interleaved_merge_cost(rounds=MERGE_ROUNDS)
    try:
        claim(MERGE_CLAIM, paired)
    finally:
        measure.record(*(measurement(wm.MERGE_METRIC, samples, unit="s", direction="lower", config=name,
                                     nodes=("test-process",),
                                     params={"records": wm.MERGE_RECORDS, "runs": wm.MERGE_RUNS, "processes": wm.MERGE_PROCESSES,
                                             "per_round": f"min of {wm.MERGE_TRIES}", "clock": "thread CPU time"})
                         for name, samples in ((paired.baseline_name, paired.baseline),
                                               (paired.candidate_name, paired.candidate))))
