"""QJump pieces that need neither root nor a network: .bs files, outliers, stats, tc layout, CLI."""

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_hpcnet import cli
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.cluster import shaping as levels
from pytest_hpcnet.report.bsfile import read_bs, write_bs
from pytest_hpcnet.workloads.qjump.commands import HOOK_DIR, hook_env, looks_like_python
from pytest_hpcnet.report import cdf

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "qjump"
ALONE, HADOOP, QJUMP = (SAMPLES / f"naiad_synthetic_{n}.bs" for n in ("alone", "hadoop", "qjump"))


# --- .bs files ---------------------------------------------------------------------------------------

def test_bs_roundtrip_keeps_microsecond_resolution(tmp_path):
    values = [0.123456, 12.5, 90.000001, 0.000001]
    path = write_bs(tmp_path / "x.bs", values)
    assert read_bs(path) == values
    assert path.read_text().splitlines()[0] == "0.123456"
    assert not list(tmp_path.glob("*.tmp"))


def test_bs_reader_accepts_original_layout(tmp_path):
    path = tmp_path / "naiad_BSFSHT301_0_1.bs"
    path.write_text("0.25\n  1.5 \r\n\n3\n")  # stray whitespace, CRLF, a blank line, an integer
    assert read_bs(path) == [0.25, 1.5, 3.0]


@pytest.mark.parametrize("bad", ["abc", "nan", "inf", "1.5 ms"])
def test_bs_reader_names_file_and_line_of_bad_value(tmp_path, bad):
    path = tmp_path / "bad.bs"
    path.write_text(f"0.1\n0.2\n{bad}\n")
    with pytest.raises(ConfigError) as e:
        read_bs(path)
    assert str(path) in str(e.value) and "line 3" in str(e.value)


def test_bs_reader_rejects_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.bs").write_text("\n\n")
    with pytest.raises(ConfigError, match="no samples"):
        read_bs(tmp_path / "empty.bs")
    with pytest.raises(ConfigError, match="cannot read"):
        read_bs(tmp_path / "absent.bs")


def test_shipped_samples_have_the_original_shape():
    for path in (ALONE, HADOOP, QJUMP):
        assert len(read_bs(path)) == 1001


# --- outliers and statistics -------------------------------------------------------------------------

def test_outliers_are_samples_at_or_above_90_ms():
    kept, dropped = cdf.drop_outliers([1.0, 89.999, 90.0, 150.0, 0.2])
    assert kept.tolist() == [1.0, 89.999, 0.2] and dropped == 2


def test_series_counts_outliers_per_file_and_converts_to_us():
    hadoop, alone = cdf.load_series(HADOOP, "hadoop"), cdf.load_series(ALONE, "alone")
    assert (hadoop.outliers, alone.outliers) == (3, 0)
    assert hadoop.latencies_us.size == 998
    assert alone.latencies_us[0] == pytest.approx(read_bs(ALONE)[0] * 1000)


def test_all_outliers_is_an_error(tmp_path):
    path = write_bs(tmp_path / "slow.bs", [95.0, 100.0])
    with pytest.raises(ConfigError, match="outliers"):
        cdf.load_series(path, "slow")


def test_stats_match_hand_computed_values():
    values = [10.0, 20.0, 30.0, 40.0, 1000.0]
    s = cdf.stats(values)
    assert s["count"] == 5 and s["min"] == 10 and s["max"] == 1000 and s["median"] == 30
    assert s["avg"] == pytest.approx(220.0)
    assert s["stdev"] == pytest.approx(math.sqrt(sum((v - 220) ** 2 for v in values) / 5))  # population
    assert s["p25"] == 20 and s["p75"] == 40 and s["p50"] == 30
    assert s["p99"] == pytest.approx(40 + 0.96 * 960)  # linear interpolation between 40 and 1000
    assert list(s)[-7:] == [f"p{q}" for q in (1, 10, 25, 50, 75, 90, 99)]


# --- tc layout ---------------------------------------------------------------------------------------

