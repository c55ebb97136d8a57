"""Claims judged from what the run measured: a user's own claim needs no test that calls ``claim(...)``.

Unit tests of ``claims.measured_sides`` (which recorded samples a claim is judged on), then pytester
runs: the README's example claim given with ``--hpcnet-claims`` gets a verdict in the table and the record,
a claim no measurement reached says why, a claim a test judged is not judged twice (also under xdist), and a
claim that fails at the end of the run fails the run.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from pytest_hpcnet.claims import Claim, NotMeasured, evaluate, measured_sides, per_round
from pytest_hpcnet.measure import measurement

README = Path(__file__).resolve().parents[1] / "README.md"


def _claim(**kw) -> Claim:
    fields = dict(id="c", statement="s", metric="demo.time", baseline="transport=tcp", candidate="transport=shm",
                  kind="ratio", direction="lower", max=1.0, source="test")
    fields.update(kw)
    return Claim(**fields)


def _m(config, samples, test="t::a", metric="demo.time", **params):
    m = measurement(metric, samples, unit="s", direction="lower", config=config, params=params)
    m.test = test
    return m


BASE = [10.0, 10.5, 9.8, 10.2, 10.1, 9.9]


def test_sides_pair_the_claims_configurations_from_one_test():
    ms = [_m("transport=tcp", BASE), _m("transport=shm", [b / 2 for b in BASE]),
          _m("transport=tcp", BASE, test="t::other", size=1)]
    base, cand = measured_sides(_claim(), ms[:2])
    assert (base.config, cand.config) == ("transport=tcp", "transport=shm")
    assert base.samples == BASE and cand.samples == [b / 2 for b in BASE]
    assert evaluate(_claim(), base, cand).outcome == "pass"


def test_configuration_parts_in_any_order_and_params_the_configs_name_may_differ():
    claim = _claim(baseline="posix,fsync=close", candidate="fsync=none,posix", direction="higher", min=1.0,
                   max=None)
    ms = [_m("posix,fsync=close", BASE, fsync="close", size="2MB"),
          _m("posix,fsync=none", [b * 2 for b in BASE], fsync="none", size="2MB")]
    base, cand = measured_sides(claim, ms)
    assert cand.samples == [b * 2 for b in BASE]


def test_several_params_need_the_claims_params_to_choose():
    ms = [_m(c, BASE, size=s) for s in (64, 65536) for c in ("transport=tcp", "transport=shm")]
    with pytest.raises(NotMeasured, match=r"several params \(size=64; size=65536\).*params = \{"):
        measured_sides(_claim(), ms)
    base, cand = measured_sides(_claim(params={"size": 64}), ms)
    assert base.samples == BASE
    with pytest.raises(NotMeasured, match=r"no demo.time with size=1 \(measured with: size=64; size=65536\)"):
        measured_sides(_claim(params={"size": 1}), ms)


@pytest.mark.parametrize("ms,reason", [
    ([], "the run measured no demo.time"),
    ([_m("transport=tcp", BASE)], r"under transport=tcp, not 'transport=shm'"),
    ([_m("transport=tcp", BASE, test="t::a"), _m("transport=shm", BASE, test="t::b")], "not measured side by side"),
    ([_m("transport=tcp", BASE), _m("transport=shm", BASE[:4])], "6 rounds .* 4: not paired rounds"),
])
def test_what_was_not_measured_is_said(ms, reason):
    with pytest.raises(NotMeasured, match=reason):
        measured_sides(_claim(), ms)


def test_absolute_claim_needs_only_the_candidate():
    base, cand = measured_sides(_claim(kind="absolute", baseline=None, max=20.0), [_m("transport=shm", BASE)])
    assert base is None and cand.samples == BASE


def test_a_sweep_of_every_call_of_every_round_is_judged_on_per_round_medians():
    m = _m("transport=tcp", [1.0, 2.0, 3.0, 10.0, 20.0, 30.0], rounds=2)
    assert per_round(m) == [2.0, 20.0]
    assert per_round(_m("x", [1.0, 2.0, 3.0], rounds=2)) == [1.0, 2.0, 3.0]   # not equal slices: as recorded


# -- in a run ---------------------------------------------------------------------------------------

def readme_claim() -> str:
    """The README's first claims example, as a newcomer would copy it."""
    text = README.read_text()
    block = re.search(r"```toml\n(\[\[claim\]\].*?)```", text, re.S)
    assert block, "the README shows a [[claim]] example"
    return block.group(1)


