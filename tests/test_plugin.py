"""The plugin end to end, through pytester: options, markers, skips, claims, records, xdist, cleanup."""

import json
import os
import textwrap

import pytest

MARKED = """
    import pytest

    @pytest.mark.ib_qdr
    def test_needs_qdr():
        pass

    def test_plain():
        pass
"""


def _records(tmp_path):
    return sorted((tmp_path / "report").glob("*.json"))


def test_qdr_tree_selects_and_runs_marked_test(pytester, run_hpcnet, sysfs):
    pytester.makepyfile(MARKED)
    result = run_hpcnet("-m", "ib_qdr", f"--hpcnet-sysroot={sysfs / 'qdr-westmere'}", "--strict-markers", "-rs")
    result.assert_outcomes(passed=1, deselected=1)


def test_plain_tree_skips_with_feature_and_nodes(pytester, run_hpcnet, sysfs):
    pytester.makepyfile(MARKED)
    result = run_hpcnet("-m", "ib_qdr", f"--hpcnet-sysroot={sysfs / 'plain-eth'}", "--hpcnet-cluster=local:2", "-rs")
    result.assert_outcomes(skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*requires ib_qdr*node0, node1*"])


def test_assume_declares_a_feature(pytester, run_hpcnet, sysfs):
    pytester.makepyfile(MARKED)
    result = run_hpcnet("-m", "ib_qdr", f"--hpcnet-sysroot={sysfs / 'plain-eth'}", "--hpcnet-assume=ib_qdr")
    result.assert_outcomes(passed=1, deselected=1)


def test_every_marker_is_registered(pytester):
    result = pytester.runpytest_subprocess("--markers")
    for name in ("ib_qdr", "edr", "power8", "lustre", "rdma", "netns", "roce", "eth_100g", "kvm"):
        result.stdout.fnmatch_lines([f"@pytest.mark.{name}:*"])


@pytest.mark.parametrize("inventory, expected", [
    ("[[nodes]]\nname = 'a'\nhost = 'h'\nworkdir = 'w'\nlauncher = 'teleport'\n", "*bad.toml*'a'*launcher*teleport*"),
    ("[[nodes]]\nname = 'a'\nworkdir = 'w'\n", "*bad.toml*'a'*host*"),
    ("[[nodes]\n", "*bad.toml*"),
])
def test_malformed_inventory_is_a_usage_error(pytester, run_hpcnet, inventory, expected):
    pytester.makepyfile("def test_x(): pass")
    (pytester.path / "bad.toml").write_text(inventory)
    result = run_hpcnet("--hpcnet-cluster=bad.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-hpcnet: {expected}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_bad_option_from_env_names_the_variable(pytester, run_hpcnet):
    pytester.makepyfile("def test_x(): pass")
    result = run_hpcnet(env={"HPCNET_ROUNDS": "one"})
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*$HPCNET_ROUNDS*whole number*"])


def test_unknown_assumed_feature_is_rejected(pytester, run_hpcnet):
    pytester.makepyfile("def test_x(): pass")
    result = run_hpcnet("--hpcnet-assume=warp_drive")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hpcnet-assume*warp_drive*"])


CLAIMS = """
[vocabulary]   # the metric and configurations of these tests' own measurements
metrics = ["demo.time"]
configs = ["slow", "fast"]

[[claim]]
id = "demo.faster"
statement = "the candidate takes at most 80% of the baseline's time"
metric = "demo.time"
kind = "ratio"
baseline = "slow"
candidate = "fast"
direction = "lower"
max = 0.8
tolerance = 0.0
warn = 0.0
markers = []
source = "test"

[[claim]]
id = "demo.paper"
statement = "needs a QDR fabric"
metric = "demo.time"
kind = "reduction"
baseline = "slow"
candidate = "fast"
direction = "higher"
min = 0.3
markers = ["ib_qdr"]
source = "seed 000"
"""

CLAIM_TEST = """
    import pytest
    from pytest_hpcnet.measure import Series, measurement

    def test_claim(measure, claim):
        base = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3, 10.1, 10.0, 10.2]
        cand = [b * {factor} for b in base]
        slow = measurement("demo.time", base, unit="s", direction="lower", config="slow")
        fast = measurement("demo.time", cand, unit="s", direction="lower", config="fast")
        measure.record(slow, fast)
        claim("demo.faster", slow, fast)

    @pytest.mark.ib_qdr
    def test_paper(claim):
        claim("demo.paper", Series("demo.time", "slow", [1.0] * 4), Series("demo.time", "fast", [0.5] * 4))
"""


def _suite(pytester, factor):
    suite = pytester.mkdir("suites") / "demo"
    suite.mkdir()
    (suite / "claims.toml").write_text(CLAIMS)
    (suite / "test_demo.py").write_text(textwrap.dedent(CLAIM_TEST.replace("{factor}", str(factor))))


def test_passing_claim_is_recorded_with_table_and_json(pytester, run_hpcnet, tmp_path, sysfs):
    _suite(pytester, 0.5)
    result = run_hpcnet("suites", f"--hpcnet-sysroot={sysfs / 'plain-eth'}", "-rs", "--hpcnet-tables=full")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*hpcnet measurements*", "*demo.time*", "*fast*", "*hpcnet claims*",
                                 "*demo.faster*PASS*", "*demo.paper*N/A*", "*hpcnet run record:*"])
    [path] = _records(tmp_path)
    record = json.loads(path.read_text())
    outcomes = {v["claim_id"]: v["outcome"] for v in record["verdicts"]}
    assert outcomes == {"demo.faster": "pass", "demo.paper": "n/a"}
    assert len(record["measurements"]) == 2
    assert record["provenance"]["cluster"]["source"] == "local:4"
    assert [n["name"] for n in record["provenance"]["cluster"]["nodes"]] == [f"node{i}" for i in range(4)]


