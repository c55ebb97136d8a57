"""The verdict rules and the gates' own checks, end to end through pytester: each rule of the README's
"How a verdict is reached", the canary, --hpcnet-strict-warn, report-only claims, claims left
unevaluated, and samples that are not what the claim names."""

import json
import textwrap

CLAIMS = """
[vocabulary]   # the metric and configurations of these tests' own measurements
metrics = ["demo.time"]
configs = ["slow", "fast"]

[[claim]]
id = "rule.pass"
statement = "clearly inside the bound"
metric = "demo.time"
baseline = "slow"
candidate = "fast"
kind = "ratio"
direction = "lower"
max = 1.0
tolerance = 0.5
warn = 0.05
source = "local: test"

[[claim]]
id = "rule.warn_band"
statement = "the warn band is measured from the stated bound (1.0), not from 1.0 + tolerance"
metric = "demo.time"
baseline = "slow"
candidate = "fast"
kind = "ratio"
direction = "lower"
max = 1.0
tolerance = 0.5
warn = 0.05
source = "local: test"

[[claim]]
id = "rule.tolerance"
statement = "the tolerance only moves the fail threshold: 1.2 is beyond 1.0 but not beyond 1.5"
metric = "demo.time"
baseline = "slow"
candidate = "fast"
kind = "ratio"
direction = "lower"
max = 1.0
tolerance = 0.5
source = "local: test"

[[claim]]
id = "rule.fail"
statement = "beyond the bound plus the tolerance"
metric = "demo.time"
baseline = "slow"
candidate = "fast"
kind = "ratio"
direction = "lower"
max = 1.0
tolerance = 0.5
source = "local: test"

[[claim]]
id = "rule.seed003"
statement = "the issue's example: min 0.42, tolerance 0.05, warn 0.03, CI [0.38, 0.41]"
metric = "demo.time"
baseline = "slow"
candidate = "fast"
kind = "reduction"
direction = "higher"
min = 0.42
tolerance = 0.05
warn = 0.03
source = "seed 003 (shape of)"

[[claim]]
id = "rule.report_only"
statement = "a report-only claim"
metric = "demo.time"
baseline = "slow"
candidate = "fast"
kind = "ratio"
direction = "lower"
max = 1.0
verdicts = "report"
why = "too noisy here"
source = "local: test"

[[claim]]
id = "rule.skipped"
statement = "its test is skipped"
metric = "demo.time"
baseline = "slow"
candidate = "fast"
kind = "ratio"
direction = "lower"
max = 1.0
source = "local: test"
"""

TESTS = """
    import pytest
    from pytest_hpcnet.measure import Series

    ROUNDS = 12

    def sides(ratios):
        base = [10.0 + 0.1 * (i % 3) for i in range(ROUNDS)]
        return Series("demo.time", "slow", base), Series("demo.time", "fast", [b * r for b, r in zip(base, ratios)])

    def test_pass(claim):
        claim("rule.pass", *sides([0.8] * ROUNDS))

    def test_warn_band(claim):
        claim("rule.warn_band", *sides([0.97] * ROUNDS))

    def test_tolerance(claim):
        claim("rule.tolerance", *sides([1.2] * ROUNDS))

    def test_fail(claim):
        claim("rule.fail", *sides([1.6] * ROUNDS))

    def test_seed003(claim):
        # reductions spread evenly over 0.38..0.41: the CI lies inside [0.38, 0.41]
        claim("rule.seed003", *sides([1 - (0.38 + 0.03 * i / (ROUNDS - 1)) for i in range(ROUNDS)]))

    def test_report_only(claim):
        claim("rule.report_only", *sides([1.6] * ROUNDS))

    def test_skipped(claim):
        pytest.skip("needs a second host")
"""


def _suite(pytester, tests=TESTS):
    suite = pytester.mkdir("suites") / "demo"
    suite.mkdir()
    (suite / "claims.toml").write_text(CLAIMS)
    (suite / "test_rules.py").write_text(textwrap.dedent(tests))


def _verdicts(tmp_path) -> dict:
    [record] = sorted((tmp_path / "report").glob("*.json"))
    return {v["claim_id"]: v for v in json.loads(record.read_text())["verdicts"]}


def test_each_rule_gives_its_outcome(pytester, run_hpcnet, tmp_path):
    _suite(pytester)
    result = run_hpcnet("suites", "-rs")
    result.assert_outcomes(passed=5, failed=1, skipped=1, warnings=4)
    v = _verdicts(tmp_path)
    outcome = {cid: d["outcome"] for cid, d in v.items()}
    assert outcome == {"rule.pass": "pass", "rule.warn_band": "warn", "rule.tolerance": "warn",
                       "rule.fail": "fail", "rule.seed003": "warn", "rule.report_only": "fail",
                       "rule.skipped": "not evaluated"}
    assert "warn band 0.05 of the stated maximum 1" in v["rule.warn_band"]["reason"]
    assert "whole CI above the stated maximum 1, within the tolerance" in v["rule.tolerance"]["reason"]
    assert "whole CI above 1.5" in v["rule.fail"]["reason"]
    lo, hi = v["rule.seed003"]["ci"]
    assert 0.38 <= lo <= hi <= 0.41 and "whole CI below the stated minimum 0.42" in v["rule.seed003"]["reason"]
    assert v["rule.report_only"]["enforced"] is False
    assert "needs a second host" in v["rule.skipped"]["reason"]
    # warns are visible in the summary, not only in the record
    result.stdout.fnmatch_lines(["*hpcnet claims*", "*3 warn*", "*WARN rule.warn_band*"])
    # a local gate's sensitivity: 0.8 first fails (beyond 1.5) at +100%, 1.2 at +30% (1.56)
    assert v["rule.pass"]["sensitivity"] == 1.0 and v["rule.tolerance"]["sensitivity"] == 0.3


