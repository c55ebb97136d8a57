"""TeraSort's native data path (issue 17) against its Python one: the map's sort and spill, the reduce's
merge, the tcp fetch into a preallocated buffer -- the same bytes out -- and a corrupt or truncated
segment, which is a clear one-line error and a cleanly failed job, on either path."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.mapreduce import terasort as ts
from pytest_hpcnet.reference.mapreduce.engine import jobs
from pytest_hpcnet.reference.mapreduce.engine.driver import Engine, JobFailed
from pytest_hpcnet.reference.mapreduce.engine.shuffle import FetchError, ShuffleServer, fetch_from, write_map_output
from pytest_hpcnet.reference.mapreduce.engine.worker import merge_native, merge_python, merge_runs, sort_and_cut

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason=native.WHY_NOT or "native core present")


def _records(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, size=(n, 100), dtype=np.uint8)
    records[::7, :8] = 42                      # keys that tie on their high 8 bytes
    records[::21, :10] = 42                    # and equal keys outright: the order among them is map order
    return records


def test_native_merge_is_the_numpy_merge_byte_for_byte(tmp_path):
    records = _records(6000, 1)
    runs = [ts.sort_records(part) for part in np.array_split(records, 7)] + [records[:0]]
    want = np.ascontiguousarray(merge_runs(runs)).reshape(-1)
    data = [np.ascontiguousarray(r).reshape(-1) for r in runs]
    out = np.empty(want.size, dtype=np.uint8)
    assert native.core.merge_records_into(data, out) == len(records) and (out == want).all()
    for merge in (merge_native, merge_python):
        with open(tmp_path / merge.__name__, "wb") as f:
            records_out, _ = merge(data, [], f)
        assert records_out == len(records)
        assert (tmp_path / merge.__name__).read_bytes() == want.tobytes()


def test_native_map_spill_is_the_numpy_map_byte_for_byte(tmp_path):
    records = _records(5000, 2)
    path = tmp_path / "part-m-00000"
    records.tofile(path)
    points = sorted(bytes(records[i, :10]) for i in (3, 21, 21, 4000))     # a repeated split point too
    want = sort_and_cut(records[100:4100], points, 6)
    with open(path, "rb") as src, open(tmp_path / "spill", "wb") as out:
        sizes = native.core.terasort_sort_and_spill(src.fileno(), 100, 4000, points, out.fileno())
    assert list(sizes) == [s.nbytes for s in want][:5]
    assert (tmp_path / "spill").read_bytes() == b"".join(np.ascontiguousarray(s).tobytes() for s in want)


def test_native_tcp_fetch_lands_segments_in_place_and_refuses_wrong_lengths(tmp_path):
    big = os.urandom(3 << 20)
    write_map_output(tmp_path / "job" / "map-00000", [b"abc", big, b""])
    server = ShuffleServer("tcp", "127.0.0.1", {"local": tmp_path}, impl="native")
    try:
        reqs = [{"root": "local", "path": "job/map-00000", "reduce": r} for r in (1, 0, 2)]
        into = [memoryview(bytearray(n)) for n in (len(big), 3, 0)]
        assert fetch_from("tcp", server.address, "node0", reqs, into=into, impl="native") is None
        assert [bytes(v) for v in into] == [big, b"abc", b""]
        # the map said 4 bytes, the server has 3: truncated or corrupt, in one line, on both paths
        for impl in ("native", "python"):
            with pytest.raises(FetchError, match=r"^segment 0 of job/map-00000 from node0 is 3 bytes, but the map "
                                                 r"wrote 4: truncated or corrupt$"):
                fetch_from("tcp", server.address, "node0", reqs[1:2], into=[memoryview(bytearray(4))], impl=impl)
        with pytest.raises(FetchError, match="shuffle server of node0: bad shuffle request"):
            fetch_from("tcp", server.address, "node0", [dict(reqs[0], path="nope")],
                       into=[memoryview(bytearray(1))], impl="native")
        into = [memoryview(bytearray(3))]                                     # and it keeps serving
        fetch_from("tcp", server.address, "node0", reqs[1:2], into=into, impl="native")
        assert bytes(into[0]) == b"abc"
    finally:
        server.close()


@pytest.mark.parametrize("merge", [merge_native, merge_python], ids=["native", "python"])
def test_an_unsorted_or_partial_segment_is_refused_naming_its_map(tmp_path, merge):
    runs = [ts.sort_records(_records(50, 3)), ts.sort_records(_records(50, 4))]
    bad = runs[1].copy()
    bad[[10, 30]] = bad[[30, 10]]
    sources = [{"node": "node0"}, {"node": "node1"}]
    with open(tmp_path / "out", "wb") as f:
        with pytest.raises(FetchError, match=r"^segment of map 1 \(from node1\) is corrupt.*not key-sorted"):
            merge([runs[0].reshape(-1), bad.reshape(-1)], sources, f)
        with pytest.raises(FetchError, match=r"^segment of map 0 \(from node0\) is corrupt.*whole number"):
            merge([runs[0].reshape(-1)[:-1], runs[1].reshape(-1)], sources, f)


@pytest.mark.parametrize("impl", ["native", "python"])
def test_a_job_whose_map_output_is_corrupted_fails_cleanly_with_the_reason(tmp_path, impl):
    """A map's spill is damaged after it is written (two records swapped, then the file cut short):
    every reduce attempt refuses it in one line, and the job fails with that line, leaving no output."""
    cluster = local_cluster(2, tmp_path / "c")
    with Launchers(cluster, tmp_path / "logs") as launchers, \
            Engine(cluster, launchers, impl=impl, max_attempts=2) as engine:
        jobs.teragen(engine, 4000, cluster.shared / "in", maps=2)
        for damage in ("swap", "truncate"):
            def on_event(event, **info):
                if event != "map_done" or info["index"] != 0:
                    return
                (spill,) = [p for n in cluster.nodes for p in Path(n.workdir).glob("hpcnet-mr/*/map-00000.a*.out")]
                data = bytearray(spill.read_bytes())
                if damage == "swap":
                    data[0:100], data[100:200] = data[100:200], data[0:100]
                    spill.write_bytes(bytes(data))
                else:
                    spill.write_bytes(bytes(data[:-150]))
            engine.on_event = on_event
            out = cluster.shared / f"out-{damage}"
            reason = "not key-sorted" if damage == "swap" else "truncated"
            with pytest.raises(JobFailed, match=rf"reduce task \d failed 2 time\(s\), the limit; last error: on "
                                                rf"node\d: .*{reason}"):
                jobs.terasort(engine, cluster.shared / "in", out, reduces=2, maps=2,
                              config="transport=tcp,intermediate=local,shuffle=fetch")
            assert not out.exists() and not list(cluster.shared.glob(f".out-{damage}*"))
        engine.on_event = None
        assert len(engine.live_workers()) == 2                              # nobody hung or died
        result = jobs.terasort(engine, cluster.shared / "in", cluster.shared / "out", reduces=2, maps=2)
        assert result.records == 4000


def test_native_and_python_jobs_write_the_same_bytes(tmp_path):
    cluster = local_cluster(2, tmp_path / "c")
    outputs = {}
    with Launchers(cluster, tmp_path / "logs") as launchers:
        for impl in ("native", "python"):
            with Engine(cluster, launchers, impl=impl) as engine:
                if impl == "native":
                    jobs.teragen(engine, 30_000, cluster.shared / "in", maps=2)
                for config in ("transport=tcp,intermediate=local,shuffle=fetch",
                               "transport=shm,intermediate=shared,shuffle=direct"):
                    out = cluster.shared / f"out-{impl}-{config.split(',')[0][10:]}"
                    jobs.terasort(engine, cluster.shared / "in", out, reduces=3, config=config, maps=5)
                    outputs[(impl, config)] = [(out / f"part-r-{r:05d}").read_bytes() for r in range(3)]
                    assert jobs.teravalidate(engine, out).details["valid"]
    assert len(set(map(tuple, outputs.values()))) == 1