def test_tables_are_a_summary_under_q_compact_by_default_and_full_under_v(pytester, run_hpcnet, sysfs):
    """Issue 19: tables ran to 295 columns and printed in full under -q."""
    _suite(pytester, 0.5)
    sysroot = f"--hpcnet-sysroot={sysfs / 'plain-eth'}"
    quiet = run_hpcnet("suites", sysroot, "-q").stdout.str()
    assert "hpcnet measurements" not in quiet and "hpcnet claims" not in quiet
    assert "2 measurement(s) of 1 metric(s)" in quiet and "1 pass, 1 n/a" in quiet
    compact = run_hpcnet("suites", sysroot).stdout.str()
    assert "demo.faster" in compact and "demo.paper" not in compact and "Not listed: 1 n/a" in compact
    assert "median" not in compact   # one headline value per row; the distribution is for -v
    full = run_hpcnet("suites", sysroot, "-v").stdout.str()
    assert "demo.paper" in full and "median" in full and "source: seed 000" in full
    for text in (quiet, compact, full):
        # hpcnet's end-of-run part: from its first section (-q: the counts line); the header above it is
        # pytest's and its plugins' (hypothesis prints its profile's settings there in CI)
        table = text[min(i for i in (text.find("= hpcnet"), text.find("measurement(s) of")) if i >= 0):]
        lines = [line for line in table.splitlines() if not line.startswith("hpcnet run record: ")]  # a path
        assert max(len(line) for line in lines) <= 120, table


def test_failing_claim_fails_with_ratio_bound_and_source(pytester, run_hpcnet, sysfs):
    _suite(pytester, 1.0)
    result = run_hpcnet("suites", f"--hpcnet-sysroot={sysfs / 'plain-eth'}")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*demo.faster*1*0.8*test*"])


def test_report_mode_records_a_failed_claim_without_failing_its_test(pytester, run_hpcnet, tmp_path, sysfs):
    _suite(pytester, 1.0)
    result = run_hpcnet("suites", f"--hpcnet-sysroot={sysfs / 'plain-eth'}", "--hpcnet-verdicts=report",
                        "--hpcnet-assume=ib_qdr")
    result.assert_outcomes(passed=2, warnings=1)   # the paper claim ran too: its hardware was assumed
    result.stdout.fnmatch_lines(["*not enforced: --hpcnet-verdicts report*", "*demo.faster*FAIL*"])
    [path] = _records(tmp_path)
    outcomes = {v["claim_id"]: v["outcome"] for v in json.loads(path.read_text())["verdicts"]}
    assert outcomes == {"demo.faster": "fail", "demo.paper": "pass"}


def test_junitxml_carries_measurements_and_verdicts(pytester, run_hpcnet, sysfs):
    _suite(pytester, 0.5)
    run_hpcnet("suites", f"--hpcnet-sysroot={sysfs / 'plain-eth'}", "--junitxml=out.xml")
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="hpcnet.demo.time[fast]"' in xml
    assert 'name="hpcnet.claim.demo.faster" value="pass"' in xml


XDIST_TEST = """
    import pytest
    from pytest_hpcnet.measure import measurement

    @pytest.mark.parametrize("i", range(6))
    def test_m(measure, i):
        measure.record(measurement("demo.metric", [1.0 + i, 2.0 + i], unit="s", direction="lower",
                                   config=f"c{i}"))
"""


def test_xdist_gives_one_table_and_one_record(pytester, run_hpcnet, tmp_path):
    pytester.makepyfile(XDIST_TEST)
    result = run_hpcnet("-n", "2")
    result.assert_outcomes(passed=6)
    assert result.stdout.str().count("hpcnet measurements") == 1
    [path] = _records(tmp_path)
    record = json.loads(path.read_text())
    assert sorted(m["config"] for m in record["measurements"]) == [f"c{i}" for i in range(6)]
    assert {m["test"].split("::")[0] for m in record["measurements"]} == {"test_xdist_gives_one_table_and_one_record.py"}


LEAKY = """
    import os, sys, pytest

    def test_leaves_a_server_running(cluster, launchers):
        proc = launchers.start(cluster.nodes[0], [sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.environ["PIDFILE"], "w") as f:
            f.write(str(proc.pid))
        {end}
"""


@pytest.mark.parametrize("end", ["pass", "assert False", "raise KeyboardInterrupt"])
def test_no_process_is_left_behind(pytester, run_hpcnet, end):
    pytester.makepyfile(textwrap.dedent(LEAKY.replace("{end}", end)))
    pidfile = pytester.path / "pid"
    run_hpcnet(env={"PIDFILE": str(pidfile)})
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
