"""The data-tool commands with ``--cluster``: the same flows as jobs of the engine on local:2, with
relative paths (workers run in their own work dirs), and one-line errors for bad combinations."""

from __future__ import annotations

import os

import pytest

from pytest_hpcnet.cli import main
from pytest_hpcnet.reference.mapreduce.sortvalidate import SUCCESS_LINE


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def in_tmp(tmp_path):
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


def test_tera_flow_on_a_cluster_matches_the_local_flow(in_tmp, capsys):
    code, out, _ = run(capsys, "teragen", "5k", "in", "--maps", "3", "--cluster", "local:2")
    assert code == 0 and "5000 rows" in out
    checksum = out.rsplit("checksum ", 1)[1].strip()
    code, local, _ = run(capsys, "teragen", "5k", "in-local", "--maps", "3")
    assert local.rsplit("checksum ", 1)[1].strip() == checksum
    for i in range(3):
        assert (in_tmp / "in" / f"part-m-0000{i}").read_bytes() == (in_tmp / "in-local" / f"part-m-0000{i}").read_bytes()
    code, out, _ = run(capsys, "terasort", "in", "out", "--reduces", "3", "--cluster", "local:2",
                       "--config", "transport=shm,intermediate=shared,shuffle=direct")
    assert code == 0 and "5000 records into 3 files" in out and "shuffle=direct" in out
    code, out, _ = run(capsys, "teravalidate", "out", "report", "--cluster", "local:2")
    assert (code, out) == (0, f"checksum\t{checksum}\n")


def test_sort_flow_on_a_cluster(in_tmp, capsys):
    assert run(capsys, "randomwriter", "kv", "--bytes", "256k", "--maps", "2", "--cluster", "local:2")[0] == 0
    code, out, _ = run(capsys, "sort", "kv", "sorted", "--reduces", "2", "--cluster", "local:2", "--config", "transport=shm")
    assert code == 0 and "transport=shm" in out
    assert run(capsys, "sortvalidate", "kv", "sorted")[1].strip() == SUCCESS_LINE


@pytest.mark.parametrize("argv,message", [
    (["terasort", "in", "out", "--config", "transport=shm"], "--config: an engine configuration needs --cluster"),
    (["terasort", "in", "out", "--cluster", "local:2", "--config", "shuffle=direct"], "needs intermediate=shared"),
    (["terasort", "in", "out", "--cluster", "nowhere"], "--cluster: 'nowhere' is neither local:N, netns:N, slurm nor an existing"),
])
def test_bad_cluster_options_are_one_line_errors(in_tmp, capsys, argv, message):
    (in_tmp / "in").mkdir()
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not (in_tmp / "out").exists()
