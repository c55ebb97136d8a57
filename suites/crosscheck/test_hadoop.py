"""Real Apache Hadoop on one MiniCluster: its jobs run, and it agrees with the reference.

Cross-conformance: Hadoop's TeraGen writes the reference's bytes; Hadoop's TeraValidate reports the
reference TeraSort's checksum; our RPC client calls Hadoop's RPCCallBenchmark server and its client
drives ours. Side by side (recorded as measurements, information only -- no absolute-time asserts):
TeraSort wall time on Hadoop vs the reference engine, TestDFSIO write on MiniDFS vs the reference
block store, and echo calls/s of Hadoop's Java RPC vs ours with the same client count.

Sizes are small (CI is a 2-core box; every MapReduce job costs ~25 s of JVM start-up alone), and
RandomWriter/Sort/SortValidator (four jobs) live in suites/mapreduce/test_conformance.py, which also
runs with ``--hpcnet-target hadoop``, to keep this file within its CI budget.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pytest_hpcnet.cli import main as hpcnet_main
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.mapreduce.teragen import teragen as ref_teragen
from pytest_hpcnet.reference.mapreduce.terasort import terasort as ref_terasort
from pytest_hpcnet.reference.mapreduce.teravalidate import teravalidate as ref_teravalidate
from pytest_hpcnet.reference.rpc.hadoop_bench import bench_client, bench_server, calls_per_second
from pytest_hpcnet.report.crosscheck import METRICS, read_verdict
from pytest_hpcnet.targets.hadoop import jobs, yarn
from pytest_hpcnet.sockets import free_port

pytestmark = pytest.mark.hadoop

ROWS = 100_000          # 10 MB of TeraGen data
RPC_CLIENTS, RPC_SECONDS, RPC_MSG = 2, 3, 1024


def test_minicluster_serves(hadoop):
    assert hadoop.running_nodemanagers() == 2
    assert hadoop.default_fs.endswith(f":{hadoop.namenode_port}")
    assert hadoop.conf["mapreduce.framework.name"] == "yarn"
    for name in ("core-site.xml", "mapred-site.xml", "yarn-site.xml"):
        assert (hadoop.conf_dir / name).exists()


def test_hadoop_teragen_writes_the_reference_bytes(hadoop, hadoop_runtime, tmp_path):
    """Same rows and maps (3 maps, rows not divisible by 3): every part file identical, same checksum."""
    rows, maps = ROWS + 1, 3
    hadoop_out, ours = tmp_path / "hadoop", tmp_path / "ours"
    result = jobs.teragen(hadoop_runtime, rows, f"file://{hadoop_out}", maps=maps, conf_dir=hadoop.conf_dir)
    reference = ref_teragen(rows, ours, maps=maps)
    assert result.app_ids, "the job did not run on YARN"
    for i in range(maps):
        name = f"part-m-{i:05d}"
        theirs, mine = (hadoop_out / name).read_bytes(), (ours / name).read_bytes()
        assert len(theirs) == len(mine) and theirs == mine, f"{name} differs"
    assert result.details["checksum"] == reference.checksum
    record, = yarn.app_records(hadoop_runtime, result.app_ids, rm_web=hadoop.rm_web, conf_dir=hadoop.conf_dir)
    assert (record.state, record.finalStatus) == ("FINISHED", "SUCCEEDED")
    assert record.elapsedTime > 0 and record.vcoreSeconds > 0 and record.memorySeconds > 0


def test_hadoop_teravalidate_reports_our_terasort_checksum(hadoop, hadoop_runtime, tmp_path):
    gen = ref_teragen(ROWS, tmp_path / "in", maps=2)
    ref_terasort(tmp_path / "in", tmp_path / "sorted", reduces=3)
    ours = ref_teravalidate(tmp_path / "sorted")
    assert ours == [f"checksum\t{gen.checksum:x}"]
    theirs = jobs.teravalidate(hadoop_runtime, f"file://{tmp_path / 'sorted'}", f"file://{tmp_path / 'report'}",
                               conf_dir=hadoop.conf_dir)
    assert theirs.details["lines"] == ours
    assert theirs.details["valid"]


def test_terasort_on_hadoop_vs_reference(hadoop, hadoop_runtime, cluster, launchers, tmp_path, measure):
    """TeraGen -> TeraSort -> TeraValidate on HDFS; the same data sorted by the reference engine."""
    rt, conf = hadoop_runtime, hadoop.conf_dir
    gen = jobs.teragen(rt, ROWS, "/tera/in", maps=2, conf_dir=conf)
    sort = jobs.terasort(rt, "/tera/in", "/tera/out", reduces=2, conf_dir=conf)
    check = jobs.teravalidate(rt, "/tera/out", "/tera/report", conf_dir=conf)
    assert check.details["lines"] == [f"checksum\t{gen.details['checksum']:x}"]
    record, = yarn.app_records(rt, sort.app_ids, rm_web=hadoop.rm_web, conf_dir=conf)
    assert record.finalStatus == "SUCCEEDED"

    reference_s, how = _reference_terasort_seconds(cluster, launchers, tmp_path)
    params = {"rows": ROWS, "reduces": 2}
    measure.record(
        measurement("terasort.wall", [sort.wall_s], unit="s", direction="lower", config="hadoop", params=params),
        measurement("terasort.yarn_elapsed", [record.elapsedTime / 1000], unit="s", direction="lower",
                    config="hadoop", params=params),
        measurement("terasort.wall", [reference_s], unit="s", direction="lower", config=how, params=params))


def _reference_terasort_seconds(cluster, launchers, tmp_path) -> tuple[float, str]:
    """The reference engine on the cluster when it has a shared dir, else the in-process sort."""
    import time
    if cluster.shared is None:
        ref_teragen(ROWS, tmp_path / "ref-in", maps=2)
        t0 = time.perf_counter()
        ref_terasort(tmp_path / "ref-in", tmp_path / "ref-out", reduces=2)
        return time.perf_counter() - t0, "reference,in-process"
    from pytest_hpcnet.reference.mapreduce.engine import jobs as engine_jobs
    from pytest_hpcnet.reference.mapreduce.engine.driver import Engine
    work = Path(cluster.shared) / f"hadoop-side-by-side-{tmp_path.name}"
    work.mkdir(parents=True)
    try:
        with Engine(cluster, launchers) as engine:
            engine_jobs.teragen(engine, ROWS, work / "in", maps=2)
            t0 = time.perf_counter()
            engine_jobs.terasort(engine, work / "in", work / "out", reduces=2)
            return time.perf_counter() - t0, "reference,engine,transport=tcp"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_dfsio_on_minidfs_vs_reference_blockstore(hadoop, hadoop_runtime, launchers, cluster, workdirs,
                                                   tmp_path, measure):
    from pytest_hpcnet.reference.dfs.store import BlockStore
    from pytest_hpcnet.workloads.dfsio import FsTarget, parse_dfsio_args, run_dfsio
    rt, conf = hadoop_runtime, hadoop.conf_dir
    files, size = 2, "4MB"
    res = tmp_path / "TestDFSIO_results.log"
    write = jobs.dfsio(rt, ["-write", "-nrFiles", str(files), "-size", size], res_file=res, conf_dir=conf)
    read = jobs.dfsio(rt, ["-read", "-nrFiles", str(files), "-size", size], res_file=res, conf_dir=conf)
    for r, kind in ((write, "write"), (read, "read")):
        assert r.details["test_type"] == kind
        assert r.details["nr_files"] == files and r.details["total_mb"] == 8
        assert r.details["throughput"] > 0 and r.details["average_io_rate"] > 0
    assert len(jobs.parse_dfsio_blocks(res.read_text())) == 2        # appended, as Hadoop does

    opts = parse_dfsio_args(["-write", "-nrFiles", str(files), "-size", size,
                             "-resFile", str(tmp_path / "ours.log")])
    with BlockStore(launchers, cluster, transport="tcp",
                    dirs={n: p / "dfs" for n, p in workdirs.items()}).start() as store:
        replication = min(2, len(cluster.nodes))
        ours = run_dfsio(opts, FsTarget("blockstore", store=store.spec(replication=replication)),
                         launchers, cluster)
    params = {"files": files, "size": size, "replication": 2}
    measure.record(
        measurement("dfsio.write.throughput", [write.details["throughput"]], unit="MB/s", direction="higher",
                    config="hadoop,minidfs", params=params),
        measurement("dfsio.write.throughput", [ours.throughput], unit="MB/s", direction="higher",
                    config="reference,blockstore,transport=tcp", params={**params, "replication": replication}))


# our side of the two cross tests: the Python implementation and the native core (impl=native)
IMPLS = ["python", pytest.param("native", marks=pytest.mark.skipif(not native.AVAILABLE,
                                                                   reason=native.WHY_NOT or "-"))]


def _ours(impl: str) -> str:
    return "ours" if impl == "python" else "ours,impl=native"


@pytest.mark.parametrize("impl", IMPLS)
def test_our_rpc_client_calls_hadoop_rpc_benchmark_server(hadoop_runtime, measure, impl):
    with jobs.rpc_benchmark_server(hadoop_runtime, port=free_port(), threads=RPC_CLIENTS) as address:
        with bench_client(address, impl) as client:
            assert client.echo(b"x" * RPC_MSG) == b"x" * RPC_MSG
            assert client.echo("héllo".encode()) == "héllo".encode()
        rate = calls_per_second(address, clients=RPC_CLIENTS, seconds=RPC_SECONDS, msg_size=RPC_MSG, impl=impl)
    assert rate > 0
    measure.record(measurement("rpc.echo.calls_per_second", [rate], unit="calls/s", direction="higher",
                               config=f"client={_ours(impl)},server=hadoop", params=_rpc_params()))


@pytest.mark.parametrize("impl", IMPLS)
def test_hadoop_rpc_benchmark_client_drives_our_server(hadoop_runtime, measure, impl):
    with bench_server(handlers=RPC_CLIENTS, impl=impl) as server:
        result = jobs.rpc_benchmark(hadoop_runtime, clients=RPC_CLIENTS, seconds=RPC_SECONDS, msg_size=RPC_MSG,
                                    port=server.address[1])
        assert server.counters["calls"] > 0 and server.counters["errors"] == 0
    assert result.details["calls_per_second"] > 0
    measure.record(measurement("rpc.echo.calls_per_second", [result.details["calls_per_second"]],
                               unit="calls/s", direction="higher", config=f"client=hadoop,server={_ours(impl)}",
                               params=_rpc_params()))


def test_rpc_calls_per_second_hadoop_vs_ours(hadoop_runtime, measure):
    """Each stack against itself, same client count and message size (information, not a gate); ours
    in both implementations."""
    java = jobs.rpc_benchmark(hadoop_runtime, clients=RPC_CLIENTS, seconds=RPC_SECONDS, msg_size=RPC_MSG,
                              port=free_port(), server_threads=RPC_CLIENTS).details["calls_per_second"]
    ours = {}
    for impl in ["python"] + (["native"] if native.AVAILABLE else []):
        with bench_server(handlers=RPC_CLIENTS, impl=impl) as server:
            ours[impl] = calls_per_second(server.address, clients=RPC_CLIENTS, seconds=RPC_SECONDS,
                                          msg_size=RPC_MSG, impl=impl)
    assert java > 0 and all(v > 0 for v in ours.values())
    measure.record(
        measurement("rpc.echo.calls_per_second", [java], unit="calls/s", direction="higher",
                    config="client=hadoop,server=hadoop", params=_rpc_params()),
        *(measurement("rpc.echo.calls_per_second", [v], unit="calls/s", direction="higher",
                      config=f"client={_ours(impl)},server={_ours(impl)}", params=_rpc_params())
          for impl, v in ours.items()))


def _rpc_params():
    return {"clients": RPC_CLIENTS, "msg_size": RPC_MSG, "seconds": RPC_SECONDS}


@pytest.mark.parametrize("baseline,candidate", [("default", "uber=off")])
def test_crosscheck_command_prints_table_and_verdict(hadoop, capsys, measure, baseline, candidate):
    """Two configurations that differ in a real setting: small jobs in the AM's JVM, or in containers."""
    code = hpcnet_main(["crosscheck", "--target", "hadoop", "--config", baseline, "--config", candidate,
                        "--repeat", "2", "--conf-dir", str(hadoop.conf_dir), "--rm-web", hadoop.rm_web,
                        "--keep-output", "--", "teragen", "1M"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [ln.split() for ln in out.splitlines() if re.search(r"\bapplication_\d+_\d+\b", ln) and "FINISHED" in ln]
    assert [r[0] for r in rows] == [baseline, candidate] * 2
    assert all(r[4] == "SUCCEEDED" for r in rows)
    vcores = {(r[0], r[1]): int(r[6]) for r in rows}
    for config in (baseline, candidate):
        measure.record(measurement("crosscheck.teragen.elapsed", [int(r[5]) / 1000 for r in rows if r[0] == config],
                                   unit="s", direction="lower", config=f"hadoop,{config}", params={"rows": 10_000}),
                       measurement("crosscheck.teragen.vcore_seconds", [int(r[6]) for r in rows if r[0] == config],
                                   unit="vcore-s", direction="lower", config=f"hadoop,{config}",
                                   params={"rows": 10_000}))
    assert all(v > 0 for v in vcores.values())
    assert "elapsed median (ms)" in out
    verdicts = [v for v in map(read_verdict, out.splitlines()) if v]
    assert [(v["candidate"], v["baseline"], v["metric"], v["n"]) for v in verdicts] == \
        [(candidate, baseline, m, 2) for m in METRICS]
    assert all(v["consistent"] for v in verdicts), out
