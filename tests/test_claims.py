"""Unit tests for pytest_hpcnet.claims: the claim model, loading claims files, verdicts."""

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_hpcnet.claims import (Claim, ClaimMismatch, Verdict, evaluate, inject, load_claims,
                                  not_applicable, same_config, sensitivity, settle)
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.measure import Paired, Series, ratio_ci

DATA = Path(__file__).parent / "data" / "claims"
ROOT = Path(__file__).parent.parent


# --- loading -------------------------------------------------------------------------------------

def test_load_good_file():
    claims = load_claims([DATA / "good.toml"])
    assert list(claims) == ["rpc.latency.shm_vs_tcp", "dfsio.write.rdma_vs_ipoib",
                            "mapreduce.sort.lustre_vs_ipoib", "qjump.p99.alone"]
    rpc = claims["rpc.latency.shm_vs_tcp"]
    assert (rpc.kind, rpc.direction, rpc.min, rpc.max, rpc.tolerance, rpc.warn) == \
        ("ratio", "lower", None, 0.8, 0.05, 0.05)
    assert (rpc.baseline, rpc.candidate, rpc.markers) == ("transport=tcp", "transport=shm", ())
    assert rpc.file == str(DATA / "good.toml") and rpc.is_local
    dfsio = claims["dfsio.write.rdma_vs_ipoib"]
    assert dfsio.markers == ("edr", "power8") and dfsio.published == (2.18, 2.26)
    assert not dfsio.is_local and dfsio.source == "seed 001, TestDFSIO figure"
    qjump = claims["qjump.p99.alone"]
    assert qjump.kind == "absolute" and qjump.baseline is None and qjump.max == 100.0
    assert isinstance(qjump.max, float)
    with pytest.raises(AttributeError):
        rpc.max = 2.0   # frozen


def test_load_several_files_merges_them():
    claims = load_claims([DATA / "good.toml", str(DATA / "more.toml")])
    assert len(claims) == 5
    assert claims["rpc.latency.regression_gate"].file == str(DATA / "more.toml")


def test_load_no_files_and_empty_file(tmp_path):
    assert load_claims([]) == {}
    (tmp_path / "empty.toml").write_text("# nothing yet\n")
    assert load_claims([tmp_path / "empty.toml"]) == {}


def test_bound_text():
    claims = load_claims([DATA / "good.toml"])
    assert claims["dfsio.write.rdma_vs_ipoib"].bound_text() == ">= 2.18 (tolerance 0.05)"
    assert claims["rpc.latency.shm_vs_tcp"].bound_text() == "<= 0.8 (tolerance 0.05, warn band 0.05)"
    assert claims["qjump.p99.alone"].bound_text() == "<= 100"
    both = replace(claims["mapreduce.sort.lustre_vs_ipoib"], max=0.49)
    assert both.bound_text() == ">= 0.34 and <= 0.49 (tolerance 0.02)"


def _error_text(paths) -> str:
    with pytest.raises(ConfigError) as e:
        load_claims(paths)
    return str(e.value)


def test_unknown_field_names_file_claim_and_field():
    text = _error_text([DATA / "unknown_field.toml"])
    assert str(DATA / "unknown_field.toml") in text
    assert "'rpc.latency.typo'" in text and "tolerence" in text


def test_missing_direction_is_an_error_not_a_default():
    text = _error_text([DATA / "missing_direction.toml"])
    assert str(DATA / "missing_direction.toml") in text
    assert "'rpc.latency.no_direction'" in text and "direction" in text


def test_duplicate_id_across_files_names_both_files():
    text = _error_text([DATA / "good.toml", DATA / "duplicate_id.toml"])
    assert "duplicate claim id" in text and "'rpc.latency.shm_vs_tcp'" in text
    assert str(DATA / "duplicate_id.toml") in text and str(DATA / "good.toml") in text


def test_duplicate_id_within_one_file(tmp_path):
    body = (DATA / "more.toml").read_text()
    (tmp_path / "twice.toml").write_text(body + "\n" + body)
    text = _error_text([tmp_path / "twice.toml"])
    assert "duplicate" in text and "'rpc.latency.regression_gate'" in text


