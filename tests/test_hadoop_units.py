"""The Hadoop target's pieces that need no running Hadoop: parsers of its outputs, configurations,
command lines, the crosscheck statistics, and the process-tree kill the MiniCluster relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from pytest_hpcnet.cli import main as hpcnet_main
from pytest_hpcnet.crosscheck import parse_job, parse_rows
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.report.crosscheck import judge, read_verdict, render, summarize
from pytest_hpcnet.targets import load_target
from pytest_hpcnet.targets.hadoop import budget, jobs, yarn
from pytest_hpcnet.targets.hadoop.minicluster import (MiniCluster, MiniClusterError, kill_tree, kill_trees, read_hadoop_xml,
                                                      write_client_conf, write_hadoop_xml)
from pytest_hpcnet.targets.hadoop.runtime import HadoopRuntime, HadoopUnavailable, find_java, find_runtime
from pytest_hpcnet.workloads.crosscheck import Run

STATUS = """2026-11-30 08:22:18,038 WARN  [main] util.NativeCodeLoader - Unable to load native-hadoop library
Application Report : 
\tApplication-Id : application_1796026727853_0002
\tApplication-Name : TeraGen
\tApplication-Type : MAPREDUCE
\tStart-Time : 1796026889428
\tFinish-Time : 1796026910275
\tProgress : 100%
\tState : FINISHED
\tFinal-State : SUCCEEDED
\tTracking-URL : http://localhost:19888/jobhistory/job/job_1796026727853_0002
\tAggregate Resource Allocation : 10234 MB-seconds, 26 vcore-seconds
\tAggregate Resource Preempted : 0 MB-seconds, 0 vcore-seconds
\tDiagnostics : 
"""

DFSIO = """----- TestDFSIO ----- : write
            Date & time: Mon Nov 30 08:30:00 UTC 2026
        Number of files: 2
 Total MBytes processed: 8
      Throughput mb/sec: 41.03
 Average IO rate mb/sec: 41.5
  IO rate std deviation: 4.27
     Test exec time sec: 27.94

----- TestDFSIO ----- : read
            Date & time: Mon Nov 30 08:31:00 UTC 2026
        Number of files: 2
 Total MBytes processed: 8
      Throughput mb/sec: 200
 Average IO rate mb/sec: 210.1
  IO rate std deviation: .5
     Test exec time sec: 20.1

