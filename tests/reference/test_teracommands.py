"""The ``hpcnet`` data-tool commands: the whole teragen -> terasort -> teravalidate and randomwriter ->
sort -> sortvalidate flows by hand, and one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_hpcnet.cli import main
from pytest_hpcnet.reference.mapreduce.commands import parse_count
from pytest_hpcnet.reference.mapreduce.sortvalidate import SUCCESS_LINE
from pytest_hpcnet.errors import ConfigError


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_tera_flow(tmp_path, capsys):
    code, out, _ = run(capsys, "teragen", "1k", tmp_path / "in", "--maps", "3", "--start", "10")
    assert code == 0 and "1000 rows" in out
    checksum = out.rsplit("checksum ", 1)[1].strip()
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == [
        "_SUCCESS", "part-m-00000", "part-m-00001", "part-m-00002"]
    assert (tmp_path / "in" / "part-m-00000").read_bytes()[12:44] == b"%032X" % 10     # first row is 10
    code, out, _ = run(capsys, "terasort", tmp_path / "in", tmp_path / "out", "--reduces", "2")
    assert code == 0 and "1000 records into 2 files" in out
    code, out, _ = run(capsys, "teravalidate", tmp_path / "out", tmp_path / "report")
    assert (code, out) == (0, f"checksum\t{checksum}\n")
    assert (tmp_path / "report" / "part-r-00000").read_text() == out


def test_teravalidate_reports_errors_with_status_1(tmp_path, capsys):
    run(capsys, "teragen", "100", tmp_path / "in", "--maps", "2")
    code, out, _ = run(capsys, "teravalidate", tmp_path / "in", tmp_path / "report")
    assert code == 1
    assert out.startswith("checksum\t") and "\nerror\tmisorder in part-m-00000 between " in out


def test_teravalidate_of_empty_input(tmp_path, capsys):
    run(capsys, "teragen", "0", tmp_path / "in")
    code, out, err = run(capsys, "teravalidate", tmp_path / "in", tmp_path / "report")
    assert (code, out) == (0, "") and "no records" in err


def test_sort_flow(tmp_path, capsys):
    code, out, _ = run(capsys, "randomwriter", tmp_path / "in", "--bytes", "200k", "--maps", "2", "--seed", "4")
    assert code == 0 and "in 2 files" in out
    assert run(capsys, "sort", tmp_path / "in", tmp_path / "out", "--reduces", "3")[0] == 0
    code, out, _ = run(capsys, "sortvalidate", tmp_path / "in", tmp_path / "out")
    assert (code, out) == (0, SUCCESS_LINE + "\n")
    (tmp_path / "out" / "part-r-00001").write_bytes(b"HPCNKV1\n")           # drop a reduce's records
    code, out, _ = run(capsys, "sortvalidate", tmp_path / "in", tmp_path / "out")
    assert code == 1 and out.startswith("FAILED: records differ")


@pytest.mark.parametrize("argv,message", [
    (["teragen", "12x", "{d}/o"], "teragen ROWS: '12x' is not a whole number"),
    (["teragen", "10", "{d}/o", "--maps", "0"], "--maps: must be at least 1"),
    (["teragen", "10", "{d}/o", "--start", "-4"], "--start: '-4' is not a whole number"),
    (["terasort", "{d}/missing", "{d}/o"], "terasort INDIR: '{d}/missing' is not a directory"),
    (["terasort", "{d}", "{d}/o", "--reduces", "two"], "--reduces: 'two' is not a whole number"),
    (["teravalidate", "{d}/missing", "{d}/r"], "teravalidate OUTDIR: '{d}/missing' is not a directory"),
    (["randomwriter", "{d}/o", "--bytes", "1q"], "--bytes: '1q' is not a whole number"),
    (["sortvalidate", "{d}/missing", "{d}"], "sortvalidate INDIR: '{d}/missing' is not a directory"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv, message):
    code, out, err = run(capsys, *[a.format(d=tmp_path) for a in argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message.format(d=tmp_path) in err
    assert not (tmp_path / "o").exists()


def test_malformed_input_file_is_one_line(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-m-00000").write_bytes(b"x" * 150)
    code, _, err = run(capsys, "terasort", tmp_path / "in", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "not a whole number of 100-byte records" in err
    assert not (tmp_path / "out").exists()


def test_parse_count_suffixes():
    assert parse_count("2k", {"k": 1000}, "x") == 2000
    assert parse_count("7", {}, "x") == 7
    with pytest.raises(ConfigError):
        parse_count("7k", {}, "x")


def test_console_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest_hpcnet.cli", "teragen", "3", str(tmp_path / "g")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "3 rows" in proc.stdout
    assert (tmp_path / "g" / "part-m-00000").stat().st_size == 300
