"""hpcnet asv-import: run records become an asv project that asv's own publish and regression
detection read unchanged (the browser check of the published site is in test_browser.py)."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_hpcnet import asv_import, tracking
from pytest_hpcnet.cli import main
from pytest_hpcnet.results import load

SEED_BENCH = "claims.dfsio.seed001.throughput.rdma_vs_ipoib"


def asv_or_skip() -> str:
    asv = asv_import.asv_executable()
    if asv is None:
        pytest.skip("asv is not installed (pip install 'asv>=0.6.6,<0.7')")
    return asv


def run_asv_publish(store: Path, home: Path) -> dict:
    """``asv publish`` in the store as a user would run it; the published regressions.json."""
    asv = asv_or_skip()
    home.mkdir(exist_ok=True)
    done = subprocess.run([asv, "publish"], cwd=store, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Couldn't find" not in done.stdout + done.stderr   # every result's commit is on the branch
    return json.loads((store / "html" / "regressions.json").read_text())


def graph_points(store: Path, machine: str, bench: str) -> list:
    path = store / "html" / "graphs" / "branch-main" / f"machine-{machine}" / "target-reference" / f"{bench}.json"
    return [p for p in json.loads(path.read_text()) if p[1] is not None]


def test_three_nights_on_one_project_commit_are_three_points(nightly_records, tmp_path):
    three = nightly_records["three"]
    commits = {load(p).provenance["git"]["commit"] for p in three}
    versions = {load(p).provenance["target"]["version"] for p in three}
    assert len(commits) == 1 and len(versions) == 3      # the stack changed, this repo did not
    store = tmp_path / "asv"
    assert main(["asv-import", *map(str, three), "--into", str(store)]) == 0
    log = subprocess.run(["git", "-C", str(store / "repo"), "log", "--format=%H %at %s", "main"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(log) == 3
    times = [int(line.split()[1]) for line in log]
    assert times == sorted(times, reverse=True)          # newest first: commits in run order
    assert all(f"{nightly_records['cluster']}: reference" in line for line in log)
    tags = subprocess.run(["git", "-C", str(store / "repo"), "tag"], capture_output=True, text=True).stdout.split()
    commit = next(iter(commits))[:7]
    assert sorted(tags) == sorted(f"reference-{v}@{commit}" for v in versions)

    regressions = run_asv_publish(store, tmp_path / "home")
    points = graph_points(store, nightly_records["cluster"], SEED_BENCH)
    quantities = [load(p).verdicts[0]["quantity"] for p in three]
    assert [round(v, 6) for _, v in points] == [round(1 / q, 6) for q in quantities]   # lower is better
    assert regressions == {"regressions": []}
    index = json.loads((store / "html" / "index.json").read_text())
    machine = index["machines"][nightly_records["cluster"]]
    assert machine["nodes"].startswith("2: dn1, dn2") and "edr" in machine["features"] and "power8" in machine["features"]
    assert machine["target"] == "reference 2.10.0"
    bench = index["benchmarks"][SEED_BENCH]
    assert "&gt;= 2.18" in bench["code"] and "TestDFSIO throughput" in bench["code"]
    assert "at most 0.4587" in bench["unit"] and "(bound >= 2.18)" in bench["pretty_name"]


def test_a_night_25_percent_worse_is_an_asv_regression(nightly_records, tmp_path):
    store = tmp_path / "asv"
    assert main(["asv-import", *map(str, nightly_records["three"]), "--into", str(store)]) == 0
    assert main(["asv-import", str(nightly_records["elsewhere"]), str(nightly_records["worse"]),
                 "--into", str(store)]) == 0
    regressions = run_asv_publish(store, tmp_path / "home")["regressions"]
    flagged = {(r[0], r[1].split("/")[2]) for r in regressions}
    assert flagged == {(SEED_BENCH, f"machine-{nightly_records['cluster']}")}, regressions
    [(name, _, _, _, last, best, jumps)] = [r for r in regressions if r[0] == SEED_BENCH]
    assert last / best == pytest.approx(1 / 0.75, rel=0.01)           # 25% worse ratio = 1.33x the inverse
    assert len(graph_points(store, nightly_records["cluster"], SEED_BENCH)) == 4
    assert len(graph_points(store, "other-cluster", SEED_BENCH)) == 1   # its own machine, its own line
    # the higher-is-better throughput fell too: asv does not call that (or its rise) a regression
    conf = json.loads((store / "asv.conf.json").read_text())
    assert any(k.startswith("measured\\.dfsio\\.write\\.throughput") for k in conf["regressions_first_commits"])


def test_import_order_does_not_matter(nightly_records, tmp_path):
    paths = [*nightly_records["three"], nightly_records["worse"]]
    at_once, one_by_one = tmp_path / "a", tmp_path / "b"
    asv_import.import_records(at_once, paths)
    for path in reversed(paths):                      # the newest first, the oldest last
        asv_import.import_records(one_by_one, [path])
    asv_import.import_records(one_by_one, [paths[0]])   # a record imported twice is one run

    def heads(store):
        return subprocess.run(["git", "-C", str(store / "repo"), "rev-list", "main"], capture_output=True,
                              text=True, check=True).stdout.split()
    assert heads(at_once) == heads(one_by_one) and len(heads(at_once)) == 4
    files = sorted(p.relative_to(at_once / "results") for p in (at_once / "results").rglob("*.json"))
    assert files == sorted(p.relative_to(one_by_one / "results") for p in (one_by_one / "results").rglob("*.json"))


def _import_one(args):
    store, path = args
    return asv_import.import_records(Path(store), [Path(path)]).runs


def test_two_runs_importing_at_once_both_land(nightly_records, tmp_path):
    store = tmp_path / "asv"
    paths = [*nightly_records["three"], nightly_records["worse"]]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_import_one, [(str(store), str(p)) for p in paths])
    assert len(list((store / "records").glob("*.json"))) == 4
    assert len(subprocess.run(["git", "-C", str(store / "repo"), "rev-list", "main"], capture_output=True,
                              text=True, check=True).stdout.split()) == 4


def test_results_read_back_with_asvs_own_loader(nightly_records, tmp_path):
    asv_or_skip()
    from asv.results import iter_results
    store = tmp_path / "asv"
    asv_import.import_records(store, nightly_records["three"])
    results = list(iter_results(str(store / "results")))
    assert len(results) == 3
    assert all(r.params["machine"] == nightly_records["cluster"] for r in results)
    assert all(r.get_result_value(SEED_BENCH, []) for r in results)


def test_claims_are_oriented_so_that_up_is_worse():
    cases = [  # kind, direction, quantity, worse quantity
        ("ratio", "higher", 2.2, 1.65), ("ratio", "lower", 0.5, 0.7), ("reduction", "higher", 0.45, 0.3),
        ("reduction", "lower", 0.1, 0.2), ("absolute", "lower", 40.0, 50.0), ("absolute", "higher", 900.0, 700.0)]
    for kind, direction, good, bad in cases:
        form, unit = tracking.form_and_unit(kind, direction, "m", "B", "C")
        assert "(lower is better)" in unit
        assert tracking.oriented(form, kind, bad) > tracking.oriented(form, kind, good), (kind, direction)


def test_canary_and_unjudged_verdicts_give_no_value():
    verdict = {"claim_id": "x", "quantity": 0.5, "kind": "ratio", "direction": "lower", "bound": "<= 0.8",
               "injected": 0.2}
    assert asv_import.claim_tracked(verdict) is None
    assert asv_import.claim_tracked({**verdict, "injected": 0.0, "quantity": None}) is None
    old = {k: v for k, v in verdict.items() if k != "direction"} | {"injected": 0.0}   # an older record
    assert asv_import.claim_tracked(old).value == 0.5
    both = {**old, "bound": ">= 0.1 and <= 0.8"}
    assert "cannot tell" in asv_import.claim_tracked(both)


def test_the_plugin_adds_the_run_at_its_end(pytester, tmp_path):
    pytester.makepyfile("""
        from pytest_hpcnet.measure import measurement

        def test_m(measure):
            measure.record(measurement("rpc.echo.rtt", [5.0, 6.0, 5.5], unit="us", direction="lower",
                                       config="transport=tcp"))
    """)
    store = tmp_path / "asv"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--hpcnet-report={tmp_path / 'runs'}",
                                           f"--hpcnet-asv={store}", "--hpcnet-cluster=local:1", timeout=240)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"hpcnet asv: added to {store} (1 run(s), 1 benchmark(s))*"])
    bench = json.loads((store / "results" / "benchmarks.json").read_text())
    assert "measured.rpc.echo.rtt.transport_tcp" in bench
    shutil.rmtree(store / "records")
    (store / "records").write_text("")                # the next run cannot import: it says so and fails
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--hpcnet-report={tmp_path / 'runs'}",
                                           f"--hpcnet-asv={store}", "--hpcnet-cluster=local:1", timeout=240)
    result.stdout.fnmatch_lines([f"pytest-hpcnet: could not add the run to the asv project {store}*"])
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR and "Traceback" not in result.stdout.str()
    assert len(list((tmp_path / "runs").glob("*.json"))) == 2   # the record itself is kept


def test_a_cluster_keeps_its_machine_name_across_runs():
    assert asv_import.machine_name({"host": "login1.hpc", "cluster": {"name": "local:4", "source": "local:4"}}) \
        == "login1-local_4"
    assert asv_import.machine_name({"cluster": {"name": "openpower", "source": "fixtures/op.toml"}}) == "openpower"
    jobs = [{"cluster": {"name": f"slurm:ri2:{job}", "source": "slurm"}} for job in (101, 202)]
    assert {asv_import.machine_name(p) for p in jobs} == {"slurm-ri2"}     # one cluster, whatever the job