"""


def test_app_status_report_parsed():
    r = yarn.parse_app_status(STATUS)
    assert (r.id, r.state, r.finalStatus, r.name) == ("application_1796026727853_0002", "FINISHED",
                                                      "SUCCEEDED", "TeraGen")
    assert (r.elapsedTime, r.vcoreSeconds, r.memorySeconds) == (20847, 26, 10234)


def test_app_status_garbage_is_a_yarn_error():
    with pytest.raises(yarn.YarnError, match="application -status"):
        yarn.parse_app_status("Exception in thread main: no such application")


def test_rest_apps_parsed():
    body = json.dumps({"apps": {"app": [
        {"id": "application_1_0001", "state": "FINISHED", "finalStatus": "SUCCEEDED", "elapsedTime": 31000,
         "vcoreSeconds": 40, "memorySeconds": 51200, "name": "TeraGen", "queue": "default"},
        {"id": "application_1_0002", "state": "RUNNING", "finalStatus": "UNDEFINED", "elapsedTime": 500,
         "vcoreSeconds": 1, "memorySeconds": 384}]}})
    a, b = yarn.parse_rest_apps(body)
    assert a == yarn.AppRecord("application_1_0001", "FINISHED", "SUCCEEDED", 31000, 40, 51200, "TeraGen")
    assert b.state == "RUNNING" and b.finalStatus == "UNDEFINED"
    assert yarn.parse_rest_apps('{"apps": null}') == []
    with pytest.raises(yarn.YarnError, match="not a /ws/v1/cluster/apps answer"):
        yarn.parse_rest_apps("<html>404</html>")
    with pytest.raises(yarn.YarnError):
        yarn.parse_rest_apps('{"apps": {"app": [{"id": "x"}]}}')


def test_dfsio_blocks_parsed():
    write, read = jobs.parse_dfsio_blocks(DFSIO)
    assert write == {"test_type": "write", "nr_files": 2, "total_mb": 8, "throughput": 41.03,
                     "average_io_rate": 41.5, "io_rate_std": 4.27, "exec_sec": 27.94}
    assert read["test_type"] == "read" and read["io_rate_std"] == 0.5
    with pytest.raises(jobs.HadoopJobError, match="Throughput"):
        jobs.parse_dfsio_blocks(DFSIO.replace("41.03", "fast"))
    assert jobs.parse_dfsio_blocks("no block here\n") == []


def test_teravalidate_report_and_counters_and_rpc_rate_parsed():
    assert jobs.parse_teravalidate(["checksum\t139abefd74b2"]) == {"checksum": "139abefd74b2", "errors": [],
                                                                    "valid": True}
    bad = jobs.parse_teravalidate(["checksum\t1", "error\tmisorder in part-r-00001 between 41 and 40"])
    assert not bad["valid"] and len(bad["errors"]) == 1
    assert not jobs.parse_teravalidate([])["valid"]
    out = "\tFile System Counters\n\t\tHDFS: Number of bytes written=1000000\n\t\tCHECKSUM=21555350172850\n"
    counters = dict((k.strip(), int(v)) for k, v in jobs.COUNTER.findall(out))
    assert counters["CHECKSUM"] == 21555350172850 and counters["HDFS: Number of bytes written"] == 1000000
    bench = "Calls per second: 2950.0\n====== Results ======\nTotal calls per second: 2970.0\nCPU time per call"
    assert jobs.CALLS_PER_SECOND.findall(bench) == ["2970.0"]
    assert jobs.APP_ID.findall("impl.YarnClientImpl - Submitted application application_17_0003\n") == [
        "application_17_0003"]


def test_hadoop_target_configurations(tmp_path):
    t = load_target("hadoop")
    assert {"default", "uber=off"} <= set(t.configurations())
    assert t.defines("uber=off") == {"mapreduce.job.ubertask.enable": "false"}
    assert t.defines("-Dmapreduce.job.reduces=4,-Dmapreduce.task.io.sort.mb=64") == {
        "mapreduce.job.reduces": "4", "mapreduce.task.io.sort.mb": "64"}
    with pytest.raises(ConfigError, match="unknown Hadoop configuration 'ib'"):
        t.defines("ib")
    with pytest.raises(ConfigError, match="neither a known configuration"):
        t.defines("-Dnovalue")
    f = tmp_path / "configs.toml"
    f.write_text('[configs.ipoib]\n"mapreduce.job.reduces" = 4\n[configs.rdma]\n"hadoop.ib.enabled" = true\n')
    t = load_target("hadoop").__class__(configs_file=str(f))
    assert t.configurations() == {"ipoib": {"mapreduce.job.reduces": "4"}, "rdma": {"hadoop.ib.enabled": "true"}}
    f.write_text("[configs]\nrdma = 1\n")
    with pytest.raises(ConfigError, match=str(f)):
        t.configurations()


def test_runtime_reports_what_is_missing(tmp_path):
    with pytest.raises(HadoopUnavailable, match=r"jars missing in .*hadoop-mapreduce-examples"):
        find_runtime(env={"PATH": os.environ["PATH"]}, jar_dir=tmp_path)
    with pytest.raises(HadoopUnavailable, match="no bin/hadoop"):
        find_runtime(env={"PATH": os.environ["PATH"], "HADOOP_HOME": str(tmp_path)})
    with pytest.raises(HadoopUnavailable, match="no java"):
        find_java({"PATH": str(tmp_path)})


def test_command_lines_for_jar_dir_and_hadoop_home(tmp_path):
    rt = HadoopRuntime(java="java", jar_dir=tmp_path / "jars")
    argv = rt.argv("teragen", [1000, "/out"], conf_dir=tmp_path / "conf", defines={"mapreduce.job.maps": 2})
    cp = argv[argv.index("-cp") + 1]
    assert cp == f"{tmp_path / 'conf'}:{tmp_path / 'jars'}/*"          # the cluster's config wins
    assert argv[-5:] == ["org.apache.hadoop.examples.terasort.TeraGen", "-D", "mapreduce.job.maps=2", "1000", "/out"]
    assert any(a.startswith("--add-opens=java.base/java.lang=") for a in argv)
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "hadoop").write_text("#!/bin/sh\n")
    (home / "share/hadoop/mapreduce").mkdir(parents=True)
    (home / "share/hadoop/mapreduce/hadoop-mapreduce-examples-3.3.6.jar").write_text("")
    rt = HadoopRuntime(java="java", hadoop_home=home)
    assert rt.argv("teragen", ["10", "/o"], defines={"a": "b"}) == [
        str(home / "bin/hadoop"), "jar", str(home / "share/hadoop/mapreduce/hadoop-mapreduce-examples-3.3.6.jar"),
        "teragen", "-D", "a=b", "10", "/o"]
    assert rt.program_env("teragen", conf_dir="/etc/hadoop")["HADOOP_CONF_DIR"] == "/etc/hadoop"
    with pytest.raises(HadoopUnavailable, match="no share/hadoop/mapreduce/hadoop-mapreduce-client-jobclient"):
        rt.argv("TestDFSIO", ["-write"])
    with pytest.raises(HadoopUnavailable, match="unknown Hadoop program"):
        rt.argv("wordcount", [])


def test_client_conf_written_to_every_site_file(tmp_path):
    write_client_conf(tmp_path, {"mapreduce.framework.name": "yarn", "fs.defaultFS": "hdfs://localhost:9"})
    for name in ("core-site.xml", "hdfs-site.xml", "mapred-site.xml", "yarn-site.xml"):
        assert read_hadoop_xml(tmp_path / name)["mapreduce.framework.name"] == "yarn"
    (tmp_path / "bad.xml").write_text("<configuration><property>")
    with pytest.raises(ConfigError, match="bad.xml"):
        read_hadoop_xml(tmp_path / "bad.xml")


def test_minicluster_rejects_bad_sizes_and_home_mode(tmp_path):
    with pytest.raises(ConfigError, match="nodemanagers"):
        MiniCluster(HadoopRuntime(java="java", jar_dir=tmp_path), tmp_path, nodemanagers=0)
    with pytest.raises(ConfigError, match="HADOOP_HOME"):
        MiniCluster(HadoopRuntime(java="java", hadoop_home=tmp_path), tmp_path)


def _faked_manager(tmp_path, monkeypatch, rm_conf: dict, **kwargs):
    """A MiniCluster whose manager is a sleeping process: the manager's conf file written, the RM's /conf
    answered with ``rm_conf``, two nodemanagers running. Returns (it, details file, manager conf file)."""
    mc = MiniCluster(HadoopRuntime(java="java", jar_dir=tmp_path), tmp_path, start_timeout=30, **kwargs)
    mc.conf_dir.mkdir()
    details, written = tmp_path / "details.json", tmp_path / "manager-conf.xml"
    write_hadoop_xml(written, {"fs.defaultFS": "hdfs://localhost:9"})
    write_hadoop_xml(tmp_path / "rm.xml", rm_conf)
    monkeypatch.setattr(mc, "_get", lambda path, deadline: (tmp_path / "rm.xml").read_bytes())
    monkeypatch.setattr(mc, "running_nodemanagers", lambda: 2)
    mc.proc = subprocess.Popen(["sleep", "60"])
    return mc, details, written


def test_minicluster_waits_out_a_half_written_details_file(tmp_path, monkeypatch):
    """On a loaded box the manager may still be writing -writeDetails when we look: read it again. A
    manager whose main thread died, or whose JVM exited, fails at once instead."""
    mc, details, written = _faked_manager(tmp_path, monkeypatch, {"mapreduce.framework.name": "yarn"})
    try:
        details.write_text('{"namenode_port": 9, "resourcemanager')
        later = threading.Timer(1.5, details.write_text, ['{"namenode_port": 9, "resourcemanager_port": 8}'])
        later.start()
        mc._wait_ready(details, written)
        later.join()
        assert mc.details == {"namenode_port": 9, "resourcemanager_port": 8}
        assert read_hadoop_xml(mc.conf_dir / "core-site.xml")["mapreduce.framework.name"] == "yarn"
        details.write_text("{half")
        mc.log_path.write_text('INFO starting\nException in thread "main" java.net.BindException: '
                               'Address already in use\n')
        t0 = time.monotonic()
        with pytest.raises(MiniClusterError, match="main thread died while starting"):
            mc._wait_ready(details, written)       # the JVM lives on, but it will never be ready
        assert time.monotonic() - t0 < 10
        mc.proc.kill()
        mc.proc.wait()
        with pytest.raises(MiniClusterError, match="exited .* while starting"):
            mc._wait_ready(details, written)
    finally:
        mc.proc.kill()
        mc.proc.wait()


def test_the_client_conf_keeps_what_we_asked_for_over_the_rms_own(tmp_path, monkeypatch):
    """YARN's MiniCluster serves ``mapreduce.job.ubertask.enable=false`` at the RM's /conf whatever we
    passed it; jobs read the client's configuration, so ours must win there (uber mode was silently off)."""
    rm_conf = {"mapreduce.job.ubertask.enable": "false", "mapreduce.task.io.sort.mb": "100",
               "mapreduce.client.completion.pollinterval": "5000", "mapreduce.framework.name": "yarn"}
    mc, details, written = _faked_manager(tmp_path, monkeypatch, rm_conf,
                                          overrides={"mapreduce.task.io.sort.mb": "48"})
    details.write_text('{"namenode_port": 9, "resourcemanager_port": 8}')
    try:
        mc._wait_ready(details, written)
    finally:
        mc.proc.kill()
        mc.proc.wait()
    client = read_hadoop_xml(mc.conf_dir / "mapred-site.xml")
    assert client["mapreduce.job.ubertask.enable"] == "true"
    assert client["mapreduce.task.io.sort.mb"] == "48"                 # an override wins over SMALL_BOX too
    assert client["mapreduce.client.completion.pollinterval"] == "200"
    assert client["mapreduce.framework.name"] == "yarn"                # what only the RM has is kept


