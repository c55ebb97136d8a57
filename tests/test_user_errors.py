"""A user's mistake gets one line naming the bad value, a non-zero exit, and no traceback (issue 19).

Table-driven: every ``hpcnet`` subcommand with bad inputs, then the plugin's options in a pytest run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (arguments, what the error line must name); {d} is a scratch directory holding good.json (a real run
# record), garbage.json, run.html, a plain file notadir and runs/ (holding a copy of good.json)
CLI_CASES = [
    (["report", "{d}/garbage.json"], "garbage.json"),
    (["report", "{d}/missing.json"], "missing.json"),
    (["report", "{d}"], "not a run record"),
    (["report", "{d}/good.json", "-o", "{d}/notadir"], "notadir"),
    (["compare", "{d}/good.json", "{d}/run.html"], "run.html"),
    (["compare", "{d}/missing.json", "{d}/good.json"], "missing.json"),
    (["compare", "{d}/good.json", "{d}/good.json", "--factor", "0.5"], "factor"),
    (["rpc", "ping", "127.0.0.1:1", "--timeout", "0"], "--timeout"),
    (["rpc", "ping", "127.0.0.1:1", "--size", "200000000"], "200000000"),
    (["rpc", "ping", "127.0.0.1:1", "--count", "0"], "--count"),
    (["rpc", "ping", "nohost"], "nohost"),
    (["probe", "--cluster", "bogus:3"], "bogus:3"),
    (["probe", "--root", "{d}/missing"], "missing"),
    (["teragen", "abc", "{d}/out"], "abc"),
    (["terasort", "{d}/missing", "{d}/out"], "missing"),
    (["dfsio", "-write", "-nrFiles", "0", "-size", "1MB"], "-nrFiles"),
    (["dfsio", "-write", "-nrFiles", "1", "-size", "1XB"], "1XB"),
    (["dfsio", "-write", "-nrFiles", "1", "-size", "1MB", "--fs", "posix:{d}/missing/x"], "missing/x"),
    (["dfsio", "-write", "--bogus", "1"], "--bogus"),
    (["qjump", "run", "-p", "9", "--", "true"], "9"),
    (["asv-import", "{d}/garbage.json", "--into", "{d}/asv"], "garbage.json"),
    (["asv-import", "{d}/missing.json", "--into", "{d}/asv"], "missing.json"),
    (["asv-import", "{d}", "--into", "{d}/asv"], "a directory"),
    (["asv-import", "{d}/good.json", "--into", "{d}/notadir"], "notadir"),
    (["history", "--dir", "{d}/missing"], "missing"),
    (["history", "--dir", "{d}/notadir"], "notadir"),
    (["history", "no.such.claim", "--dir", "{d}/runs"], "no.such.claim"),
    (["history", "--dir", "{d}", "--html", "{d}/x.html"], "CLAIM_ID"),
    (["compare", "{d}/runs/good.json", "--against", "previous"], "no earlier run"),
    (["compare", "{d}/good.json", "--against", "latest"], "latest"),
    (["compare", "{d}/good.json", "{d}/good.json", "--against", "previous"], "--against"),
    (["compare", "{d}/good.json"], "--against previous"),
    (["export", "{d}/good.json", "--format", "xml"], "xml"),
    (["export", "{d}/garbage.json", "--format", "csv"], "garbage.json"),
    (["export", "{d}/missing.json", "--format", "influx"], "missing.json"),
    (["export", "{d}/good.json", "--format", "csv", "-o", "{d}/notadir/x.csv"], "notadir"),
    (["qjump-config", "--bytesq", "-5"], "-5"),
    (["asv-site", "fetch", "/proc/nope"], "/proc/nope"),
    (["asv-site", "localize", "{d}/missing"], "missing"),
    (["plot", "cdf", "{d}/missing.bs", "label"], "missing.bs"),
    (["teravalidate", "{d}/missing", "{d}/report"], "missing"),
    (["randomwriter", "--bytes", "abc", "{d}/rw"], "abc"),
    (["sort", "{d}/missing", "{d}/out"], "missing"),
    (["sortvalidate", "{d}/missing", "{d}/out"], "missing"),
    (["rpc", "serve", "--port", "99999"], "99999"),
    (["crosscheck", "--config", "bogus", "--", "teragen", "1M"], "bogus"),
    (["vm", "build", "--cache", "/proc/x"], "/proc/x"),
    (["vm", "test", "--timeout", "0"], "--timeout"),
    (["vm", "test", "--results", "{d}/notadir"], "notadir"),
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad-inputs")
    (d / "garbage.json").write_text("garbage\n")
    (d / "run.html").write_text("<html></html>\n")
    (d / "notadir").write_text("")
    from pytest_hpcnet.measure import measurement
    from pytest_hpcnet.results import RunRecord
    record = RunRecord(run_id="good", provenance={"time": "2026-12-01T00:00:00+00:00"}, measurements=[
        measurement("rpc.echo.rtt", [1.0, 2.0], unit="us", direction="lower", config="transport=tcp")])
    record.write(d)
    record.write(d / "runs")     # a directory of run records with nothing else in it
    return d


def _hpcnet(args, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest_hpcnet.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


@pytest.mark.parametrize("args, names", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_a_bad_input_to_hpcnet_is_one_line(scratch, args, names):
    args = [a.replace("{d}", str(scratch)) for a in args]
    result = _hpcnet(args, scratch)
    out = result.stdout + result.stderr
    assert result.returncode not in (0, None), out
    assert "Traceback" not in out, out
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, out
    assert lines[-1].startswith("hpcnet ") and names in lines[-1], out
    if not lines[0].startswith("usage:"):   # argparse's own errors come after its usage lines
        assert len(lines) == 1, out


def test_version_and_dfsio_usage(scratch):
    version = _hpcnet(["--version"], scratch)
    assert version.returncode == 0 and version.stdout.startswith("hpcnet ")
    usage = _hpcnet(["dfsio", "--help"], scratch)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: hpcnet dfsio")
    assert not (scratch / "missing").exists()   # no bad input above made a directory


# -- the plugin's options ---------------------------------------------------------------------------

PLUGIN_CASES = [
    (["--hpcnet-report=/proc/x"], "/proc/x"),
    (["--hpcnet-report={d}/notadir/x"], "notadir"),
    (["--hpcnet-sysroot={d}/missing"], "missing"),
    (["--hpcnet-rounds=1"], "--hpcnet-rounds"),
    (["--hpcnet-cluster=bogus:3"], "bogus:3"),
    (["--hpcnet-claims={d}/missing.toml"], "missing.toml"),
    (["--hpcnet-assume=ib_qrd"], "ib_qdr"),
    (["--hpcnet-verdicts=maybe"], "maybe"),
    (["--hpcnet-probe-errors=ignore"], "ignore"),
    (["--hpcnet-tables=wide"], "wide"),
    (["--hpcnet-target=bogus"], "bogus"),
    (["--hpcnet-max-rounds=1"], "--hpcnet-max-rounds"),
    (["--hpcnet-canary=abc"], "abc"),
    (["--hpcnet-asv={d}/notadir/asv"], "notadir"),
    (["-o", "hpcnet_strict_warn=maybe"], "maybe"),
]


def _leaf_commands(parser, prefix=()) -> list[tuple[str, ...]]:
    import argparse
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    return [leaf for name, p in subs[0].choices.items() for leaf in _leaf_commands(p, prefix + (name,))]


def test_the_tables_cover_every_subcommand_and_plugin_option():
    """Issue 19's acceptance: every `hpcnet` subcommand and every plugin option is in the tables above."""
    from pytest_hpcnet.cli import build_parser
    from pytest_hpcnet.options import SETTINGS
    missing = [" ".join(leaf) for leaf in _leaf_commands(build_parser())
               if not any(tuple(args[:len(leaf)]) == leaf for args, _ in CLI_CASES)]
    assert not missing, f"subcommands without a bad-input case: {missing}"
    named = " ".join(" ".join(args) for args, _ in PLUGIN_CASES)
    assert not [s.flag for s in SETTINGS if s.flag not in named and s.ini not in named], named