def _records(tmp_path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "report").glob("*.json"))]


RTT_TEST = """
    from pytest_hpcnet.measure import measurement

    def test_rtt(measure):
        base = [20.0, 21.0, 19.5, 20.5, 20.2, 19.8, 20.1, 20.4, 19.9, 20.3]
        for config, factor in (("{baseline}", 1.0), ("{candidate}", {factor})):
            measure.record(measurement("{metric}", [b * factor for b in base], unit="us", direction="lower",
                                       config=config, params={{"size": 64}}))
"""


def _readme_run(pytester, run_hpcnet, factor, *args):
    text = readme_claim()
    fields = dict(re.findall(r'^(metric|baseline|candidate) = "([^"]+)"', text, re.M))
    markers = re.search(r"^markers = \[(.*)\]", text, re.M).group(1).replace('"', "").replace(" ", "")
    (pytester.path / "mine.toml").write_text(text)
    pytester.makepyfile(test_rtt=textwrap.dedent(RTT_TEST.format(factor=factor, **fields)))
    return run_hpcnet("--hpcnet-claims=mine.toml", *(f"--hpcnet-assume={m}" for m in markers.split(",") if m),
                      *args)


def test_readme_example_claim_is_judged_from_the_runs_measurements(pytester, run_hpcnet, tmp_path):
    """Issue 19: the README's claim, given with --hpcnet-claims, ran green and appeared nowhere."""
    claim_id = re.search(r'^id = "([^"]+)"', readme_claim(), re.M).group(1)
    result = _readme_run(pytester, run_hpcnet, 0.45)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*hpcnet claims*", f"*{claim_id}*PASS*"])
    [record] = _records(tmp_path)
    [verdict] = record["verdicts"]
    assert verdict["claim_id"] == claim_id and verdict["outcome"] == "pass"
    assert verdict["n"] == 10 and "judged at the end of the run" in verdict["reason"]


def test_a_user_claim_failing_at_the_end_fails_the_run(pytester, run_hpcnet, tmp_path):
    result = _readme_run(pytester, run_hpcnet, 0.9)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*claim failed the run: FAIL*"])
    result = _readme_run(pytester, run_hpcnet, 0.9, "--hpcnet-verdicts=report")
    assert result.ret == pytest.ExitCode.OK


def test_a_claim_measured_below_its_published_scale_is_reported_not_enforced(pytester, run_hpcnet, tmp_path):
    """Seed 002's claims hold at 100 GB on 6 nodes: a small rehearsal shows the verdict, never fails on it."""
    text = readme_claim() + "scale = {size = 1024}\n"
    fields = dict(re.findall(r'^(metric|baseline|candidate) = "([^"]+)"', text, re.M))
    markers = re.search(r"^markers = \[(.*)\]", text, re.M).group(1).replace('"', "").replace(" ", "")
    (pytester.path / "mine.toml").write_text(text)
    pytester.makepyfile(test_rtt=textwrap.dedent(RTT_TEST.format(factor=0.9, **fields)))
    result = run_hpcnet("--hpcnet-claims=mine.toml", *(f"--hpcnet-assume={m}" for m in markers.split(",") if m))
    assert result.ret == pytest.ExitCode.OK, "a FAIL below the claim's scale failed the run"
    [verdict] = _records(tmp_path)[0]["verdicts"]
    assert verdict["outcome"] == "fail" and verdict["enforced"] is False
    assert "below the published scale (size 64 < 1024)" in verdict["reason"]


