"""Unit tests for pytest_hpcnet.claims: the claim model, loading claims files, verdicts."""

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_hpcnet.claims import (GATE_TOLERANCE, GATE_WARN, Claim, Verdict, evaluate, load_claims,
                                  not_applicable)
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.measure import DEFAULT_ROUNDS, ratio_ci

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

def _paired(ratio: float, noise: float, rounds: int = 20, seed: int = 0):
    """Paired samples whose per-round ratio is ``ratio`` times lognormal noise of sd ``noise``."""
    rng = np.random.default_rng(seed)
    base = 100 * np.exp(rng.normal(0, 0.2, rounds))     # drift between rounds, cancelled by pairing
    return base, ratio * base * np.exp(rng.normal(0, noise, rounds))


def _claim(**kw) -> Claim:
    fields = dict(id="t.claim", statement="s", metric="m", baseline="a", candidate="b",
                  source="seed 999, figure 1")
    fields.update(kw)
    return Claim(**fields)


LOWER = _claim(kind="ratio", direction="lower", max=0.8, tolerance=0.05, warn=0.05)   # eff. 0.85
HIGHER = _claim(kind="ratio", direction="higher", min=2.18, tolerance=0.05, warn=0.1)  # eff. 2.13


@pytest.mark.parametrize("claim, ratio, noise, outcome, reason", [
    (LOWER, 0.60, 0.02, "pass", "CI below the effective maximum 0.85"),
    (LOWER, 0.82, 0.002, "warn", "point estimate within the warn band below the effective maximum 0.85"),
    (LOWER, 0.85, 0.05, "warn", "CI straddles the effective maximum 0.85"),
    (LOWER, 1.00, 0.02, "fail", "whole CI above the effective maximum 0.85"),
    (HIGHER, 2.60, 0.02, "pass", "CI above the effective minimum 2.13"),
    (HIGHER, 2.18, 0.005, "warn", "point estimate within the warn band above the effective minimum 2.13"),
    (HIGHER, 2.13, 0.05, "warn", "CI straddles the effective minimum 2.13"),
    (HIGHER, 1.50, 0.02, "fail", "whole CI below the effective minimum 2.13"),
])
def test_ratio_verdict_paths(claim, ratio, noise, outcome, reason):
    base, cand = _paired(ratio, noise)
    v = evaluate(claim, base, cand)
    assert (v.outcome, v.reason) == (outcome, reason), v.message()
    r = ratio_ci(base, cand)
    assert v.quantity == r.ratio and v.ci == (r.lo, r.hi) and v.n == 20 and v.kind == "ratio"
    if outcome == "warn" and "straddles" in reason:
        assert v.ci[0] < (0.85 if claim is LOWER else 2.13) < v.ci[1]


def test_tolerance_decides_between_fail_and_pass():
    base, cand = _paired(0.83, 0.002)   # CI tightly around 0.83
    strict = replace(LOWER, tolerance=0.0, warn=0.0)
    assert evaluate(strict, base, cand).outcome == "fail"
    assert evaluate(replace(strict, tolerance=0.05), base, cand).outcome == "pass"


def test_reduction_kind():
    claim = _claim(kind="reduction", direction="higher", min=0.34, tolerance=0.02)  # eff. 0.32
    base, cand = _paired(0.6, 0.02)            # job time 40% lower
    v = evaluate(claim, base, cand)
    r = ratio_ci(base, cand)
    assert v.outcome == "pass" and v.quantity == pytest.approx(1 - r.ratio)
    assert v.ci == pytest.approx((1 - r.hi, 1 - r.lo)) and v.ci[0] <= v.quantity <= v.ci[1]
    assert v.quantity == pytest.approx(0.4, abs=0.02)
    assert evaluate(claim, *_paired(0.9, 0.02)).outcome == "fail"     # only 10% lower
    assert evaluate(claim, *_paired(0.68, 0.05)).outcome == "warn"    # straddles 0.32


def test_absolute_kind_uses_candidate_only():
    claim = _claim(kind="absolute", direction="lower", max=100.0, baseline=None)
    rng = np.random.default_rng(1)
    fast = 50 * np.exp(rng.normal(0, 0.1, 30))
    v = evaluate(claim, None, fast)
    assert v.outcome == "pass" and v.quantity == pytest.approx(float(np.median(fast))) and v.n == 30
    assert v.ci[0] <= v.quantity <= v.ci[1]
    assert evaluate(claim, [1.0] * 30, fast).quantity == v.quantity     # a baseline is ignored
    assert evaluate(claim, None, fast * 4).outcome == "fail"
    assert evaluate(claim, None, fast * 2).outcome == "warn"            # CI straddles 100


def test_two_sided_claim():
    claim = _claim(kind="ratio", direction="higher", min=2.18, max=2.26)
    assert evaluate(claim, *_paired(2.22, 0.002)).outcome == "pass"
    v = evaluate(claim, *_paired(2.5, 0.002))
    assert v.outcome == "fail" and "effective maximum 2.26" in v.reason
    assert evaluate(claim, *_paired(2.0, 0.002)).outcome == "fail"