def test_strict_warn_fails_a_warning_claim(pytester, run_hpcnet, tmp_path):
    _suite(pytester)
    result = run_hpcnet("suites", "--hpcnet-strict-warn")
    result.assert_outcomes(passed=2, failed=4, skipped=1)
    result.stdout.fnmatch_lines(["*WARN rule.warn_band*--hpcnet-strict-warn*"])


def test_canary_expects_every_enforced_local_gate_to_fail(pytester, run_hpcnet, tmp_path):
    _suite(pytester)
    result = run_hpcnet("suites", "--hpcnet-canary=20%")
    # pass (0.8 -> 0.96) and warn_band (0.97 -> 1.16) stay within 1.5: those gates cannot catch 20%
    result.stdout.fnmatch_lines(["*canary: this gate did not fail with 20% injected*rule.pass*"])
    v = _verdicts(tmp_path)
    assert v["rule.fail"]["injected"] == 0.2 and v["rule.fail"]["outcome"] == "fail"
    assert v["rule.seed003"]["injected"] == 0.0          # a paper claim is not a local gate
    assert v["rule.report_only"]["injected"] == 0.0      # nor is a report-only claim
    # caught: rule.fail; not gates, judged as usual: rule.seed003 (warn), rule.report_only (fail, reported)
    result.assert_outcomes(passed=3, failed=3, skipped=1)
    # the run as a whole names every enforced gate that was not caught, the skipped one too
    result.stdout.fnmatch_lines(["*canary: 4 enforced local gate(s) did not FAIL with 20% injected: rule.pass, "
                                 "rule.skipped, rule.tolerance, rule.warn_band*"])
    assert result.ret == 1


def test_canary_run_fails_when_an_enforced_gate_is_left_out(pytester, run_hpcnet, tmp_path):
    _suite(pytester)
    result = run_hpcnet("suites", "--hpcnet-canary=20%", "-k", "test_fail")
    result.assert_outcomes(passed=1, deselected=6)
    result.stdout.fnmatch_lines(["*canary: 4 enforced local gate(s) did not FAIL*"])
    assert result.ret == 1


def test_samples_of_another_configuration_are_refused(pytester, run_hpcnet, tmp_path):
    _suite(pytester, TESTS.replace('claim("rule.pass", *sides([0.8] * ROUNDS))',
                                   'claim("rule.pass", *reversed(sides([0.8] * ROUNDS)))'))
    result = run_hpcnet("suites", "-k", "test_pass")
    result.assert_outcomes(failed=1, deselected=6)
    result.stdout.fnmatch_lines(["*claim 'rule.pass' names baseline 'slow', but the samples are of 'fast'*"])


INVENTORY = """
[cluster]
name = "tiny"
launcher = "local"
claims = ["ours.toml"]

[[nodes]]
name = "node0"
host = "localhost"
addresses = { eth = "127.0.0.1" }
workdir = "work/node0"
"""


def test_a_clusters_override_changes_the_bound_used_and_the_record_says_so(pytester, run_hpcnet, tmp_path):
    _suite(pytester)
    pytester.path.joinpath("tiny.toml").write_text(INVENTORY)
    pytester.path.joinpath("ours.toml").write_text(
        '[[override]]\nid = "rule.pass"\nmax = 0.7\ntolerance = 0.0\nreason = "our fabric is faster"\n')
    result = run_hpcnet("suites", "--hpcnet-cluster=tiny.toml", "-k", "test_pass")
    result.assert_outcomes(failed=1, deselected=6)
    v = _verdicts(tmp_path)["rule.pass"]
    assert v["outcome"] == "fail" and v["bound"] == "<= 0.7 (warn band 0.05)"
    assert v["bound_from"].endswith("ours.toml (our fabric is faster)")
    result.stdout.fnmatch_lines(["*rule.pass*<= 0.7*(override)*"])


def test_a_gate_that_cannot_run_here_is_na_with_the_reason_and_the_canary_does_not_count_it(
        pytester, run_hpcnet, tmp_path):
    """``claim(id, None, unavailable=reason)``: what this run lacks (e.g. the native core where it is not
    built). The test skips with the reason, the record holds n/a, and the canary names only the gates
    that could have run."""
    _suite(pytester, TESTS.replace('pytest.skip("needs a second host")',
                                   'claim("rule.skipped", None, unavailable="the native core is not built here")'))
    result = run_hpcnet("suites", "--hpcnet-canary=20%", "-rs")
    v = _verdicts(tmp_path)
    assert v["rule.skipped"]["outcome"] == "n/a" and v["rule.skipped"]["reason"] == "the native core is not built here"
    result.stdout.fnmatch_lines(["*canary: 3 enforced local gate(s) did not FAIL with 20% injected: rule.pass, "
                                 "rule.tolerance, rule.warn_band*",
                                 "*SKIPPED*N/A rule.skipped*the native core is not built here*"])
