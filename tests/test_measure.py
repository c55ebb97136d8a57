"""Unit tests for pytest_hpcnet.measure: summary statistics, paired rounds, bootstrap CIs."""

import json
import math

import numpy as np
import pytest

from pytest_hpcnet.measure import (DEFAULT_ROUNDS, Measurement, Paired, RatioCI, measurement,
                                   median_ci, ratio_ci, run_paired, summarize)


# --- summarize -----------------------------------------------------------------------------------

def test_summarize_matches_hand_computed_values():
    s = summarize([4, 1, 10, 3, 2])
    # sorted 1 2 3 4 10; deviations from mean 4: -3 -2 -1 0 6 -> sum of squares 50, /(n-1) = 12.5
    # p99 is at rank 0.99*(5-1) = 3.96: 4 + 0.96*(10-4) = 9.76; p99.9 at 3.996: 4 + 0.996*6 = 9.976
    assert s == pytest.approx({"n": 5, "min": 1.0, "median": 3.0, "mean": 4.0,
                               "stdev": math.sqrt(12.5), "p99": 9.76, "p99_9": 9.976, "max": 10.0})
    assert set(s) == {"n", "min", "median", "mean", "stdev", "p99", "p99_9", "max"}
    assert isinstance(s["n"], int) and all(isinstance(v, float) for k, v in s.items() if k != "n")
    json.dumps(s)  # plain Python numbers, storable in a run record


def test_summarize_even_count_median_and_single_sample():
    assert summarize([1.0, 2.0, 3.0, 4.0])["median"] == 2.5
    one = summarize([7.5])
    assert one == {"n": 1, "min": 7.5, "median": 7.5, "mean": 7.5, "stdev": 0.0,
                   "p99": 7.5, "p99_9": 7.5, "max": 7.5}


@pytest.mark.parametrize("bad, match", [([], "no samples"), ((), "no samples"),
                                         ([1.0, float("nan")], "NaN"), ([1.0, math.inf], "infinity"),
                                         (["fast"], "not a sequence of numbers"),
                                         ([[1, 2], [3, 4]], "flat sequence")])
def test_summarize_rejects_bad_samples(bad, match):
    with pytest.raises(ValueError, match=match):
        summarize(bad)


def test_summarize_accepts_generators_and_numpy():
    assert summarize(x for x in (3, 1, 2))["median"] == 2.0
    assert summarize(np.array([1.0, 3.0]))["mean"] == 2.0


# --- measurement ---------------------------------------------------------------------------------

def test_measurement_uses_median_and_summary():
    m = measurement("rpc.echo.latency", [30, 10, 20, 1000], unit="us", direction="lower",
                    config="transport=tcp", nodes=["n0", "n1"], params={"size": 64})
    assert isinstance(m, Measurement)
    assert m.value == 25.0           # median, not the outlier-dragged mean
    assert m.stats == summarize([30, 10, 20, 1000])
    assert m.samples == [30.0, 10.0, 20.0, 1000.0]
    assert m.nodes == ("n0", "n1") and m.params == {"size": 64} and m.config == "transport=tcp"
    assert Measurement.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_measurement_rejects_bad_direction_and_empty_samples():
    with pytest.raises(ValueError, match="direction"):
        measurement("m", [1.0], unit="s", direction="faster", config="c")
    with pytest.raises(ValueError, match="m: no samples"):
        measurement("m", [], unit="s", direction="lower", config="c")


# --- run_paired ----------------------------------------------------------------------------------

def _recorder(log, name):
    """A callable that logs each call and returns how many times it has been called so far."""
    calls = []

    def sample():
        calls.append(None)
        log.append(name)
        return float(len(calls))
    return sample


def test_run_paired_warms_up_then_alternates_order_per_round():
    log = []
    p = run_paired(_recorder(log, "A"), _recorder(log, "B"), rounds=4, warmup=2,
                   baseline_name="tcp", candidate_name="shm")
    assert log == ["A", "B", "A", "B",              # warm-up, discarded
                   "A", "B", "B", "A", "A", "B", "B", "A"]  # ABBA: first mover alternates
    # warm-up calls 1 and 2 are discarded; the samples are each side's own calls 3..6
    assert p == Paired("tcp", "shm", [3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0])
    assert p.rounds == 4


def test_run_paired_cancels_linear_drift():
    # The machine slows down by one unit per call; with a fixed A-then-B order B would always look
    # slower. With alternating order the per-side sums are equal.
    clock = iter(range(1000))
    p = run_paired(lambda: next(clock), lambda: next(clock), rounds=DEFAULT_ROUNDS, warmup=1)
    assert DEFAULT_ROUNDS % 2 == 0
    assert sum(p.baseline) == sum(p.candidate)


def test_run_paired_without_warmup():
    log = []
    run_paired(_recorder(log, "A"), _recorder(log, "B"), rounds=2, warmup=0)
    assert log == ["A", "B", "B", "A"]


@pytest.mark.parametrize("kwargs, match", [({"rounds": 1}, "rounds must be an integer >= 2"),
                                           ({"rounds": 2.5}, "rounds"),
                                           ({"rounds": True}, "rounds"),
                                           ({"rounds": 4, "warmup": -1}, "warmup")])
def test_run_paired_rejects_bad_counts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_paired(lambda: 1.0, lambda: 1.0, **kwargs)