def test_a_user_claim_nothing_measured_is_not_evaluated_with_the_reason(pytester, run_hpcnet, tmp_path):
    (pytester.path / "mine.toml").write_text(readme_claim())
    pytester.makepyfile(test_other="""
        from pytest_hpcnet.measure import measurement
        def test_x(measure):
            measure.record(measurement("rpc.echo.calls_per_second", [1.0, 2.0], unit="1/s", direction="higher",
                                       config="transport=tcp"))
    """)
    result = run_hpcnet("--hpcnet-claims=mine.toml", "--hpcnet-assume=ib_qdr,rdma,pyverbs")
    assert result.ret == pytest.ExitCode.OK
    [record] = _records(tmp_path)
    [verdict] = record["verdicts"]
    assert verdict["outcome"] == "not evaluated"
    assert "not measured in this run: the run measured no rpc.echo.rtt" in verdict["reason"]
    # without the hardware, it is n/a, and says which
    result = run_hpcnet("--hpcnet-claims=mine.toml")
    [_, record] = _records(tmp_path)
    assert record["verdicts"][0]["outcome"] == "n/a" and "ib_qdr" in record["verdicts"][0]["reason"]


JUDGED_BY_TEST = """
    import pytest
    from pytest_hpcnet.measure import measurement

    @pytest.mark.parametrize("i", range(4))
    def test_m(measure, claim, i):
        base = [10.0, 10.5, 9.8, 10.2, 10.1, 9.9]
        ms = [measurement("demo.time", [b * f for b in base], unit="s", direction="lower", config=c,
                          params={"i": i}) for c, f in (("slow", 1.0), ("fast", 0.5))]
        measure.record(*ms)
        if i == 0:
            claim("demo.judged", *ms)
"""

DEMO_CLAIMS = """
[vocabulary]
metrics = ["demo.time"]
configs = ["slow", "fast"]

[[claim]]
id = "demo.judged"
statement = "s"
metric = "demo.time"
kind = "ratio"
baseline = "slow"
candidate = "fast"
direction = "lower"
max = 0.8
params = {i = 0}
source = "test"

[[claim]]
id = "demo.late"
statement = "s"
metric = "demo.time"
kind = "ratio"
baseline = "slow"
candidate = "fast"
direction = "lower"
max = 0.8
params = {i = 3}
source = "test"
"""


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_claim_a_test_judged_is_not_judged_again(pytester, run_hpcnet, tmp_path, xdist):
    (pytester.path / "mine.toml").write_text(DEMO_CLAIMS)
    pytester.makepyfile(test_demo=JUDGED_BY_TEST)
    result = run_hpcnet("--hpcnet-claims=mine.toml", *xdist)
    result.assert_outcomes(passed=4)
    [record] = _records(tmp_path)
    verdicts = sorted((v["claim_id"], v["outcome"]) for v in record["verdicts"])
    assert verdicts == [("demo.judged", "pass"), ("demo.late", "pass")]
    late = next(v for v in record["verdicts"] if v["claim_id"] == "demo.late")
    assert "test_m[3]" in late["reason"]


OWNED_BY_TEST = """
    import pytest
    from pytest_hpcnet.measure import measurement

    def _record(measure):
        base = [10.0, 10.5, 9.8, 10.2, 10.1, 9.9]
        ms = [measurement("demo.time", [b * f for b in base], unit="s", direction="lower", config=c,
                          params={"i": 0}) for c, f in (("slow", 1.0), ("fast", 0.5))]
        measure.record(*ms)
        return ms

    def test_measures(measure):
        _record(measure)

    @pytest.mark.parametrize("claim_id", ["demo.judged"])
    def test_owner(claim_id, measure, claim):
        claim(claim_id, *_record(measure))
"""


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_claim_its_own_deselected_test_owns_is_not_judged_from_other_measurements(pytester, run_hpcnet,
                                                                                     tmp_path, xdist):
    """A test parametrized by a claim id owns that claim: deselected, the claim stays 'not evaluated' even
    when another test measured the same configurations (as a paper claim's scale differs from another's)."""
    (pytester.path / "mine.toml").write_text(DEMO_CLAIMS)
    pytester.makepyfile(test_demo=OWNED_BY_TEST)
    result = run_hpcnet("--hpcnet-claims=mine.toml", "-k", "measures", *xdist)
    result.assert_outcomes(passed=1)   # (xdist reports no deselected count to the controller)
    [record] = _records(tmp_path)
    verdicts = {v["claim_id"]: v for v in record["verdicts"]}
    assert verdicts["demo.judged"]["outcome"] == "not evaluated"
    assert "its own test" in verdicts["demo.judged"]["reason"]
    assert verdicts["demo.late"]["outcome"] != "pass"       # i=3 was not measured: not judged either