def test_kill_trees_tells_every_process_to_stop_before_waiting_on_any(tmp_path):
    """A deployment's daemons are stopped together: each takes a moment to shut down after SIGTERM, and
    none waits for another's shutdown before its own SIGTERM."""
    script = ("import signal, sys, time\n"
              "log = open(sys.argv[1], 'w', buffering=1)\n"
              "def stop(*_):\n"
              "    log.write(f'term {time.monotonic()}\\n'); time.sleep(0.5)\n"
              "    log.write(f'exit {time.monotonic()}\\n'); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, stop)\n"
              "log.write('ready\\n'); time.sleep(300)\n")
    logs = [tmp_path / f"p{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(log)], start_new_session=True) for log in logs]
    try:
        deadline = time.monotonic() + 10
        while not all(log.exists() and "ready" in log.read_text() for log in logs) and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_trees([p.pid for p in procs], grace=5)
        for p in procs:
            assert p.wait(timeout=5) == 0          # each shut down on SIGTERM, none needed SIGKILL
        events = [dict(line.split() for line in log.read_text().splitlines()[1:]) for log in logs]
        assert max(float(e["term"]) for e in events) < min(float(e["exit"]) for e in events)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_kill_tree_reaches_children_in_their_own_sessions(tmp_path):
    """NodeManager containers run under setsid: a process-group kill of the JVM would miss them."""
    pidfile = tmp_path / "grandchild"
    script = (f"import subprocess, time; p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
              f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(pidfile.read_text())
        kill_tree(parent.pid, grace=2)
        parent.wait(timeout=5)
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
            time.sleep(0.05)
        stat = open(f"/proc/{grandchild}/stat").read() if os.path.exists(f"/proc/{grandchild}") else ""
        assert not stat or stat.rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_crosscheck_sizes_and_job():
    assert parse_rows("1G") == 10**7 and parse_rows("100k") == 1000 and parse_rows("5") == 5
    for bad in ("1.5G", "10x", ""):
        with pytest.raises(ConfigError, match="not a row count"):
            parse_rows(bad)
    for nothing in ("0", "0k"):
        with pytest.raises(ConfigError, match="less than one"):
            parse_rows(nothing)
    assert parse_job(["terasort", "1M"]) == ("terasort", 10_000)
    with pytest.raises(ConfigError, match="teragen|terasort"):
        parse_job(["wordcount", "1G"])


def _runs(a_elapsed, b_elapsed, a_vc=10, b_vc=10):
    runs = []
    for i, (a, b) in enumerate(zip(a_elapsed, b_elapsed)):
        runs.append(Run("A", i, yarn.AppRecord(f"application_1_{2 * i:04d}", "FINISHED", "SUCCEEDED", a, a_vc, 1), 1.0))
        runs.append(Run("B", i, yarn.AppRecord(f"application_1_{2 * i + 1:04d}", "FINISHED", "SUCCEEDED", b, b_vc, 1), 1.0))
    return runs


def test_crosscheck_verdicts():
    slower = judge(_runs([1000, 1010, 990, 1005], [1500, 1490, 1520, 1510]), "A", "B")
    assert slower["significant"] and 1.45 < slower["ratio"] < 1.55
    assert slower["verdict"].startswith("B vs A: elapsedTime 50% higher, SIGNIFICANT")
    noise = judge(_runs([1000, 1100, 950, 1050], [1040, 980, 1090, 1000]), "A", "B")
    assert not noise["significant"] and "not significant" in noise["verdict"]
    for judged in (slower, noise):
        read = read_verdict(judged["verdict"])
        assert read["consistent"] and read["significant"] == judged["significant"]
        assert (read["candidate"], read["baseline"], read["metric"], read["n"]) == ("B", "A", "elapsedTime", 4)
    # a word its own figures contradict is caught, and a line that is not a verdict reads as None
    assert not read_verdict(slower["verdict"].replace("SIGNIFICANT", "not significant"))["consistent"]
    assert not read_verdict(noise["verdict"].replace("not significant", "SIGNIFICANT"))["consistent"]
    assert read_verdict("B vs A: elapsedTime: baseline has a zero sample, no ratio") is None
    runs = _runs([1000, 1200], [2000, 2100])
    summary = summarize(runs, ["A", "B"])
    assert summary[0]["elapsed_median_ms"] == 1100 and summary[0]["elapsed_spread_ms"] == 200
    text = render(runs, summary, [judge(runs, "A", "B")])
    assert "application_1_0003" in text and "elapsed median (ms)" in text and "B vs A" in text


def test_crosscheck_command_rejects_bad_input_before_starting_anything(capsys):
    assert hpcnet_main(["crosscheck", "--config", "default", "--config", "nosuch", "--", "teragen", "1G"]) == 2
    assert "unknown Hadoop configuration 'nosuch'" in capsys.readouterr().err
    assert hpcnet_main(["crosscheck", "--config", "default", "--config", "uber=off", "--", "teragen", "1Q"]) == 2
    assert "'1Q' is not a row count" in capsys.readouterr().err
    assert hpcnet_main(["crosscheck", "--target", "reference", "--config", "transport=tcp", "--config",
                        "transport=carrier", "--", "teragen", "1G"]) == 2
    assert "'carrier' is not one of tcp, shm, verbs" in capsys.readouterr().err
    assert hpcnet_main(["crosscheck", "--target", "reference", "--config", "transport=tcp", "--config",
                        "transport=tcp", "--", "teragen", "1G"]) == 2
    assert "each configuration once" in capsys.readouterr().err


def test_hadoop_tests_get_the_loaded_box_budget(pytester, run_hpcnet):
    """pytest-timeout's budget for tests marked ``hadoop`` comes from budget.py (with room for the
    MiniCluster's start-up on a loaded box); a test's own timeout marker still wins."""
    assert budget.TEST_S > budget.MINICLUSTER_START_S
    pytester.makepyfile(f"""
        import pytest

        def timeout(request):
            return request.node.get_closest_marker("timeout")

        @pytest.mark.hadoop
        def test_marked(request):
            assert timeout(request).args == ({budget.TEST_S},)

        @pytest.mark.hadoop
        @pytest.mark.timeout(7)
        def test_own_budget(request):
            assert timeout(request).args == (7,)

        def test_unmarked(request):
            assert timeout(request) is None
    """)
    result = run_hpcnet("--strict-markers")
    result.assert_outcomes(passed=3)
