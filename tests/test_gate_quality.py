"""Verdict quality of every real local gate, under the noise of recorded runs (pytest_hpcnet.gate_quality).

The records in fixtures/gate-runs/ are run records of `make test` on a 2-core box (each claim's verdict
keeps the samples it judged). Every enforced local gate must false-fail at most 1% and warn at most
10% of runs with no regression, and catch (FAIL) at least 95% of 20% regressions; the rate at 10% is
reported. Report-only claims are measured and printed, not held to the targets.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pytest_hpcnet import gate_quality as gq
from pytest_hpcnet.claims import Claim, load_claims

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted((ROOT / "fixtures" / "gate-runs").glob("*.json"))
CLAIMS = load_claims(sorted(ROOT.glob("suites/*/claims.toml")))
RUNS = gq.recorded_runs(RECORDS)
# each local claim, once per CPU it records a bound for (claims whose bound is the same everywhere: once)
LOCAL = {f"{cid}@{cpu}" if cpu else cid: (claim, runs) for cid in sorted(c.id for c in CLAIMS.values() if c.is_local)
         for cpu, claim, runs in gq.per_cpu(CLAIMS[cid], RUNS.get(cid, []))}


def test_every_local_claim_has_recorded_runs():
    assert RECORDS, "fixtures/gate-runs/ holds no run records"
    missing = [key for key, (_, runs) in LOCAL.items() if len(runs) < 2]
    assert not missing, f"fewer than two recorded runs for {missing}"


@pytest.mark.parametrize("key", sorted(LOCAL))
def test_gate_quality(key):
    claim, runs = LOCAL[key]
    # enforced gates are held to the targets (400 trials: 1% is 4 runs); report-only claims are only
    # shown, with fewer trials to keep the test short
    row = gq.quality(claim, runs, trials=400 if claim.enforced else 40, seed=2026)
    print("\n" + gq.table([row]))
    if claim.enforced:
        assert gq.meets_the_bar(row) == [], gq.table([row])
    else:
        assert claim.why, "a report-only claim says why it cannot gate"


def _claim(**kw) -> Claim:
    fields = dict(id="t.gate", statement="s", metric="m", baseline="a", candidate="b", kind="ratio",
                  direction="lower", source="local: test")
    fields.update(kw)
    return Claim(**fields)


def _runs(level: float, noise: float, n: int = 30, count: int = 4, seed: int = 1) -> list[gq.RecordedRun]:
    rng = np.random.default_rng(seed)
    return [gq.RecordedRun(np.ones(n), level * np.exp(rng.normal(0, noise, n)), n, 3 * n) for _ in range(count)]


def test_a_gate_close_to_its_typical_value_warns_and_a_loose_one_misses_regressions():
    """The model tells the two ways a gate goes wrong apart (and a good bound from both)."""
    runs = _runs(1.0, 0.03)
    tight = gq.quality(_claim(max=1.0, tolerance=0.02), runs, trials=200)
    loose = gq.quality(_claim(max=1.5, tolerance=0.02), runs, trials=200)
    good = gq.quality(_claim(max=1.08, tolerance=0.04, warn=0.02), runs, trials=200)
    assert tight["0%"]["warn"] > 0.3
    assert loose["20%"]["fail"] == 0.0
    assert gq.meets_the_bar(good) == [], gq.table([good])


def test_counter_gate_is_judged_on_its_recorded_rounds():
    counter = _claim(max=0.1, zero_ok=True)
    runs = [gq.RecordedRun(np.full(10, 6.0), np.zeros(10), 10, 30)] * 2
    row = gq.quality(counter, runs, trials=50)
    assert row["0%"]["pass"] == 1.0 and row["20%"]["fail"] == 1.0


def test_a_gate_with_bounds_per_cpu_is_judged_on_each_cpus_own_runs():
    hosts = {"cpu A": {"source": "a"}, "cpu B": {"max": 1.6, "source": "b"}}
    gate = _claim(max=1.08, tolerance=0.04, warn=0.02, hosts=hosts)
    runs = [replace(r, cpu="cpu A") for r in _runs(1.0, 0.03)] + \
           [replace(r, cpu="cpu B") for r in _runs(1.45, 0.03, seed=2)] + _runs(3.0, 0.03, seed=3)
    judged = {cpu: (claim, mine) for cpu, claim, mine in gq.per_cpu(gate, runs)}
    assert sorted(judged) == ["cpu A", "cpu B"] and all(len(m) == 4 for _, m in judged.values())
    assert judged["cpu B"][0].max == 1.6
    for claim, mine in judged.values():      # each CPU's bound holds on its own runs, not on the other's
        assert gq.meets_the_bar(gq.quality(claim, mine, trials=100)) == []
    assert gq.quality(judged["cpu A"][0], judged["cpu B"][1], trials=50)["0%"]["fail"] == 1.0
