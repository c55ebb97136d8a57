"""TestDFSIO's command line, formulas and printed block, without starting any process."""

import contextlib
import io
import os
import time
from types import SimpleNamespace

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.workloads.dfsio import task
from pytest_hpcnet.workloads.dfsio.commands import split_args
from pytest_hpcnet.workloads.dfsio.job import parse_fs, run_dfsio
from pytest_hpcnet.workloads.dfsio.options import parse_dfsio_args, parse_size
from pytest_hpcnet.workloads.dfsio.results import DfsioResult, TaskResult, decimal_format, java_date

MB = 1 << 20


@pytest.mark.parametrize("text,expected", [
    ("64", 64 * MB), ("64MB", 64 * MB), ("64mb", 64 * MB), ("10B", 10), ("3KB", 3072),
    ("2GB", 2 << 30), ("1TB", 1 << 40), ("0", 0), ("5b", 5)])
def test_parse_size_units_no_unit_is_mb(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MB", "-5", "5 MB", "5M", "5K", "5XB", "1.5GB"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError, match="-size"):
        parse_size(text)


def test_defaults_are_testdfsios():
    o = parse_dfsio_args(["-write"])
    assert (o.test_type, o.nr_files, o.size, o.buffer_size, o.res_file, o.skip_size) == \
        ("write", 1, MB, 1000000, "TestDFSIO_results.log", 0)


def test_options_case_insensitive_and_prefixes():
    o = parse_dfsio_args(["-READING", "-NRFILES", "3", "-fileSize", "2KB", "-BufferSize", "4096",
                          "-resfile", "r.log", "-compressionCodec", "zlib"])
    assert (o.test_type, o.nr_files, o.size, o.buffer_size, o.res_file, o.compression) == \
        ("read", 3, 2048, 4096, "r.log", "zlib")
    assert parse_dfsio_args(["-write", "-compression", "org.apache.hadoop.io.compress.GzipCodec"]
                            ).compression == "gzip"


def test_read_variants_and_skip_size_semantics():
    assert parse_dfsio_args(["-read", "-random"]).test_type == "random read"
    back = parse_dfsio_args(["-read", "-backward", "-bufferSize", "4096"])
    assert (back.test_type, back.skip_size) == ("backward read", -4096)
    assert parse_dfsio_args(["-read", "-skip", "-bufferSize", "100"]).skip_size == 100   # default
    assert parse_dfsio_args(["-read", "-skip", "-skipSize", "2"]).skip_size == 2 * MB    # a size: MB
    assert parse_dfsio_args(["-read", "-skip", "-skipSize", "10B"]).skip_size == 10
    assert parse_dfsio_args(["-read", "-skipSize", "10B"]).skip_size == 10   # kept, unused by -read
    assert parse_dfsio_args(["-clean"]).test_type == "cleanup"
    assert parse_dfsio_args(["-truncate", "-size", "1"]).test_type == "truncate"


@pytest.mark.parametrize("args,match", [
    ([], "missing arguments"),
    (["-nrFiles", "2"], "no test type"),
    (["-random"], "-random must follow -read"),
    (["-write", "-skip"], "-skip must follow -read"),
    (["-write", "-nrFiles"], "needs a value"),
    (["-write", "-nrFiles", "x"], "not a whole number"),
    (["-write", "-nrFiles", "0"], "less than 1"),
    (["-write", "-bufferSize", "-3"], "less than 1"),
    (["-write", "-bogus"], "illegal argument '-bogus'"),
    (["-write", "-compression", "snappy"], "unsupported codec"),
    (["-read", "-random", "-compression", "zlib"], "compression applies to sequential"),
    (["-write", "-storagePolicy", "HOT"], "policies"),
    (["-write", "-seq"], "sequential mode"),
])
def test_bad_options_are_clear_errors(args, match):
    with pytest.raises(ConfigError, match=match):
        parse_dfsio_args(args)


def test_split_args_and_fs_specs():
    theirs, ours = split_args(["-write", "--fs", "posix:/x", "-size", "1", "--verify", "--fsync=close"])
    assert theirs == ["-write", "-size", "1"]
    assert ours == {"--fs": "posix:/x", "--verify": True, "--fsync": "close"}
    with pytest.raises(ConfigError, match="unknown option '--nope'"):
        split_args(["--nope"])
    with pytest.raises(ConfigError, match="needs a value"):
        split_args(["--fs"])
    assert parse_fs("posix:/x", "close").describe() == {"fs": "posix:/x", "fsync": "close"}
    assert parse_fs("blockstore").kind == "blockstore"
    target = parse_fs("blockstore", "close")              # the datanodes sync each replica on close
    target.store = {"transport": "tcp", "replication": 1, "block_size": 1 << 20, "sync_on_close": True}
    assert target.fsync == "close" and target.describe()["fsync"] == "close"
    target.store["sync_on_close"] = False                  # a result says what the datanodes did
    assert target.describe()["fsync"] == "none"
    with pytest.raises(ConfigError, match="--fsync: 'every-buffer' is for posix targets"):
        parse_fs("blockstore", "every-buffer")
    for bad, match in [("posix:rel", "absolute"), ("nfs:/x", "expected posix"), ("posix:", "expected")]:
        with pytest.raises(ConfigError, match=match):
            parse_fs(bad)
    with pytest.raises(ConfigError, match="fsync"):
        parse_fs("posix:/x", "sometimes")


@pytest.mark.parametrize("x,text", [
    (0.0, "0"), (1.0, "1"), (0.5, ".5"), (21.333333, "21.33"), (0.125, ".12"), (0.375, ".38"),
    (2.675, "2.67"),          # the double is 2.67499999..., Java rounds the exact binary value
    (1234567.891, "1234567.89"), (0.004, "0"), (0.005, ".01"), (-1.5, "-1.5"),
    (float("inf"), "\u221e")])
def test_decimal_format_matches_javas_hash_dot_hash_hash(x, text):
    assert decimal_format(x) == text


def test_formulas_against_a_hand_computed_example():
    # Two 64 MB tasks taking 2 s and 4 s: rates 32 and 16 MB/s.
    # Throughput = 128 MB / 6 s = 21.33; average rate = 24; std = sqrt((32^2+16^2)/2 - 24^2) = 8.
    r = DfsioResult("write", [TaskResult("test_io_0", 64 * MB, 2000.0), TaskResult("test_io_1", 64 * MB, 4000.0)],
                    exec_ms=4500.0)
    assert [t.rate for t in r.tasks] == [32.0, 16.0]
    assert r.total_mb == 128.0
    assert r.throughput == pytest.approx(128 / 6, rel=1e-6)
    assert r.average_io_rate == pytest.approx(24.0, rel=1e-6)
    assert r.io_rate_std == pytest.approx(8.0, rel=1e-5)
    assert r.exec_sec == 4.5


def test_printed_block_byte_for_byte(monkeypatch, tmp_path):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        r = DfsioResult("write", [TaskResult("test_io_0", 64 * MB, 2000.0),
                                  TaskResult("test_io_1", 64 * MB, 4000.0),
                                  TaskResult("test_io_2", 10 * MB, 3000.0)],
                        exec_ms=4321.0, date=1_795_000_000.0)
        # Hand-computed: 138 MB / 9 s = 15.33; rates 32, 16, 3.333 -> mean 17.11,
        # sqrt((1024 + 256 + 11.11)/3 - 17.111^2) = 11.73.
        expected = (
            "----- TestDFSIO ----- : write\n"
            "            Date & time: Wed Nov 18 11:06:40 UTC 2026\n"
            "        Number of files: 3\n"
            " Total MBytes processed: 138\n"
            "      Throughput mb/sec: 15.33\n"
            " Average IO rate mb/sec: 17.11\n"
            "  IO rate std deviation: 11.73\n"
            "     Test exec time sec: 4.32\n"
            "\n")
        assert r.block() == expected
        res = tmp_path / "TestDFSIO_results.log"
        res.write_text("earlier run\n")
        r.append_to(res)
        r.append_to(res)
        assert res.read_text() == "earlier run\n" + expected + expected   # appended, never replaced
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_java_date_uses_english_names_and_zero_padding(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert java_date(0) == "Thu Jan 01 00:00:00 UTC 1970"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_measurements_carry_the_configuration():
    r = DfsioResult("random read", [TaskResult("a", MB, 100.0)], exec_ms=200.0, config={"fsync": "close"})
    ms = {m.metric: m for m in r.measurements("fs=posix")}
    assert set(ms) == {"dfsio.random_read.throughput", "dfsio.random_read.average_io_rate",
                       "dfsio.random_read.exec_time", "dfsio.random_read.task_rate"}
    assert ms["dfsio.random_read.throughput"].params["fsync"] == "close"
    assert ms["dfsio.random_read.throughput"].value == pytest.approx(10.0)


class _InProcessLaunchers:
    """Runs each DFSIO task's entry point (``task.main``, what ``python -m ...task`` runs on a node)
    in this process, so a monkeypatched ``os`` function sees the task's own calls."""

    class Proc:
        def __init__(self, node, argv):
            self.node, out, err = node, io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                self.code = task.main(argv[argv.index("-m") + 2:])
            self.out, self.err = out.getvalue(), err.getvalue()

        def wait(self, timeout=None):
            return self.code

        def poll(self):
            return self.code

        def output(self):
            return self.out, self.err

    def start(self, node, argv, **kw):
        return self.Proc(node, argv)


@pytest.mark.parametrize("policy,buffers", [("none", 0), ("close", 1), ("every-buffer", 3 + 1)])
def test_posix_fsync_policy_calls_fsync_on_the_written_file(monkeypatch, tmp_path, policy, buffers):
    """A real 10 KB write in 4 KB buffers (3 writes) through run_dfsio's task path: ``close`` fsyncs
    each file once, while it is still open; ``every-buffer`` after each write and again at close."""
    synced = []
    real_fsync = os.fsync

    def counting_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))     # fails if fsync came after close
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    node = SimpleNamespace(name="n0", workdir=str(tmp_path))
    cluster = SimpleNamespace(name="fake", nodes=[node], shared=None)
    opts = parse_dfsio_args(["-write", "-nrFiles", "2", "-size", "10KB", "-bufferSize", "4096",
                             "-resFile", str(tmp_path / "res.log")])
    target = parse_fs(f"posix:{tmp_path / 'fs'}", fsync=policy)
    result = run_dfsio(opts, target, _InProcessLaunchers(), cluster)
    files = [str(tmp_path / "fs" / "io_data" / f"test_io_{i}") for i in range(2)]
    assert sorted(synced) == sorted(files * buffers)
    assert [(tmp_path / "fs" / "io_data" / f"test_io_{i}").stat().st_size for i in range(2)] == [10240] * 2
    assert result.config["fsync"] == policy and result.total_mb == pytest.approx(20 / 1024)