@pytest.mark.parametrize("args, names", PLUGIN_CASES, ids=[" ".join(a) for a, _ in PLUGIN_CASES])
def test_a_bad_plugin_option_is_one_line(pytester, args, names):
    (pytester.path / "notadir").write_text("")
    pytester.makepyfile("def test_x(): pass")
    args = [a.replace("{d}", str(pytester.path)) for a in args]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = [line for line in result.stderr.lines if line.strip()]
    assert len(err) == 1 and err[0].startswith("ERROR: pytest-hpcnet: ") and names in err[0], err
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


INVENTORY = """
[cluster]
name = "two"
workdir = "work"

[[nodes]]
name = "good"
host = "127.0.0.1"

[[nodes]]
name = "bad"
host = "127.0.0.1"
sysroot = "missing-tree"
"""


def test_a_failed_probe_stops_the_run_unless_told_to_warn(pytester, tmp_path):
    (pytester.path / "two.toml").write_text(INVENTORY)
    pytester.makepyfile("def test_x(): pass")
    report = f"--hpcnet-report={tmp_path / 'report'}"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hpcnet-cluster=two.toml", report,
                                           timeout=240)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    [line] = [x for x in result.stderr.lines if x.strip()]
    assert "hardware probe failed on bad:" in line and "missing-tree" in line and "--hpcnet-probe-errors=warn" in line
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hpcnet-cluster=two.toml", report,
                                           "--hpcnet-probe-errors=warn", timeout=240)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["hpcnet: cluster *two.toml*: 2 node(s) good, bad; target reference*",
                                 "hpcnet: features: good: *; bad: PROBE FAILED",
                                 "hpcnet: WARNING hardware probe failed on bad: *missing-tree*"])