def test_bad_toml_names_file():
    text = _error_text([DATA / "bad_syntax.toml"])
    assert str(DATA / "bad_syntax.toml") in text and "invalid TOML" in text


def test_missing_file_is_a_config_error(tmp_path):
    text = _error_text([tmp_path / "nope.toml"])
    assert "nope.toml" in text and "cannot read" in text


GOOD = """
id = "x.y"
statement = "s"
metric = "m"
kind = "ratio"
baseline = "a"
candidate = "b"
direction = "higher"
min = 1.5
source = "test"
"""


def _write_claim(tmp_path, body: str, overrides: dict) -> Path:
    """A one-claim file: ``body`` with some keys replaced (value None drops the key)."""
    lines = [ln for ln in body.strip().splitlines() if ln.split(" = ")[0] not in overrides]
    lines += [f"{k} = {v}" for k, v in overrides.items() if v is not None]
    path = tmp_path / "claims.toml"
    path.write_text("[[claim]]\n" + "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("overrides, match", [
    ({"kind": '"speedup"'}, "kind must be one of ratio, reduction, absolute; got 'speedup'"),
    ({"direction": '"up"'}, "direction must be 'higher' or 'lower'; got 'up'"),
    ({"min": None}, "at least one bound"),
    ({"max": "1.0"}, r"min \(1.5\) is greater than max \(1.0\)"),
    ({"direction": '"lower"'}, "direction 'lower' needs a max bound"),
    ({"min": None, "max": "3"}, "direction 'higher' needs a min bound"),
    ({"tolerance": "-0.1"}, "tolerance must be a number >= 0"),
    ({"warn": '"big"'}, "warn must be a number >= 0"),
    ({"min": '"2"'}, "min must be a finite number"),
    ({"min": "true"}, "min must be a finite number"),
    ({"min": "nan"}, "min must be a finite number"),
    ({"baseline": None}, "baseline is required for kind 'ratio'"),
    ({"markers": '"rdma"'}, "markers must be a list of feature names"),
    ({"markers": "[1]"}, "markers must be a list of feature names"),
    ({"published": "[2.26, 2.18]"}, r"published must be a \[lo, hi\] pair"),
    ({"statement": '""'}, "statement must be a non-empty string"),
    ({"file": '"elsewhere"'}, "unknown field"),
    ({"verdicts": '"maybe"'}, "verdicts must be 'enforce' or 'report'"),
    ({"verdicts": '"report"'}, "must say why it cannot gate"),
    ({"zero_ok": '"yes"'}, "zero_ok must be true or false"),
    ({"metric": None, "source": None}, r"missing required field\(s\) metric, source"),
])
def test_invalid_claims_name_file_and_id(tmp_path, overrides, match):
    path = _write_claim(tmp_path, GOOD, overrides)
    text = _error_text([path])
    assert text.startswith(f"{path}: claim 'x.y': ")
    assert re.search(match, text), text