def test_message_shows_value_ci_bound_and_source():
    v = evaluate(LOWER, *_paired(1.0, 0.02))
    msg = v.message()
    assert "\n" not in msg
    assert msg.startswith("FAIL t.claim: ratio ")
    assert f"95% CI {v.ci[0]:.4g}..{v.ci[1]:.4g}, n=20" in msg
    assert f"{v.quantity:.4g}" in msg
    assert "bound <= 0.8 (tolerance 0.05, warn band 0.05)" in msg
    assert "whole CI above the effective maximum 0.85" in msg
    assert msg.endswith("[source: seed 999, figure 1]")


def test_verdict_json_round_trip():
    v = evaluate(HIGHER, *_paired(2.6, 0.02))
    d = json.loads(json.dumps(v.to_json()))
    assert d["outcome"] == "pass" and d["ci"] == list(v.ci) and d["claim_id"] == "t.claim"
    assert Verdict.from_json(d) == v
    na = not_applicable(HIGHER, {"edr": ["n0"]})
    assert Verdict.from_json(json.loads(json.dumps(na.to_json()))) == na


def test_not_applicable_names_features_and_nodes():
    v = not_applicable(HIGHER, {"rdma": ["node1"], "ib_qdr": ["node0", "node1"]})
    assert v.outcome == "n/a" and v.quantity is None and v.ci is None
    assert v.reason == "hardware absent: ib_qdr missing on node0, node1; rdma missing on node1"
    assert v.bound == HIGHER.bound_text() and v.source == HIGHER.source
    assert v.message().startswith("N/A t.claim: not measured; bound >= 2.18")


def test_evaluate_is_pure_and_seeded():
    base, cand = _paired(0.84, 0.05)
    assert evaluate(LOWER, base, cand) == evaluate(LOWER, base, cand)
    assert list(base) == list(_paired(0.84, 0.05)[0])   # inputs untouched


@pytest.mark.parametrize("claim, base, cand, match", [
    (LOWER, [1.0, 2.0], [1.0], "claim 't.claim': .*differ in length"),
    (LOWER, None, [1.0, 2.0], "claim 't.claim': kind 'ratio' needs baseline samples"),
    (LOWER, [1.0], [1.0], "at least 2 samples"),
    (_claim(kind="absolute", direction="lower", max=1.0), None, [], "no samples"),
])
def test_evaluate_rejects_bad_samples(claim, base, cand, match):
    with pytest.raises(ValueError, match=match):
        evaluate(claim, base, cand)


@settings(max_examples=60, deadline=None)
@given(ratios=st.lists(st.floats(0.2, 5.0), min_size=2, max_size=12),
       bound=st.floats(0.5, 2.0), tolerance=st.sampled_from([0.0, 0.05]),
       warn=st.sampled_from([0.0, 0.1]), higher=st.booleans())
def test_verdict_agrees_with_ci(ratios, bound, tolerance, warn, higher):
    """Fail exactly when the whole CI is beyond the effective bound; pass never straddles it."""
    claim = _claim(kind="ratio", direction="higher" if higher else "lower", tolerance=tolerance,
                   warn=warn, **({"min": bound} if higher else {"max": bound}))
    v = evaluate(claim, [1.0] * len(ratios), ratios)
    lo, hi = v.ci
    eff = bound - tolerance if higher else bound + tolerance
    beyond = hi < eff if higher else lo > eff
    assert (v.outcome == "fail") == beyond
    if lo < eff < hi:
        assert v.outcome == "warn"
    if v.outcome == "pass":
        assert (lo >= eff and v.quantity >= eff + warn) if higher else \
            (hi <= eff and v.quantity <= eff - warn)


# --- verdict quality of the regression gate ------------------------------------------------------

def test_regression_gate_quality():
    """The gate "candidate is not slower than baseline" at DEFAULT_ROUNDS rounds, 10% noise per sample.

    200 A/A comparisons may fail at most 1% of the time; a true 20% slowdown must fail in >= 95%.
    """
    gate = _claim(kind="ratio", direction="lower", max=1.0, tolerance=GATE_TOLERANCE, warn=GATE_WARN)
    trials = 200
    rng = np.random.default_rng(2026)
    base = np.exp(rng.normal(0, 0.10, (2, trials, DEFAULT_ROUNDS)))
    cand = np.exp(rng.normal(0, 0.10, (2, trials, DEFAULT_ROUNDS))) * np.array([1.0, 1.2])[:, None, None]
    outcomes = [[evaluate(gate, b, c, seed=i).outcome for i, (b, c) in enumerate(zip(base[k], cand[k]))]
                for k in range(2)]
    aa_fails = outcomes[0].count("fail")
    slow_caught = outcomes[1].count("fail")
    assert aa_fails <= 0.01 * trials, f"A/A false fails: {aa_fails}/{trials}"
    assert slow_caught >= 0.95 * trials, f"20% slowdown caught: {slow_caught}/{trials}"
    assert "pass" in outcomes[0] and "pass" not in outcomes[1]   # the gate still lets A/A through