def test_the_session_header_names_cluster_target_nodes_and_features(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hpcnet-cluster=local:2",
                                           f"--hpcnet-sysroot={ROOT / 'fixtures' / 'sysfs' / 'qdr-westmere'}")
    result.stdout.fnmatch_lines(["hpcnet: cluster local:2: 2 node(s) node0, node1; target reference *",
                                 "hpcnet: features: every node: *ib_qdr*"])


def test_help_shows_the_real_defaults(pytester):
    result = pytester.runpytest_subprocess("--help")
    text = " ".join(result.stdout.str().split())
    assert "default: 30)" in text and "default: /)" in text and "default: None" not in text


def test_a_record_that_cannot_be_written_is_one_line(pytester, tmp_path):
    """The directory checked at the start can go away before the end: the run says so in one line."""
    report = tmp_path / "report"
    pytester.makepyfile(f"""
        import shutil
        from pytest_hpcnet.measure import measurement

        def test_m(measure):
            measure.record(measurement("rpc.echo.rtt", [1.0, 2.0], unit="us", direction="lower",
                                       config="transport=tcp"))
            shutil.rmtree({str(report)!r}, ignore_errors=True)
            open({str(report)!r}, "w").close()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--hpcnet-report={report}", timeout=120)
    result.stdout.fnmatch_lines(["pytest-hpcnet: cannot write the run record into *report*"])
    assert result.ret != 0 and "Traceback" not in result.stdout.str()


def _leaves() -> list[tuple[str, ...]]:
    from pytest_hpcnet.cli import build_parser
    return _leaf_commands(build_parser())


@pytest.mark.parametrize("leaf", _leaves(), ids=" ".join)
def test_every_subcommand_prints_argparse_usage(leaf, capsys):
    """Issue 19: `dfsio --help` printed a docstring; every command's --help is its usage."""
    from pytest_hpcnet.cli import main
    try:
        code = main([*leaf, "--help"])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr().out
    assert code == 0 and out.startswith(f"usage: hpcnet {' '.join(leaf)}"), out[:200]