def test_run_paired_names_side_and_round_of_a_bad_sample():
    values = iter([1.0, None])
    with pytest.raises(ValueError, match=r"shm \(round 1\) returned None"):
        run_paired(lambda: 1.0, lambda: next(values), rounds=3, warmup=0, candidate_name="shm")
    with pytest.raises(ValueError, match=r"tcp \(warm-up 0\) returned nan"):
        run_paired(lambda: float("nan"), lambda: 1.0, rounds=2, baseline_name="tcp")


def test_paired_rejects_unequal_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        Paired("a", "b", [1.0, 2.0], [1.0])


# --- ratio_ci / median_ci ------------------------------------------------------------------------

def test_ratio_ci_exact_ratio_has_zero_width():
    base = [1.0, 2.0, 4.0, 8.0]
    assert ratio_ci(base, [3 * b for b in base]) == RatioCI(3.0, 3.0, 3.0, 4, 0.875)   # exact: 4 rounds


def test_ratio_ci_uses_paired_rounds():
    # Baselines drift 100x across rounds but each round's candidate is 0.5x its baseline: pairing
    # makes the ratio exact, where comparing unpaired medians would be swamped by the drift.
    base = np.geomspace(1, 100, 12)
    r = ratio_ci(base, base * 0.5)
    assert (r.ratio, r.lo, r.hi) == pytest.approx((0.5, 0.5, 0.5))


def test_ratio_ci_contains_true_ratio_for_clean_data():
    # Clean = the baseline drifts a lot, the per-round noise on the ratio is small and balanced
    # (+-5% at most, symmetric in log), so the true ratio is the median of the paired ratios.
    rng = np.random.default_rng(7)
    base = 10 * np.exp(rng.normal(0, 0.3, 21))
    cand = 2.5 * base * np.exp(rng.permutation(np.linspace(-0.05, 0.05, 21)))
    r = ratio_ci(base, cand)
    assert r.n == 21
    assert r.ratio == pytest.approx(2.5)
    assert r.lo < 2.5 < r.hi
    assert r.hi / r.lo < 1.1


def test_ratio_ci_coverage_is_near_nominal():
    # 200 independent experiments: a 95% interval should contain the true ratio about 95% of the
    # time (percentile bootstrap of a median undercovers a little at small n; allow for that).
    rng = np.random.default_rng(11)
    base = np.exp(rng.normal(0, 0.1, (200, DEFAULT_ROUNDS)))
    cand = 1.3 * np.exp(rng.normal(0, 0.1, (200, DEFAULT_ROUNDS)))
    hits = sum(r.lo <= 1.3 <= r.hi for r in (ratio_ci(b, c, seed=i)
                                              for i, (b, c) in enumerate(zip(base, cand))))
    assert 0.88 <= hits / 200 <= 0.995


def test_ratio_ci_is_deterministic_per_seed():
    rng = np.random.default_rng(3)
    base, cand = rng.uniform(1, 2, 15), rng.uniform(1, 2, 15)
    assert ratio_ci(base, cand, seed=5) == ratio_ci(base, cand, seed=5)
    assert ratio_ci(base, cand, seed=5).ratio == ratio_ci(base, cand, seed=6).ratio


def test_higher_confidence_gives_wider_interval():
    rng = np.random.default_rng(4)
    base, cand = rng.uniform(1, 2, 30), rng.uniform(1, 2, 30)
    narrow, wide = ratio_ci(base, cand, confidence=0.5), ratio_ci(base, cand, confidence=0.99)
    assert wide.lo <= narrow.lo and narrow.hi <= wide.hi and (wide.hi - wide.lo) > (narrow.hi - narrow.lo)


@pytest.mark.parametrize("base, cand, kwargs, match", [
    ([1.0, 2.0], [1.0], {}, "differ in length"),
    ([1.0, 0.0], [1.0, 1.0], {}, r"zero in round\(s\) \[1\]"),
    ([1.0], [1.0], {}, "at least 2 samples"),
    ([], [], {}, "no samples"),
    ([1.0, 2.0], [1.0, 3.0], {"confidence": 1.5}, "confidence"),
    ([1.0, 2.0], [1.0, 3.0], {"resamples": 10}, "resamples"),
])
def test_ratio_ci_rejects_bad_input(base, cand, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ratio_ci(base, cand, **kwargs)


def test_median_ci_brackets_the_median():
    point, lo, hi = median_ci([5.0, 1.0, 3.0, 2.0, 4.0, 9.0, 7.0])
    assert point == 4.0 and lo <= point <= hi and 1.0 <= lo and hi <= 9.0


# --- exact intervals for few rounds ----------------------------------------------------------------

@pytest.mark.parametrize("n, coverage, k", [(3, 0.75, 1), (5, 0.9375, 1), (6, 0.96875, 1), (9, 0.9609375, 2)])
def test_order_statistic_ci_reports_its_real_coverage(n, coverage, k):
    from pytest_hpcnet.measure import order_statistic_ci
    xs = list(range(n, 0, -1))
    point, lo, hi, cov = order_statistic_ci(xs)
    assert cov == pytest.approx(coverage) and (lo, hi) == (k, n + 1 - k) and point == (n + 1) / 2


def test_order_statistic_ci_covers_as_often_as_it_says():
    from pytest_hpcnet.measure import order_statistic_ci
    rng = np.random.default_rng(7)
    hits = sum(lo <= 0.0 <= hi for lo, hi in (order_statistic_ci(rng.normal(0, 1, 5))[1:3] for _ in range(4000)))
    assert abs(hits / 4000 - 0.9375) < 0.015