def test_claim_without_id_is_named_by_index(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text("[[claim]]\n" + GOOD + "\n[[claim]]\n" + GOOD.replace('id = "x.y"\n', ""))
    text = _error_text([path])
    assert f"{path}: claim #2 (no id)" in text and "missing required field(s) id" in text


def test_absolute_claim_may_omit_baseline(tmp_path):
    path = _write_claim(tmp_path, GOOD, {"kind": '"absolute"', "baseline": None})
    assert load_claims([path])["x.y"].baseline is None


@pytest.mark.parametrize("text, match", [
    ("[[claims]]\nid = 'a'\n", "unknown top-level key"),
    ("claim = 3\n", "array of tables"),
    ("claim = [1]\n", "must be a table"),
])
def test_file_shape_errors(tmp_path, text, match):
    path = tmp_path / "claims.toml"
    path.write_text(text)
    assert match in _error_text([path])


def test_constructing_a_claim_in_code_validates_too():
    with pytest.raises(ConfigError, match="claim 'c': direction"):
        Claim(id="c", statement="s", metric="m", baseline="a", candidate="b", kind="ratio",
              direction=None, max=1.0, source="test")


def test_suite_claims_files_load():
    """Every suites/*/claims.toml in the repository must load (ids unique across suites)."""
    files = sorted(ROOT.glob("suites/*/claims.toml"))
    if not files:
        pytest.skip("no suites/*/claims.toml yet")
    claims = load_claims(files)
    assert all(c.file in map(str, files) for c in claims.values())


# --- verdicts ------------------------------------------------------------------------------------

def _paired(ratio: float, noise: float, rounds: int = 20, seed: int = 0, metric: str = "m"):
    """Paired sides whose per-round ratio is ``ratio`` times lognormal noise of sd ``noise``."""
    rng = np.random.default_rng(seed)
    base = 100 * np.exp(rng.normal(0, 0.2, rounds))     # drift between rounds, cancelled by pairing
    return (Series(metric, "a", list(base)),
            Series(metric, "b", list(ratio * base * np.exp(rng.normal(0, noise, rounds)))))


def _sides(base, cand, metric: str = "m"):
    return (None if base is None else Series(metric, "a", list(base))), Series(metric, "b", list(cand))


def _claim(**kw) -> Claim:
    fields = dict(id="t.claim", statement="s", metric="m", baseline="a", candidate="b",
                  source="seed 999, figure 1")
    fields.update(kw)
    return Claim(**fields)


LOWER = _claim(kind="ratio", direction="lower", max=0.8, tolerance=0.05, warn=0.05)   # fails above 0.85
HIGHER = _claim(kind="ratio", direction="higher", min=2.18, tolerance=0.05, warn=0.1)  # fails below 2.13


@pytest.mark.parametrize("claim, ratio, noise, outcome, reason", [
    (LOWER, 0.60, 0.02, "pass", "CI below the stated maximum 0.8"),
    (LOWER, 0.77, 0.002, "warn", "median within the warn band 0.05 of the stated maximum 0.8"),
    (LOWER, 0.80, 0.05, "warn", "CI straddles the stated maximum 0.8"),
    (LOWER, 0.83, 0.002, "warn", "whole CI above the stated maximum 0.8, within the tolerance"),
    (LOWER, 1.00, 0.02, "fail", "whole CI above 0.85 (the maximum 0.8 plus the tolerance)"),
    (HIGHER, 2.60, 0.02, "pass", "CI above the stated minimum 2.18"),
    (HIGHER, 2.22, 0.002, "warn", "median within the warn band 0.1 of the stated minimum 2.18"),
    (HIGHER, 2.18, 0.05, "warn", "CI straddles the stated minimum 2.18"),
    (HIGHER, 2.15, 0.002, "warn", "whole CI below the stated minimum 2.18, within the tolerance"),
    (HIGHER, 1.50, 0.02, "fail", "whole CI below 2.13 (the minimum 2.18 less the tolerance)"),
])
def test_ratio_verdict_paths(claim, ratio, noise, outcome, reason):
    base, cand = _paired(ratio, noise)
    v = evaluate(claim, base, cand)
    assert (v.outcome, v.reason) == (outcome, reason), v.message()
    r = ratio_ci(base.samples, cand.samples)
    assert v.quantity == r.ratio and v.ci == (r.lo, r.hi) and v.n == 20 and v.kind == "ratio"
    if outcome == "warn" and "straddles" in reason:
        assert v.ci[0] < (0.8 if claim is LOWER else 2.18) < v.ci[1]


def test_never_a_pass_when_the_whole_ci_is_beyond_the_stated_bound():
    """The issue's example: min 0.42, tolerance 0.05, warn 0.03, CI about [0.38, 0.41] is a warn."""
    claim = _claim(kind="reduction", direction="higher", min=0.42, tolerance=0.05, warn=0.03)
    v = evaluate(claim, *_paired(0.605, 0.01, rounds=30))
    assert 0.37 < v.ci[0] <= v.ci[1] < 0.42, v.message()
    assert v.outcome == "warn" and "whole CI below the stated minimum 0.42" in v.reason


def test_tolerance_moves_only_the_fail_threshold():
    base, cand = _paired(0.83, 0.002)   # CI tightly around 0.83, above the stated 0.8
    strict = replace(LOWER, tolerance=0.0, warn=0.0)
    assert evaluate(strict, base, cand).outcome == "fail"
    assert evaluate(replace(strict, tolerance=0.05), base, cand).outcome == "warn"   # not a pass
    assert evaluate(replace(strict, tolerance=0.5), base, cand).outcome == "warn"


def test_warn_band_is_measured_from_the_stated_bound():
    base, cand = _paired(0.77, 0.002)
    assert evaluate(replace(LOWER, warn=0.0), base, cand).outcome == "pass"
    assert evaluate(replace(LOWER, warn=0.02), base, cand).outcome == "pass"     # 0.77 < 0.8 - 0.02
    assert evaluate(replace(LOWER, warn=0.04, tolerance=1.0), base, cand).outcome == "warn"


def test_reduction_kind():
    claim = _claim(kind="reduction", direction="higher", min=0.34, tolerance=0.02)  # fails below 0.32
    base, cand = _paired(0.6, 0.02)            # job time 40% lower
    v = evaluate(claim, base, cand)
    r = ratio_ci(base.samples, cand.samples)
    assert v.outcome == "pass" and v.quantity == pytest.approx(1 - r.ratio)
    assert v.ci == pytest.approx((1 - r.hi, 1 - r.lo)) and v.ci[0] <= v.quantity <= v.ci[1]
    assert v.quantity == pytest.approx(0.4, abs=0.02)
    assert evaluate(claim, *_paired(0.9, 0.02)).outcome == "fail"     # only 10% lower
    assert evaluate(claim, *_paired(0.66, 0.05)).outcome == "warn"    # straddles 0.34


def test_absolute_kind_uses_candidate_only():
    claim = _claim(kind="absolute", direction="lower", max=100.0, baseline=None)
    rng = np.random.default_rng(1)
    fast = 50 * np.exp(rng.normal(0, 0.1, 30))
    v = evaluate(claim, *_sides(None, fast))
    assert v.outcome == "pass" and v.quantity == pytest.approx(float(np.median(fast))) and v.n == 30
    assert v.ci[0] <= v.quantity <= v.ci[1]
    assert evaluate(claim, *_sides([1.0] * 30, fast)).quantity == v.quantity     # a baseline is ignored
    assert evaluate(claim, *_sides(None, fast * 4)).outcome == "fail"
    assert evaluate(claim, *_sides(None, fast * 2)).outcome == "warn"            # CI straddles 100


def test_two_sided_claim():
    claim = _claim(kind="ratio", direction="higher", min=2.18, max=2.26)
    assert evaluate(claim, *_paired(2.22, 0.002)).outcome == "pass"
    v = evaluate(claim, *_paired(2.5, 0.002))
    assert v.outcome == "fail" and "the stated maximum 2.26" in v.reason
    assert evaluate(claim, *_paired(2.0, 0.002)).outcome == "fail"


def test_message_shows_value_ci_bound_and_source():
    v = evaluate(LOWER, *_paired(1.0, 0.02))
    msg = v.message()
    assert "\n" not in msg
    assert msg.startswith("FAIL t.claim: ratio ")
    assert f"95% CI {v.ci[0]:.4g}..{v.ci[1]:.4g}, n=20" in msg
    assert f"{v.quantity:.4g}" in msg
    assert "bound <= 0.8 (tolerance 0.05, warn band 0.05)" in msg
    assert "whole CI above 0.85" in msg
    assert msg.endswith("[source: seed 999, figure 1]")


def test_verdict_json_round_trip():
    v = evaluate(HIGHER, *_paired(2.6, 0.02))
    d = json.loads(json.dumps(v.to_json()))
    assert d["outcome"] == "pass" and d["ci"] == list(v.ci) and d["claim_id"] == "t.claim"
    assert d["samples"]["candidate"] == v.samples["candidate"] and len(d["samples"]["baseline"]) == 20
    assert Verdict.from_json(d) == v
    na = not_applicable(HIGHER, {"edr": ["n0"]})
    assert Verdict.from_json(json.loads(json.dumps(na.to_json()))) == na
    old = {k: d[k] for k in ("claim_id", "outcome", "quantity", "ci", "bound", "source", "reason")}
    assert Verdict.from_json(old).outcome == "pass"     # records written before the newer fields


def test_not_applicable_names_features_and_nodes():
    v = not_applicable(HIGHER, {"rdma": ["node1"], "ib_qdr": ["node0", "node1"]})
    assert v.outcome == "n/a" and v.quantity is None and v.ci is None
    assert v.reason == "hardware absent: ib_qdr missing on node0, node1; rdma missing on node1"
    assert v.bound == HIGHER.bound_text() and v.source == HIGHER.source
    assert v.message().startswith("N/A t.claim: not measured; bound >= 2.18")


def test_evaluate_is_pure_and_seeded():
    base, cand = _paired(0.84, 0.05)
    assert evaluate(LOWER, base, cand) == evaluate(LOWER, base, cand)
    assert base.samples == _paired(0.84, 0.05)[0].samples   # inputs untouched


@pytest.mark.parametrize("claim, base, cand, match", [
    (LOWER, [1.0, 2.0], [1.0], "claim 't.claim': .*differ in length"),
    (LOWER, None, [1.0, 2.0], "claim 't.claim': kind 'ratio' needs baseline samples"),
    (LOWER, [1.0], [1.0], "at least 2 samples"),
    (LOWER, [1.0, 2.0], [1.0, 0.0], r"candidate 'b' has a zero or negative sample in round\(s\) \[1\]"),
    (LOWER, [1.0, -2.0], [1.0, 1.0], r"baseline 'a' has a zero or negative sample"),
    (replace(LOWER, zero_ok=True), [1.0, 2.0], [1.0, -1.0], "has a negative sample"),
    (_claim(kind="absolute", direction="lower", max=1.0), None, [], "no samples"),
])
def test_evaluate_rejects_bad_samples(claim, base, cand, match):
    with pytest.raises(ValueError, match=match):
        evaluate(claim, *_sides(base, cand))


def test_zero_candidate_passes_only_a_counter_claim():
    counter = replace(LOWER, zero_ok=True, max=0.1, tolerance=0.0, warn=0.0)
    assert evaluate(counter, *_sides([6.0] * 10, [0.0] * 10)).outcome == "pass"
    with pytest.raises(ValueError, match="zero or negative"):
        evaluate(LOWER, *_sides([6.0] * 10, [0.0] * 10))


@pytest.mark.parametrize("change, match", [
    ({"metric": "rpc.echo.latency"}, "claim 't.claim' is on metric 'm', but the baseline samples measure "
                                     "'rpc.echo.latency'"),
    ({"swap": True}, "claim 't.claim' names baseline 'a', but the samples are of 'b'"),
    ({"config": "transport=tcp"}, "names candidate 'b', but the samples are of 'transport=tcp'"),
])
def test_mismatched_metric_or_configuration_is_refused(change, match):
    base, cand = _paired(0.6, 0.02)
    if "metric" in change:
        base, cand = base._replace(metric=change["metric"]), cand._replace(metric=change["metric"])
    if change.get("swap"):
        base, cand = cand, base
    if "config" in change:
        cand = cand._replace(config=change["config"])
    with pytest.raises(ClaimMismatch, match=re.escape(match)):
        evaluate(LOWER, base, cand)


def test_configuration_parts_may_come_in_any_order():
    claim = replace(LOWER, baseline="transport=tcp,net=eth", candidate="net=eth, transport=shm")
    base, cand = _paired(0.6, 0.02)
    v = evaluate(claim, base._replace(config="net=eth,transport=tcp"), cand._replace(config="transport=shm,net=eth"))
    assert v.outcome == "pass"
    assert same_config("a=1,b=2", "b=2,a=1") and not same_config("a=1", "a=1,b=2")


def test_few_rounds_get_an_exact_interval_with_its_real_coverage():
    v = evaluate(LOWER, *_paired(0.6, 0.02, rounds=3))
    assert v.confidence == pytest.approx(0.75) and v.n == 3
    assert "(75% CI" in v.message()
    assert evaluate(LOWER, *_paired(0.6, 0.02, rounds=10)).confidence == 0.95


@pytest.mark.parametrize("claim, expect", [
    (LOWER, lambda c: c * 1.2),
    (HIGHER, lambda c: c / 1.2),
    (_claim(kind="reduction", direction="higher", min=0.3), lambda c: c * 1.2),
    (replace(LOWER, zero_ok=True), lambda c: c + 0.2 * 100.0),
])
def test_inject_makes_the_candidate_worse_in_the_claims_bad_direction(claim, expect):
    base, cand = np.full(4, 100.0), np.array([10.0, 20.0, 0.0, 5.0]) if claim.zero_ok else np.array([10.0, 20.0])
    assert np.allclose(inject(claim, base[:cand.size], cand, 0.2), expect(cand))
    assert inject(claim, base, cand, 0.0) is cand


def test_sensitivity_is_the_smallest_injected_regression_that_fails():
    gate = _claim(kind="ratio", direction="lower", max=1.08, tolerance=0.02, warn=0.03)
    base, cand = _paired(1.0, 0.01, rounds=30)
    assert sensitivity(gate, base, cand) == 0.15      # 1.10 is not beyond 1.10, 1.15 is
    assert evaluate(gate, base, cand, inject_regression=0.2).outcome == "fail"
    assert sensitivity(replace(gate, max=5.0), base, cand) is None


def test_settle_takes_more_rounds_while_the_ci_straddles_a_bound():
    gate = _claim(kind="ratio", direction="lower", max=1.1, tolerance=0.02, warn=0.02)
    rng = np.random.default_rng(3)
    calls = []

    def more(n):
        calls.append(n)
        base.extend([100.0] * n)
        cand.extend(list(100 * 1.0 * np.exp(rng.normal(0, 0.08, n))))
        return list(base), list(cand)
    base = [100.0] * 10
    cand = list(100 * np.exp(rng.normal(0.09, 0.08, 10)))   # a straddling start
    paired = Paired("a", "b", list(base), list(cand), metric="m", more=more)
    v = settle(gate, paired, max_rounds=40)
    assert calls and all(n == 10 for n in calls) and paired.rounds <= 40 and v.n == paired.rounds
    assert v.first_rounds == 10
    fixed = Paired("a", "b", [100.0] * 10, [109.0, 111.0] * 5, metric="m")     # no way to take more
    assert settle(gate, fixed, max_rounds=40).n == 10


@settings(max_examples=80, deadline=None)
@given(ratios=st.lists(st.floats(0.2, 5.0), min_size=2, max_size=14),
       bound=st.floats(0.5, 2.0), tolerance=st.sampled_from([0.0, 0.05, 0.3]),
       warn=st.sampled_from([0.0, 0.1]), higher=st.booleans())
def test_verdict_follows_the_rules(ratios, bound, tolerance, warn, higher):
    """Fail exactly when the whole CI is beyond bound -/+ tolerance; pass only with the whole CI on the
    right side of the stated bound and the median outside the warn band measured from it."""
    claim = _claim(kind="ratio", direction="higher" if higher else "lower", tolerance=tolerance,
                   warn=warn, **({"min": bound} if higher else {"max": bound}))
    v = evaluate(claim, *_sides([1.0] * len(ratios), ratios))
    lo, hi = v.ci
    fail_at = bound - tolerance if higher else bound + tolerance
    assert (v.outcome == "fail") == (hi < fail_at if higher else lo > fail_at)
    if v.outcome == "pass":
        assert (lo >= bound and v.quantity >= bound + warn) if higher else \
            (hi <= bound and v.quantity <= bound - warn)
    beyond = hi < bound if higher else lo > bound
    assert not (beyond and v.outcome == "pass")


# --- per-cluster overrides -----------------------------------------------------------------------

def test_override_changes_the_bound_and_says_where_it_came_from(tmp_path):
    (tmp_path / "mine.toml").write_text('[[override]]\nid = "rpc.latency.shm_vs_tcp"\nmax = 0.6\n'
                                        'verdicts = "report"\nwhy = "our IB box"\nreason = "measured on ours"\n')
    claims = load_claims([DATA / "good.toml", tmp_path / "mine.toml"])
    c = claims["rpc.latency.shm_vs_tcp"]
    assert (c.max, c.tolerance, c.enforced) == (0.6, 0.05, False)
    assert c.bound_from == f"{tmp_path / 'mine.toml'} (measured on ours)"
    v = evaluate(c, Series(c.metric, "transport=tcp", [1.0] * 10), Series(c.metric, "transport=shm", [0.5] * 10))
    assert v.bound_from == c.bound_from and "(bound from " in v.message()


@pytest.mark.parametrize("body, match", [
    ('[[override]]\nid = "rpc.latency.shm_vs_tpc"\nmax = 0.6\n', "no claim 'rpc.latency.shm_vs_tpc' to override; "
                                                                 "did you mean 'rpc.latency.shm_vs_tcp'"),
    ('[[override]]\nmax = 0.6\n', "needs the id"),
    ('[[override]]\nid = "rpc.latency.shm_vs_tcp"\nmetric = "x"\n', "cannot override metric"),
    ('[[override]]\nid = "rpc.latency.shm_vs_tcp"\nmax = -1.0\nmin = 0.0\n', "after the override"),
    ('[[override]]\nid = "rpc.latency.shm_vs_tcp"\nmax = 0.6\n[[override]]\nid = "rpc.latency.shm_vs_tcp"\n'
     'max = 0.7\n', "already overridden"),
])
def test_bad_overrides_are_one_line_errors(tmp_path, body, match):
    (tmp_path / "mine.toml").write_text(body)
    text = _error_text([DATA / "good.toml", tmp_path / "mine.toml"])
    assert "override #" in text and re.search(match, text), text


# --- bounds per CPU (Claim.hosts) ------------------------------------------------------------------

F25, F23 = "AMD EPYC family 25 model 1", "AMD EPYC family 23 model 1"
PER_CPU = '''[[claim]]
id = "t.gate"
statement = "s"
metric = "m"
baseline = "a"
candidate = "b"
kind = "ratio"
direction = "lower"
max = 1.29
source = "local: eight runs"
[claim.hosts."AMD EPYC family 25 model 1"]
source = "the runs above"
[claim.hosts."AMD EPYC family 23 model 1"]
max = 1.6
source = "six runs there"
'''


def test_a_gate_is_judged_with_its_cpus_bound_and_reported_on_a_cpu_without_one(tmp_path):
    (tmp_path / "c.toml").write_text(PER_CPU)
    gate = load_claims([tmp_path / "c.toml"])["t.gate"]
    assert (gate.on_host(F25).max, gate.on_host(F25).enforced) == (1.29, True)
    on23 = gate.on_host(F23)
    assert (on23.max, on23.enforced, on23.bound_from) == (1.6, True, f"recorded on {F23}: six runs there")
    other = gate.on_host("Intel Xeon family 6 model 85")
    assert not other.enforced and other.max == 1.29
    assert other.why.startswith("no bound recorded on this CPU (Intel Xeon family 6 model 85)") and F23 in other.why
    # the same samples fail on one CPU and pass on the other
    base, cand = Series("m", "a", [1.0] * 10), Series("m", "b", [1.45] * 10)
    assert evaluate(gate.on_host(F25), base, cand).outcome == "fail"
    assert evaluate(on23, base, cand).outcome == "pass"


@pytest.mark.parametrize("hosts, match", [
    ({F23: {"max": 1.6}}, "needs a table with the source of its bound"),
    ({F23: {"max": 1.6, "source": "x", "metric": "y"}}, "unknown field"),
    ({F23: {"max": -1.0, "min": 0.0, "source": "x"}}, "min .* is greater than max"),
    ({}, "hosts must be a table of CPUs"),
])
def test_bad_per_cpu_bounds_are_one_line_errors(hosts, match):
    with pytest.raises(ConfigError, match=match):
        _claim(kind="ratio", direction="lower", max=1.0, source="local: x", hosts=hosts)


def test_per_cpu_bounds_are_for_local_gates_only():
    with pytest.raises(ConfigError, match="hosts is for local gates"):
        _claim(kind="ratio", direction="lower", max=1.0, hosts={F23: {"source": "x"}})
