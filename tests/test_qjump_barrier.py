"""The barrier-sync latency app and the scenario runner on a local (loopback) cluster: no root needed."""

import socket
import sys
import threading

import pytest

from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.errors import ConfigError, LaunchError
from pytest_hpcnet.cluster import shaping as levels
from pytest_hpcnet.workloads.qjump import barrier, scenarios
from pytest_hpcnet.report.bsfile import read_bs


@pytest.fixture
def local3(tmp_path):
    cluster = local_cluster(3, tmp_path / "cluster")
    with Launchers(cluster, tmp_path / "logs") as launchers:
        yield cluster, launchers


def test_barrier_run_writes_one_bs_file_per_node(local3, tmp_path):
    cluster, launchers = local3
    files = scenarios.run_barrier(launchers, cluster.nodes, tmp_path / "out", "alone_0", rounds=200, warmup=20)
    assert [f.name for f in files] == ["alone_0_0.bs", "alone_0_1.bs", "alone_0_2.bs"]
    for f in files:
        values = read_bs(f)
        assert len(values) == 200 and all(v > 0 for v in values)


def test_barrier_rounds_in_lockstep_with_priority(tmp_path):
    """Three ranks as threads of this process; every socket carries the level's SO_PRIORITY."""
    ports = scenarios.barrier_ports([local_cluster(3, tmp_path).nodes[i] for i in range(3)])
    peers = [("127.0.0.1", p) for p in ports]
    results, errors, priorities = {}, [], set()

    def rank(i):
        try:
            conns = barrier.connect_mesh(i, peers, priority=levels.priority_value(7), timeout=20)
            priorities.update(s.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY) for s in conns.values())
            results[i] = barrier.run_rounds(conns, rounds=50, size=16)
            for s in conns.values():
                s.close()
        except Exception as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and sorted(results) == [0, 1, 2]
    assert all(len(r) == 50 for r in results.values())
    assert priorities == {levels.priority_value(7)}


def test_barrier_detects_a_peer_out_of_step():
    a, b = socket.socketpair()
    with a, b:
        b.sendall((5).to_bytes(8, "big"))  # round 5 where round 0 is due
        with pytest.raises(ConnectionError, match="round 0"):
            barrier.run_rounds({1: a}, rounds=1, size=8)


@pytest.mark.parametrize("text", ["", "a:1", "host", "h:0,h:2", "h:99999,h:1", "h:x,h:1"])
def test_parse_peers_rejects_bad_lists(text):
    with pytest.raises(ConfigError, match="--peers"):
        barrier.parse_peers(text)


def test_barrier_cli_rejects_bad_arguments_in_one_line(tmp_path, capsys):
    assert barrier.main(["--rank", "3", "--peers", "127.0.0.1:1,127.0.0.1:2", "--out", str(tmp_path / "x.bs")]) == 2
    assert capsys.readouterr().err == "barrier: --rank: rank 3 is not in 0..1\n"


def test_barrier_with_an_absent_peer_fails_instead_of_hanging(local3, tmp_path):
    cluster, launchers = local3
    node = cluster.nodes[0]
    proc = launchers.start(node, [sys.executable, "-m", "pytest_hpcnet.workloads.qjump.barrier", "--rank", "1",
                                  "--peers", "127.0.0.1:9,127.0.0.1:0", "--timeout", "1",
                                  "--out", str(tmp_path / "x.bs")])
    assert proc.wait(30) != 0  # rank 0's port 9 (discard) is closed: connect retries, then gives up


def test_experiment_on_loopback_gives_three_scenarios_and_measurements(local3, tmp_path):
    """The whole runner on loopback (no shaping, so no claim about the numbers, only their shape)."""
    cluster, launchers = local3
    exp = scenarios.run_experiment(launchers, cluster.nodes, tmp_path / "out", rounds=100, repetitions=2,
                                   warmup=10, flows=2, level=7)
    assert all(len(exp.latencies_ms[s]) == 2 and len(exp.files[s]) == 2 for s in scenarios.SCENARIOS)
    assert all(exp.default_level_mbit[s] == [] for s in scenarios.SCENARIOS)  # loopback: no tc counters
    ms = scenarios.measurements(exp, cluster.nodes, level=7, flows=2, rounds=100, link_rate=None,
                                cluster=cluster.source)
    assert [(m.config, m.metric) for m in ms] == [(s, f"qjump.barrier.{stat}") for s in scenarios.SCENARIOS
                                                  for stat in ("p50", "p99", "p99_9")]
    for m in ms:
        assert m.unit == "us" and len(m.samples) == 2 and m.stats["n"] == 200
        assert m.stats["min"] <= m.value <= m.stats["max"]
    assert launchers.for_node(cluster.nodes[0]).live_pids() == []  # bulk flows and barriers all gone


def test_bulk_flows_need_two_nodes(local3):
    cluster, launchers = local3
    with pytest.raises(ConfigError, match="2 nodes"):
        with scenarios.bulk_flows(launchers, cluster.nodes[:1], flows=1):
            pass


def test_bulk_flow_failure_kills_started_processes(local3):
    cluster, launchers = local3
    bad = cluster.nodes[1].__class__(**{**cluster.nodes[1].__dict__, "addresses": {"eth": "127.0.0.1x"}})
    with pytest.raises(LaunchError):
        with scenarios.bulk_flows(launchers, [cluster.nodes[0], bad], flows=2):
            pass
    assert launchers.for_node(cluster.nodes[0]).live_pids() == []