def test_level_selects_class_through_so_priority():
    assert [levels.class_id(level) for level in levels.LEVELS] == [f"1:{i}" for i in range(1, 9)]
    assert levels.priority_value(0) == 0x10001 and levels.priority_value(7) == 0x10008
    for bad in (-1, 8, 1.5, True, "7"):
        with pytest.raises(ConfigError):
            levels.priority_value(bad)


@pytest.mark.parametrize("text, bits", [("200mbit", 200e6), ("1gbit", 1e9), ("12500kbps", 100e6),
                                        ("100", 100.0), ("2.5Mbit", 2.5e6)])
def test_parse_rate(text, bits):
    assert levels.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["", "fast", "-5mbit", "0mbit", "10 furlongs"])
def test_parse_rate_rejects_garbage(text):
    with pytest.raises(ConfigError, match="tc rate"):
        levels.parse_rate(text, "--link-rate")


def test_level_rates_follow_bytesq_timeq_and_cap_at_link():
    p = levels.QJumpParams(bytesq=256, timeq=20, rates=(100, 1, 2, 1, 1, 1, 1, 0.5))
    assert p.base_rate_bits == pytest.approx(102.4e6)  # 256 B per 20 µs
    assert p.level_rate_bits(0, 200e6) == 200e6  # 100x base is capped at the link
    assert p.level_rate_bits(2, 1e9) == pytest.approx(204.8e6)
    assert p.level_rate_bits(7, 1e9) == pytest.approx(51.2e6)


def test_tc_commands_for_the_seed_parameters():
    # bytesq=256 timeq=5 p0rate=100 (the Naiad run) on a 10 Gbit link: base 409.6 Mbit/s
    cmds = levels.tc_commands("eth1", levels.QJumpParams(), "10gbit")
    assert cmds[0] == ["qdisc", "add", "dev", "eth1", "root", "handle", "1:", "htb", "default", "1"]
    assert cmds[1][:8] == ["class", "add", "dev", "eth1", "parent", "1:", "classid", "1:100"]
    assert cmds[1][cmds[1].index("rate") + 1] == "10000000000bit"
    by_class = {c[c.index("classid") + 1]: c for c in cmds[2:]}
    assert sorted(by_class) == [f"1:{i}" for i in range(1, 9)]
    level0, level7 = by_class["1:1"], by_class["1:8"]
    assert level0[level0.index("rate") + 1] == "10000000000bit"          # 100 x 409.6M > link: capped
    assert level7[level7.index("rate") + 1] == "409600000bit"            # 1 x base
    assert level7[level7.index("ceil") + 1] == "409600000bit"            # hard limit
    assert level7[level7.index("prio") + 1] == "0" and level0[level0.index("prio") + 1] == "7"
    assert all(c[c.index("parent") + 1] == "1:100" for c in cmds[2:])


def test_bad_qjump_parameters_name_the_parameter():
    with pytest.raises(ConfigError, match="p3rate"):
        levels.QJumpParams(rates=(1, 1, 1, 0, 1, 1, 1, 1))
    with pytest.raises(ConfigError, match="timeq"):
        levels.QJumpParams(timeq=0)
    with pytest.raises(ConfigError, match="bytesq"):
        levels.QJumpParams(bytesq=-1)


def test_class_counters_parse_tc_output():
    text = """class htb 1:1 parent 1:100 prio 7 rate 200Mbit ceil 200Mbit burst 1600b cburst 1600b
 Sent 90 bytes 1 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0

class htb 1:8 parent 1:100 leaf 8: prio 0 rate 25600Kbit ceil 25600Kbit burst 1600b cburst 1600b
 Sent 123456 bytes 789 pkt (dropped 0, overlimits 0 requeues 0)
"""
    assert levels.class_counters(text) == {"1:1": (90, 1), "1:8": (123456, 789)}


# --- CLI -------------------------------------------------------------------------------------------

