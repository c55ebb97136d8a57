"""Progress bars (issue 19): long hand-run commands say they are moving, and nothing else changes.

A bar draws on stderr when stderr is a terminal or ``--progress`` asks, after ``progress.DELAY_S``;
captured output (pytest, CI logs) gets none unless asked. The library functions only call back."""

from __future__ import annotations

import pytest

from pytest_hpcnet import maven, progress
from pytest_hpcnet.reference.mapreduce.commands import build_parser
from pytest_hpcnet.reference.mapreduce.teragen import teragen


@pytest.fixture
def no_delay(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)


def _run(argv) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


def test_teragen_and_terasort_draw_a_bar_when_asked(tmp_path, capsys, no_delay):
    assert _run(["teragen", "20k", str(tmp_path / "in"), "--maps", "2", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "teragen" in err and "/20.0k [" in err and "row/s" in err
    assert _run(["terasort", str(tmp_path / "in"), str(tmp_path / "out"), "--reduces", "2", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "terasort (map, then reduce)" in err and "/4.00M [" in err   # 2 MB mapped + 2 MB written


def test_no_bar_in_captured_output_or_with_no_progress(tmp_path, capsys, no_delay):
    assert _run(["teragen", "20k", str(tmp_path / "a")]) == 0          # stderr is not a terminal here
    assert _run(["teragen", "20k", str(tmp_path / "b"), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.count("teragen: 20000 rows") == 2


def test_the_library_reports_every_row_and_stays_the_same(tmp_path):
    seen = []
    plain = teragen(1234, tmp_path / "plain", maps=3)
    told = teragen(1234, tmp_path / "told", maps=3, progress=seen.append)
    assert sum(seen) == 1234 and told.checksum == plain.checksum


def test_the_engine_hook_counts_finished_tasks():
    seen = []
    hook = progress.task_events(seen.append)
    for event in ("dispatch", "map_done", "worker_lost", "map_done", "reduce_done"):
        hook(event, index=0, node="n0")
    assert seen == [1, 1, 1]


def test_maven_download_lines_are_read_for_their_size():
    assert maven.downloaded_bytes("Downloaded from central: https://repo.maven.apache.org/x.jar "
                                  "(4.4 MB at 12 MB/s)") == 4_400_000
    assert maven.downloaded_bytes("Downloaded from central: https://r/x.pom (12 kB at 80 kB/s)") == 12_000
    assert maven.downloaded_bytes("[INFO] Copying x.jar to /tmp/x.jar") is None


def test_dfsio_counts_finished_files_when_asked(tmp_path, capsys, no_delay):
    from pytest_hpcnet.cli import main
    (tmp_path / "data").mkdir()
    assert main(["dfsio", "-write", "-nrFiles", "3", "-size", "1MB", "-resFile", str(tmp_path / "res.log"),
                 "--fs", f"posix:{tmp_path / 'data'}", "--cluster", "local:2", "--workdir", str(tmp_path / "w"),
                 "--progress"]) == 0
    captured = capsys.readouterr()
    assert "dfsio -write" in captured.err and "/3 [" in captured.err and "file/s" in captured.err
    assert "Number of files: 3" in captured.out
