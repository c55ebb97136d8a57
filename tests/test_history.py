"""hpcnet history, compare --against previous, and run records written atomically by concurrent runs."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

import pytest

from pytest_hpcnet import history
from pytest_hpcnet.cli import main
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.results import RunRecord, load


@pytest.fixture
def runs_dir(nightly_records, tmp_path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    for p in [*nightly_records["three"], nightly_records["worse"], nightly_records["elsewhere"]]:
        shutil.copy(p, d)
    return d


def test_history_lists_runs_oldest_first(runs_dir, nightly_records, capsys):
    (runs_dir / "notes.json").write_text("garbage")
    assert main(["history", "--dir", str(runs_dir)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()[2:]
    assert len(lines) == 5
    assert [line[:10] for line in lines] == ["2026-11-26", "2026-11-27", "2026-11-27", "2026-11-28", "2026-11-29"]
    assert "other-cluster" in lines[2] and all(nightly_records["cluster"] in line for line in lines[:2] + lines[3:])
    # the other claims the rehearsal loads are not evaluated; how many is the suites' business
    unjudged = {sum(v["outcome"] == "not evaluated" for v in load(p).verdicts)
                for p in [*nightly_records["three"], nightly_records["worse"]]}
    assert len(unjudged) == 1 and (n := unjudged.pop()) > 0
    assert "reference 2.10.1" in lines[4] and f"1 fail, {n} not evaluated" in lines[4]
    assert f"1 pass, {n} not evaluated" in lines[0]
    commit = load(nightly_records["worse"]).provenance["git"]["commit"][:12]
    assert all(commit in line for line in lines)
    [warning] = err.splitlines()     # the file that is no run record is named, the others still listed
    assert "notes.json" in warning and "not JSON" in warning


def test_history_of_one_claim(runs_dir, nightly_records, capsys, tmp_path):
    claim = nightly_records["claim"]
    assert main(["history", claim, "--dir", str(runs_dir), "--cluster", nightly_records["cluster"],
                 "--html", str(tmp_path / "series.html")]) == 0
    out = capsys.readouterr().out
    runs = [r for r in history.load_runs(runs_dir) if r.cluster == nightly_records["cluster"]]
    rows = history.series_rows(history.claim_series(runs, claim))
    assert [r[4] for r in rows] == ["2.24", "2.22", "2.25", "1.688"]        # value per night
    assert [r[6] for r in rows] == ["PASS", "PASS", "PASS", "FAIL"]
    assert rows[0][5] == "[2.231, 2.249]"                                     # its CI
    assert rows[3][2] == "reference 2.10.1" and rows[3][7] == ">= 2.18"
    printed = [line for line in out.splitlines() if line.startswith("2026-")]
    assert len(printed) == 4 and all(r[4] in line and r[5] in line for r, line in zip(rows, printed))
    page = (tmp_path / "series.html").read_text()
    assert page.count("<svg") == 1 and 'data-kind="series"' in page and page.count('class="fail"') == 1


def test_compare_against_previous_picks_the_last_run_of_the_same_cluster_and_target(runs_dir, nightly_records, capsys):
    worse = runs_dir / nightly_records["worse"].name
    # a newer-than-previous run of another target on the same cluster: not comparable
    other = load(nightly_records["three"][2])
    other.run_id = other.run_id.replace("T0200", "T0300")
    other.provenance["time"] = other.provenance["time"].replace("T02", "T03")
    other.provenance["target"]["name"] = "hadoop"
    other.write(runs_dir)
    status = main(["compare", str(worse), "--against", "previous"])
    out = capsys.readouterr().out
    assert status == 1                                   # the claim became FAIL, throughput regressed
    assert f"previous comparable run: {runs_dir / nightly_records['three'][2].name}" in out
    assert "NEW FAIL" in out
    first = runs_dir / nightly_records["three"][0].name
    assert main(["compare", str(first), "--against", "previous"]) == 2
    assert "no earlier run of cluster" in capsys.readouterr().err


def test_previous_is_none_for_another_cluster(runs_dir, nightly_records):
    runs = history.load_runs(runs_dir)
    elsewhere = next(r for r in runs if r.cluster == "other-cluster")
    assert history.previous(runs, elsewhere) is None


def _write_records(args):
    directory, tag, count = args
    for i in range(count):
        ms = [measurement("rpc.echo.rtt", [float(x) for x in range(1, 200)], unit="us", direction="lower",
                          config=f"transport=tcp,{tag}={i}")]
        RunRecord(run_id=f"run-{i % 3}", provenance={"time": "2026-12-01T00:00:00+00:00", "writer": tag},
                  measurements=ms).write(Path(directory))
    return count


def _read_records(args):
    directory, rounds = args
    seen = 0
    for _ in range(rounds):
        for path in Path(directory).glob("*.json"):
            try:
                load(path)
            except Exception as e:   # a half-written record would be a damaged one here
                if "no such run record" not in str(e):
                    raise
            seen += 1
    return seen


def test_two_runs_writing_one_directory_never_corrupt_it(tmp_path):
    """Two writers replace the same three records 60 times each while a reader reads them."""
    d = tmp_path / "shared"
    d.mkdir()
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        writers = pool.map_async(_write_records, [(str(d), "a", 60), (str(d), "b", 60)])
        reader = pool.apply_async(_read_records, ((str(d), 40),))
        assert writers.get(timeout=300) == [60, 60]
        assert reader.get(timeout=300) >= 0
    names = sorted(p.name for p in d.iterdir())
    assert names == ["run-0.json", "run-1.json", "run-2.json"]   # no temporary file left behind
    for p in d.iterdir():
        assert json.loads(p.read_text())["provenance"]["writer"] in ("a", "b")
        assert oct(p.stat().st_mode & 0o777) == "0o644"