def test_qjump_config_prints_the_tc_layout(capsys):
    assert cli.main(["qjump-config", "--bytesq", "64", "--timeq", "20", "--p7rate", "2", "--dev", "veth9"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("tc ")]
    assert lines[0] == "tc qdisc add dev veth9 root handle 1: htb default 1"
    assert "first: tc qdisc del dev veth9 root" in out
    assert "classid 1:8 htb rate 51200000bit ceil 51200000bit prio 0" in lines[-1]
    assert "level 7: class 1:8  SO_PRIORITY 65544" in out


def test_qjump_config_bad_rate_is_one_line(capsys):
    assert cli.main(["qjump-config", "--link-rate", "fast"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpcnet qjump-config: --link-rate: 'fast' is not a positive tc rate")


def test_plot_cdf_writes_png_and_prints_stats(tmp_path, capsys):
    out = tmp_path / "figure1c"
    code = cli.main(["plot", "cdf", str(ALONE), "alone", str(HADOOP), "hadoop", str(QJUMP), "qjump", str(out)])
    assert code == 0
    png = tmp_path / "figure1c.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    header = text.splitlines()[0].split()
    assert header == ["label", "file", "outliers", "count", "avg", "median", "min", "max", "stdev",
                      "p1", "p10", "p25", "p50", "p75", "p90", "p99"]
    hadoop_row = next(line for line in text.splitlines() if line.startswith("hadoop")).split()
    assert hadoop_row[2:4] == ["3", "998"]


def test_plot_cdf_with_output_option(tmp_path):
    out = tmp_path / "cdf.png"
    assert cli.main(["plot", "cdf", str(ALONE), "alone", "-o", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_plot_cdf_bad_line_names_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.bs"
    bad.write_text("0.1\n0.2\noops\n")
    assert cli.main(["plot", "cdf", str(ALONE), "alone", str(bad), "bad", "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "hpcnet plot: " in err and str(bad) in err and "line 3" in err and "'oops'" in err
    assert not (tmp_path / "x.png").exists()


def test_plot_cdf_output_given_twice_is_an_error(tmp_path, capsys):
    assert cli.main(["plot", "cdf", str(ALONE), "alone", "out1", "-o", "out2.png"]) == 2
    assert "give one" in capsys.readouterr().err


# --- the socket hook behind `hpcnet qjump run` ------------------------------------------------------

_PROBE = """
import socket
listener = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(listener.getsockname())
server, _ = listener.accept()
unix = socket.socket(socket.AF_UNIX)
get = lambda s: s.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY)
print(get(socket.socket()), get(client), get(server), get(unix))
"""


def test_hook_sets_priority_on_created_connected_and_accepted_sockets():
    env = hook_env(5)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(HOOK_DIR)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    value = levels.priority_value(5)
    assert out.stdout.split() == [str(value), str(value), str(value), "0"]  # AF_UNIX left alone


def test_hook_is_inert_without_the_variable():
    env = {k: v for k, v in hook_env(5).items() if k not in ("HPCNET_SO_PRIORITY",)}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["0", "0", "0", "0"], out.stderr


def test_qjump_run_end_to_end_passes_exit_code(capsys):
    code = "import socket,sys; sys.exit(socket.socket().getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY) & 0xff)"
    assert cli.main(["qjump", "run", "-p", "6", "--", sys.executable, "-c", code]) == 7  # class 1:7
    assert "warning" not in capsys.readouterr().err


def test_qjump_run_warns_for_non_python_and_rejects_bad_level(tmp_path, capsys):
    assert cli.main(["qjump", "run", "-p", "3", "--", "true"]) == 0
    assert "does not look like a Python program" in capsys.readouterr().err
    assert cli.main(["qjump", "run", "-p", "9", "--", "true"]) == 2
    assert "0..7" in capsys.readouterr().err
    assert cli.main(["qjump", "run", "-p", "1", "--", str(tmp_path / "absent")]) == 2
    assert "cannot start" in capsys.readouterr().err
    script = tmp_path / "app"
    script.write_text("#!/usr/bin/env python3\nprint('hi')\n")
    assert looks_like_python(str(script)) and looks_like_python("python3") and not looks_like_python("ls")
