"""`hpcnet compare`: matching, significance, direction and the exit status CI relies on."""

import numpy as np
import pytest

from pytest_hpcnet.cli import main
from pytest_hpcnet.compare import compare, compare_measurements
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.results import RunRecord

PROV = {"time": "2026-11-30T00:00:00+00:00", "host": "ci", "git": {"commit": None, "dirty": None},
        "cluster": {"source": "local:2"}, "target": {"name": "reference"}}


def _noisy(rng, median, n=200, cv=0.05):
    return median * rng.lognormal(0.0, cv, n)


def _run(run_id, seed, slow=None, factor=1.3):
    """A run with latency, throughput and job-time metrics; ``slow`` names one measurement made 30% worse."""
    rng = np.random.default_rng(seed)
    specs = [  # (metric, config, params, median, unit, direction)
        ("rpc.echo.latency", "tcp", {"size": 64}, 80.0, "us", "lower"),
        ("rpc.echo.latency", "tcp", {"size": 4096}, 95.0, "us", "lower"),
        ("rpc.echo.latency", "shm", {"size": 64}, 30.0, "us", "lower"),
        ("rpc.throughput", "tcp", {"clients": 4}, 20000.0, "calls/s", "higher"),
        ("mapreduce.terasort.time", "tcp", {"rows": 100000}, 12.0, "s", "lower"),
    ]
    ms = []
    for metric, config, params, median, unit, direction in specs:
        if slow == (metric, config, tuple(params.items())):
            median = median * factor if direction == "lower" else median / factor
        ms.append(measurement(metric, _noisy(rng, median), unit=unit, direction=direction, config=config,
                              params=params))
    return RunRecord(run_id=run_id, provenance=PROV, measurements=ms)


def _write(tmp_path, record):
    return str(record.write(tmp_path))


def test_injected_30_percent_slowdown_is_the_only_flag_and_exits_nonzero(tmp_path, capsys):
    slow = ("rpc.echo.latency", "tcp", (("size", 4096),))
    a, b = _run("a", seed=1), _run("b", seed=2, slow=slow)
    result = compare(a, b)
    assert len(result.changes) == 5
    flagged = [(c.metric, c.config, c.params) for c in result.changes if c.regression]
    assert flagged == [("rpc.echo.latency", "tcp", {"size": 4096})]
    change = result.regressions[0]
    assert change.ratio == pytest.approx(1.3, rel=0.03) and change.p_value < 1e-6

    code = main(["compare", _write(tmp_path, a), _write(tmp_path, b)])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("REGRESSION") == 1 and "rpc.echo.latency[tcp]" in out


def test_same_code_twice_passes(tmp_path, capsys):
    a, b = _run("a", seed=1), _run("b", seed=2)
    assert not compare(a, b).regressions
    assert main(["compare", _write(tmp_path, a), _write(tmp_path, b)]) == 0
    assert "REGRESSION" not in capsys.readouterr().out


def test_direction_is_respected_for_higher_is_better():
    rng = np.random.default_rng(3)
    fast = measurement("rpc.throughput", _noisy(rng, 1000.0), unit="calls/s", direction="higher", config="tcp")
    slow = measurement("rpc.throughput", _noisy(rng, 700.0), unit="calls/s", direction="higher", config="tcp")
    assert compare_measurements(fast, slow).regression          # throughput fell 30%
    up = compare_measurements(slow, fast)
    assert not up.regression and up.improvement                 # throughput rose: good news
    lat_a = measurement("x.latency", _noisy(rng, 100.0), unit="us", direction="lower", config="tcp")
    lat_b = measurement("x.latency", _noisy(rng, 70.0), unit="us", direction="lower", config="tcp")
    assert compare_measurements(lat_a, lat_b).improvement and not compare_measurements(lat_a, lat_b).regression


def test_factor_and_significance_both_needed():
    rng = np.random.default_rng(4)
    a = measurement("x.latency", _noisy(rng, 100.0, n=2000, cv=0.01), unit="us", direction="lower", config="c")
    b = measurement("x.latency", _noisy(rng, 105.0, n=2000, cv=0.01), unit="us", direction="lower", config="c")
    small = compare_measurements(a, b, factor=1.10)
    assert small.significant and not small.regression           # real but within the factor
    assert compare_measurements(a, b, factor=1.02).regression
    # a 30% jump seen in too few samples to tell: shown, never flagged
    few_a = measurement("x.latency", [100.0], unit="us", direction="lower", config="c")
    few_b = measurement("x.latency", [130.0], unit="us", direction="lower", config="c")
    one = compare_measurements(few_a, few_b)
    assert one.p_value is None and not one.regression and one.ratio == pytest.approx(1.3)
    # noisy samples that overlap heavily: a 30% median shift with 3 samples each is not significant
    na = measurement("x.latency", [50.0, 100.0, 200.0], unit="us", direction="lower", config="c")
    nb = measurement("x.latency", [60.0, 130.0, 190.0], unit="us", direction="lower", config="c")
    assert not compare_measurements(na, nb).significant


