"""The distributed engine on an embedded local cluster: results equal the single-process tools, every
configuration works, worker loss is survived or fails cleanly, bad input gives clear errors."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference import auth
from pytest_hpcnet.reference.mapreduce import randomwriter as rw, sort as kvsort, sortvalidate, teragen as tg
from pytest_hpcnet.reference.mapreduce import terasort as ts, teravalidate as tv
from pytest_hpcnet.reference.mapreduce.engine import jobs
from pytest_hpcnet.reference.mapreduce.engine.driver import Engine, JobFailed
from pytest_hpcnet.reference.mapreduce.engine.shuffle import (FetchError, ShuffleServer, close_idle, fetch_from,
                                                              write_map_output)
from pytest_hpcnet.reference.mapreduce.records import SUCCESS_MARKER, RecordFormatError
from pytest_hpcnet.reference.transport import TRANSPORTS, get_transport

CONFIGS = ["transport=tcp,intermediate=local,shuffle=fetch", "transport=shm,intermediate=local,shuffle=fetch",
           "transport=tcp,intermediate=shared,shuffle=fetch", "transport=shm,intermediate=shared,shuffle=direct"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return local_cluster(3, tmp_path_factory.mktemp("engine-cluster"))


@pytest.fixture(scope="module")
def launchers(cluster, tmp_path_factory):
    with Launchers(cluster, tmp_path_factory.mktemp("engine-logs")) as launchers:
        yield launchers


@pytest.fixture(scope="module")
def engine(cluster, launchers):
    with Engine(cluster, launchers) as engine:
        yield engine
        pids = [engine.worker_process(name).pid for name in engine.workers]
    # shm shuffle regions are named after their owner's pid; the workers must have released theirs
    leaked = [p.name for p in Path("/dev/shm").glob("hpcnet-region-*")
              if any(p.name.startswith(f"hpcnet-region-{pid}-") for pid in pids)]
    assert not leaked, f"engine workers left shared memory behind: {leaked}"


@pytest.fixture(scope="module")
def tera_input(engine, cluster):
    """40k rows in 3 files of uneven size (3 maps with split size 1/3 of the data)."""
    out = cluster.shared / "tera-in"
    result = jobs.teragen(engine, 40_000, out, maps=3, start_row=7)
    return out, result.details["checksum"]


def fresh(cluster, name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=name, dir=cluster.shared)) / "out"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(v.split("=")[1] for v in c.split(",")))
def test_terasort_output_equals_single_process_terasort(engine, cluster, tera_input, config):
    indir, checksum = tera_input
    out = fresh(cluster, "ts")
    result = jobs.terasort(engine, indir, out, reduces=4, config=config, maps=5)
    reference = ts.terasort(indir, out.with_name("reference"), reduces=4, split_bytes=jobs.split_bytes_for(
        sorted(indir.glob("part-*")), 5))
    assert result.records == reference.records == 40_000
    assert result.details["partition_records"] == reference.partition_records
    for r in range(4):
        name = f"part-r-{r:05d}"
        assert (out / name).read_bytes() == (out.with_name("reference") / name).read_bytes()
    assert (out / SUCCESS_MARKER).exists()
    assert tv.teravalidate(out) == [f"checksum\t{checksum}"]
    assert result.config == config + ",net=eth"
    assert set(result.phases) == {"sample", "map", "shuffle", "reduce"} and all(v >= 0 for v in result.phases.values())
    assert result.details["maps"] >= 5 and result.lost_workers == []   # maps is a hint: splits do not cross files
    assert not list(Path(cluster.shared).glob("hpcnet-mr/*")), "intermediate files were not cleaned up"


def test_teragen_job_matches_single_process_teragen(engine, cluster):
    out = fresh(cluster, "tg")
    result = jobs.teragen(engine, 1001, out, maps=4, start_row=123456789)
    local = tg.teragen(1001, out.with_name("local"), maps=4, start_row=123456789)
    assert result.details["checksum"] == local.checksum_hex and result.records == 1001
    for i in range(4):
        assert (out / f"part-m-{i:05d}").read_bytes() == (out.with_name("local") / f"part-m-{i:05d}").read_bytes()


def test_teravalidate_job_reports_like_single_process(engine, cluster, tera_input):
    indir, _ = tera_input
    sorted_dir = fresh(cluster, "tv")
    jobs.terasort(engine, indir, sorted_dir, reduces=3)
    data = bytearray((sorted_dir / "part-r-00001").read_bytes())
    data[100:200], data[200:300] = data[200:300], data[100:200]          # swap two records
    (sorted_dir / "part-r-00001").write_bytes(bytes(data))
    result = jobs.teravalidate(engine, sorted_dir, sorted_dir.with_name("report"))
    assert result.details["lines"] == tv.teravalidate(sorted_dir)
    assert not result.details["valid"] and any("misorder in part-r-00001" in l for l in result.details["lines"])
    assert (sorted_dir.with_name("report") / SUCCESS_MARKER).exists()


def test_sort_job_validates_and_equals_single_process_sort(engine, cluster):
    indir = fresh(cluster, "rw")
    jobs.randomwriter(engine, indir, 300_000, maps=3, seed=5)
    local_in = indir.with_name("rw-local")
    rw.randomwriter(local_in, 300_000, maps=3, seed=5)
    for i in range(3):
        assert (indir / f"part-m-{i:05d}").read_bytes() == (local_in / f"part-m-{i:05d}").read_bytes()
    for config in ("transport=shm", "intermediate=shared,shuffle=direct"):
        out = indir.with_name(f"sorted-{config}")
        result = jobs.sort(engine, indir, out, reduces=3, config=config)
        assert sortvalidate.sortvalidate(indir, out).ok
        reference = kvsort.sort(indir, out.with_name(f"reference-{config}"), reduces=3)
        assert result.records == reference.records
        for r in range(3):
            name = f"part-r-{r:05d}"
            assert (out / name).read_bytes() == (out.with_name(f"reference-{config}") / name).read_bytes()


def test_empty_input_gives_empty_sorted_files(engine, cluster):
    indir = fresh(cluster, "empty")
    jobs.teragen(engine, 0, indir, maps=2)
    out = indir.with_name("sorted")
    result = jobs.terasort(engine, indir, out, reduces=3)
    assert result.records == 0
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "_partition.lst"] + [f"part-r-0000{r}" for r in range(3)]
    assert all((out / f"part-r-0000{r}").stat().st_size == 0 for r in range(3))
    assert jobs.teravalidate(engine, out).details["lines"] == []


def test_bad_input_file_fails_the_job_with_a_clear_error_and_no_output(engine, cluster):
    indir = fresh(cluster, "bad")
    indir.mkdir()
    (indir / "part-m-00000").write_bytes(b"x" * 150)          # not a whole number of records
    out = indir.with_name("sorted")
    with pytest.raises(RecordFormatError, match="not a whole number"):     # the driver's sampler sees it
        jobs.terasort(engine, indir, out, reduces=2)
    with pytest.raises(JobFailed, match=r"map task 0 failed 4 time\(s\), the limit; last error: on node\d: "
                                        r"RecordFormatError: .*not a whole number of 100-byte records"):
        jobs.terasort(engine, indir, out, reduces=1, config="transport=shm")     # one reduce: no sampling
    assert [p.name for p in out.parent.iterdir()] == ["out"], "partial output left behind"


def test_bad_arguments_are_config_errors(engine, cluster, tera_input):
    indir, _ = tera_input
    with pytest.raises(ConfigError, match="reduces"):
        jobs.terasort(engine, indir, fresh(cluster, "x"), reduces=0)
    with pytest.raises(ConfigError, match="already exists"):
        jobs.terasort(engine, indir, indir, reduces=1)
    if "verbs" not in TRANSPORTS:    # each worker says why it has no verbs shuffle server
        with pytest.raises(ConfigError, match=r"transport=verbs needs a shuffle server on every node: node\d: "):
            jobs.terasort(engine, indir, fresh(cluster, "x"), config="transport=verbs")
    with pytest.raises(ConfigError, match="no 'ib' address"):
        jobs.terasort(engine, indir, fresh(cluster, "x"), config="net=ib")


# -- worker loss -------------------------------------------------------------------------------------

def _killer(engine, event_name, kind=None, times=1):
    """An on_event hook that kills the worker named in the first ``times`` matching events."""
    killed = []

    def hook(event, **info):
        if event == event_name and (kind is None or info.get("kind") == kind) and len(killed) < times:
            killed.append(info["node"])
            engine.worker_process(info["node"]).kill()
    return hook, killed


@pytest.mark.parametrize("event,kind,config", [
    ("map_done", None, "intermediate=local"),       # its finished map output is gone: maps re-run
    ("dispatch", "reduce", "intermediate=local"),   # dies holding a reduce; others' fetches from it fail
    ("dispatch", "reduce", "transport=shm,intermediate=shared"),   # shared output survives the node
], ids=["map-done-local", "reduce-running-local", "reduce-running-shm-shared"])
def test_killed_worker_job_still_validates(cluster, tmp_path_factory, tera_input, event, kind, config):
    indir, checksum = tera_input
    with Launchers(cluster, tmp_path_factory.mktemp("kill-logs")) as launchers, Engine(cluster, launchers) as engine:
        engine.on_event, killed = _killer(engine, event, kind)
        out = fresh(cluster, "kill")
        result = jobs.terasort(engine, indir, out, reduces=3, config=config, maps=6)
        assert killed and result.lost_workers == killed
        assert result.attempts > 6 + 3
        assert tv.teravalidate(out) == [f"checksum\t{checksum}"]
        assert len(engine.live_workers()) == len(cluster.nodes) - 1


def test_killed_worker_without_retries_fails_cleanly(cluster, tmp_path_factory, tera_input):
    indir, _ = tera_input
    with Launchers(cluster, tmp_path_factory.mktemp("kill-logs")) as launchers, \
            Engine(cluster, launchers, max_attempts=1) as engine:
        engine.on_event, killed = _killer(engine, "map_done")
        out = fresh(cluster, "fail")
        with pytest.raises(JobFailed, match=r"map task \d+ failed 1 time\(s\), the limit; last error: its output "
                                            r"was on node\d, which was lost \(process exited"):
            jobs.terasort(engine, indir, out, reduces=3, maps=6)
        assert killed
        assert not out.exists() and list(out.parent.iterdir()) == [], "partial output left behind"
        live = [w.name for w in engine.live_workers()]
        pids = [engine.worker_process(n).pid for n in live]
    for pid in pids:   # close() stopped the survivors
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_every_worker_lost_is_a_clear_failure(tmp_path):
    cluster = local_cluster(1, tmp_path / "c")
    with Launchers(cluster, tmp_path / "logs") as launchers, Engine(cluster, launchers) as engine:
        engine.on_event, _ = _killer(engine, "dispatch")
        out = cluster.shared / "gen"
        with pytest.raises(JobFailed, match="every engine worker was lost"):
            jobs.teragen(engine, 1000, out, maps=2)
        assert not out.exists()


# -- the shuffle server ------------------------------------------------------------------------------

@pytest.mark.parametrize("transport,impl", [("tcp", "native"), ("tcp", "python"), ("shm", None)])
def test_shuffle_server_answers_garbage_with_an_error_and_keeps_serving(tmp_path, transport, impl):
    """tcp with impl=native sends segments with sendfile (zero-copy), impl=python reads then sends."""
    from pytest_hpcnet.reference import native
    if impl == "native" and not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    write_map_output(tmp_path / "job" / "map-00000", [b"abc", b"", b"defg"])
    big = os.urandom(3 << 20)
    write_map_output(tmp_path / "job" / "map-00001", [big, b"z"])
    write_map_output(tmp_path / "job" / "map-00002", [b"x" * 100])
    with open(tmp_path / "job" / "map-00002.out", "r+b") as f:      # the index promises more than the data
        f.truncate(60)
    server = ShuffleServer(transport, "127.0.0.1", {"local": tmp_path}, impl=impl)
    assert server.sendfile == (impl == "native")
    try:
        conn = auth.connect(get_transport(transport), server.address, timeout=5)   # a reducer of this run
        for bad in (b"not json", json.dumps({"root": "local", "path": "../etc/passwd", "reduce": 0}).encode(),
                    json.dumps({"root": "nope", "path": "job/map-00000", "reduce": 0}).encode(),
                    json.dumps({"root": "local", "path": "job/map-00000", "reduce": 7}).encode()):
            conn.send([bad], timeout=5)
            reply = conn.recv(timeout=5).tobytes()
            assert reply[:1] == b"\x01" and b"bad shuffle request" in reply
        for r, want in enumerate([b"abc", b"", b"defg"]):
            conn.send([json.dumps({"root": "local", "path": "job/map-00000", "reduce": r}).encode()], timeout=5)
            assert conn.recv(timeout=5).tobytes() == b"\x00" + want
        conn.close()
        # what reducers do: one connection per node, one-sided gets where the transport has them
        assert fetch_from(transport, server.address, "node0",
                          [{"root": "local", "path": "job/map-00000", "reduce": r} for r in (2, 1, 0)]) == \
            [b"defg", b"", b"abc"]
        with pytest.raises(FetchError, match="shuffle server of node0: bad shuffle request"):
            fetch_from(transport, server.address, "node0", [{"root": "local", "path": "nope", "reduce": 0}])
        assert fetch_from(transport, server.address, "node0",
                          [{"root": "local", "path": "job/map-00001", "reduce": r} for r in (0, 1)]) == [big, b"z"]
        with pytest.raises(FetchError, match="truncated"):
            fetch_from(transport, server.address, "node0", [{"root": "local", "path": "job/map-00002", "reduce": 0}])
        assert fetch_from(transport, server.address, "node0",                  # and it keeps serving
                          [{"root": "local", "path": "job/map-00000", "reduce": 0}]) == [b"abc"]
        assert close_idle(older_than=0) >= 1      # the kept connection of the successful fetch
    finally:
        server.close()


def test_engine_start_reports_a_worker_that_cannot_start(tmp_path):
    cluster = local_cluster(1, tmp_path / "c")
    bad = cluster.nodes[0].__class__(**{**cluster.nodes[0].__dict__, "workdir": Path("/proc/forbidden")})
    with Launchers(cluster, tmp_path / "logs") as launchers:
        with pytest.raises(Exception):
            Engine(cluster, launchers, nodes=[bad], start_timeout=20).start()


def test_worker_sorts_equal_the_reference_sorts_including_tied_keys():
    from pytest_hpcnet.reference.mapreduce.engine.worker import merge_runs, sort_and_cut
    rng = np.random.default_rng(3)
    records = rng.integers(0, 256, size=(3000, 100), dtype=np.uint8)
    records[::7, :8] = 42                      # many keys share their high 8 bytes
    records[::21, :10] = 42                    # and some are equal outright (stability matters)
    points = [bytes(records[i, :10]) for i in (5, 900, 2000)]
    points.sort()
    assert all((a == b).all() for a, b in zip(sort_and_cut(records, points, 4), ts.map_sort_partition(records, points)))
    segments = [ts.sort_records(part) for part in np.array_split(records, 5)]
    assert (merge_runs(segments) == ts.merge_segments(segments)).all()
    assert merge_runs([]).shape == (0, 100) and len(sort_and_cut(records[:0], [], 3)) == 3


def test_a_job_past_its_timeout_fails_and_the_engine_stays_usable(tmp_path):
    cluster = local_cluster(2, tmp_path / "c")
    with Launchers(cluster, tmp_path / "logs") as launchers, Engine(cluster, launchers, job_timeout=0.3) as engine:
        out = cluster.shared / "big"
        with pytest.raises(JobFailed, match=r"did not finish within 0.3s"):
            jobs.teragen(engine, 3_000_000, out, maps=1)
        assert not out.exists()
        engine.job_timeout = 60
        result = jobs.teragen(engine, 1000, cluster.shared / "small", maps=2)   # the busy worker is dropped
        assert result.details["checksum"] == tg.teragen(1000, tmp_path / "ref", maps=2).checksum_hex
        assert len(engine.live_workers()) == 1


def test_a_hung_worker_is_lost_by_heartbeat_timeout(tmp_path, tera_input):
    import signal
    indir, checksum = tera_input
    cluster = local_cluster(3, tmp_path / "c")
    with Launchers(cluster, tmp_path / "logs") as launchers, \
            Engine(cluster, launchers, heartbeat_timeout=1.5) as engine:
        stopped = []

        def hang(event, **info):          # SIGSTOP: the process lives, its connection stays open, it is silent
            if event == "dispatch" and info["kind"] == "reduce" and not stopped:
                stopped.append(info["node"])
                os.kill(engine.worker_process(info["node"]).pid, signal.SIGSTOP)
        engine.on_event = hang
        out = cluster.shared / "sorted"
        result = jobs.terasort(engine, indir, out, reduces=3, maps=4)
        assert result.lost_workers == stopped
        assert engine.workers[stopped[0]].lost_reason == "no heartbeat for 1.5s"
        assert tv.teravalidate(out) == [f"checksum\t{checksum}"]