def test_matching_uses_metric_config_and_params():
    a = _run("a", seed=1)
    b = _run("b", seed=2)
    b.measurements[0].config = "verbs"          # no longer matches A's tcp size=64
    b.measurements[1].params = {"size": 8192}   # no longer matches A's size=4096
    result = compare(a, b)
    assert len(result.changes) == 3 and len(result.only_a) == 2 and len(result.only_b) == 2


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    a = _run("a", seed=1)
    with pytest.raises(ConfigError, match="factor"):
        compare(a, a, factor=0.9)
    with pytest.raises(ConfigError, match="alpha"):
        compare(a, a, alpha=1.5)
    b = _run("b", seed=1)
    b.measurements[0].unit = "ms"
    with pytest.raises(ConfigError, match="unit"):
        compare(a, b)
    assert main(["compare", str(tmp_path / "nope.json"), _write(tmp_path, a)]) == 2
    assert "nope.json" in capsys.readouterr().err


# --- fit for CI: nothing comparable, claims, labels, JSON ---------------------------------------

def test_nothing_comparable_exits_2_and_says_so(tmp_path, capsys):
    a = _run("a", seed=1)
    b = RunRecord(run_id="b", provenance=PROV, measurements=[
        measurement("other.metric", [1.0, 2.0], unit="s", direction="lower", config="x")])
    assert main(["compare", _write(tmp_path, a), _write(tmp_path, b)]) == 2
    err = capsys.readouterr().err
    assert "nothing to compare" in err and "5 measurement(s) in A, 1 in B" in err


def _verdict(cid, outcome):
    return {"claim_id": cid, "outcome": outcome, "quantity": None, "ci": None, "bound": "<= 1", "source": "s",
            "reason": "r"}


def test_a_claim_that_became_fail_is_reported_and_fails_the_gate(tmp_path, capsys):
    a, b = _run("a", seed=1), _run("b", seed=2)
    a.verdicts = [_verdict("c.same", "pass"), _verdict("c.flip", "pass"), _verdict("c.warned", "pass")]
    b.verdicts = [_verdict("c.same", "pass"), _verdict("c.flip", "fail"), _verdict("c.warned", "warn")]
    result = compare(a, b)
    assert [(c.claim_id, c.a, c.b) for c in result.claims] == [("c.flip", "pass", "fail"), ("c.warned", "pass", "warn")]
    assert main(["compare", _write(tmp_path, a), _write(tmp_path, b)]) == 1
    out = capsys.readouterr().out
    assert "NEW FAIL" in out and "1 claim(s) now FAIL: c.flip (was pass)" in out and "c.same" not in out
    # only verdicts in common, no measurements: still comparable
    a.measurements, b.measurements = [], []
    b.verdicts = a.verdicts
    assert main(["compare", _write(tmp_path, a), _write(tmp_path, b)]) == 0


def test_rows_are_labelled_with_the_params_that_tell_them_apart():
    a, b = _run("a", seed=1), _run("b", seed=2)
    for run in (a, b):
        for m in run.measurements:
            m.params = {**m.params, "round_trip": True, "rounds": 10}   # the same everywhere: not shown
    result = compare(a, b)
    labels = result.labels()
    shown = {(c.metric, c.config): [] for c in result.changes}
    for c in result.changes:
        shown[(c.metric, c.config)].append(labels[id(c)])
    assert sorted(shown[("rpc.echo.latency", "tcp")]) == ["size=4096", "size=64"]
    assert shown[("rpc.echo.latency", "shm")] == [""]


def test_json_output(tmp_path, capsys):
    slow = ("rpc.echo.latency", "tcp", (("size", 4096),))
    a, b = _run("a", seed=1), _run("b", seed=2, slow=slow)
    a.verdicts, b.verdicts = [_verdict("c.flip", "pass")], [_verdict("c.flip", "fail")]
    assert main(["compare", _write(tmp_path, a), _write(tmp_path, b), "--json"]) == 1
    import json
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_status"] == 1 and doc["comparable"] is True and len(doc["changes"]) == 5
    assert doc["regressions"] == ["rpc.echo.latency[tcp] size=4096"]
    assert doc["claims"] == [{"claim_id": "c.flip", "a": "pass", "b": "fail", "became_fail": True}]
