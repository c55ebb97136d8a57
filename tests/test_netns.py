"""netns:N clusters: building, running commands inside, QJump classes, and teardown that leaves nothing.

Most tests need root and iproute2 (they skip with the reason the library gives otherwise).
"""

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from child_signals import default_sigint


from pytest_hpcnet.cluster import load_cluster, netns
from pytest_hpcnet.cluster.pool import Launchers, finish
from pytest_hpcnet.errors import ConfigError, LaunchError
from pytest_hpcnet.cluster import shaping as levels
from pytest_hpcnet.workloads.qjump import scenarios

needs_root = pytest.mark.skipif(not netns.available(), reason=netns.NEEDS_ROOT)
REPO = Path(__file__).resolve().parents[1]


def _this_process() -> list[str]:
    return [n for n in netns.namespaces() if n.startswith(f"{netns.PREFIX}-{os.getpid()}-")]


_before_the_test: set[str] = set()


@pytest.fixture(autouse=True)
def _namespaces_before_the_test():
    """What this process had before the test is not the test's: with xdist a worker may have run
    tests/test_multihost.py first, whose session fixture keeps its netns:4 hosts until the session ends
    (a run here once counted them: 9 namespaces where the test made 4)."""
    _before_the_test.clear()
    _before_the_test.update(_this_process())
    yield


def ours() -> list[str]:
    """Namespaces this test made (this process's, name prefix hpcnet-<pid>-, made during the test)."""
    return [n for n in _this_process() if n not in _before_the_test]


def _others_port(link: str) -> bool:
    """The controller port of another process's netns cluster (``hn<pid>c<n>``)."""
    m = re.fullmatch(r"hn(\d+)c\d+", link)
    return bool(m) and int(m.group(1)) != os.getpid()


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}



def test_without_root_the_error_says_what_is_needed(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"netns clusters need root \(euid 0\) and iproute2's ip"):
        load_cluster("netns:2", tmp_path, where="--hpcnet-cluster")
    with pytest.raises(ConfigError, match="need root"):
        netns.netns_cluster(2, tmp_path)


def test_bad_link_rate_fails_before_anything_is_created(tmp_path):
    with pytest.raises(ConfigError, match="link rate"):
        netns.NetnsNetwork(2, link_rate="fast")


def test_launcher_refuses_a_node_without_namespace(tmp_path):
    from pytest_hpcnet.cluster import local_cluster
    node = local_cluster(1, tmp_path).nodes[0]
    launcher = netns.NetnsLauncher(logdir=tmp_path / "logs")
    with pytest.raises(LaunchError, match="names no namespace"):
        launcher.start(node, ["true"])


@needs_root
def test_cluster_runs_commands_in_its_namespaces_and_close_removes_everything(tmp_path):
    links_before = root_links()
    cluster = load_cluster("netns:3", tmp_path / "c")
    try:
        net = netns._LIVE[cluster.nodes[0].extra["netns"]["network"]]
        x = net.subnet
        assert [n.address() for n in cluster.nodes] == [f"10.199.{x}.1", f"10.199.{x}.2", f"10.199.{x}.3"]
        assert cluster.controller == {"eth": f"10.199.{x}.254"}
        assert "derived" in cluster.controller_source and net.controller_link in cluster.controller_source
        assert len(ours()) == 4  # three nodes and the switch
        # the controller's port and nothing else (other processes' clusters may come and go meanwhile)
        assert {link for link in root_links() - links_before if not _others_port(link)} == {net.controller_link}
        with Launchers(cluster, tmp_path / "logs") as launchers:
            code, out, _ = launchers.run(cluster.nodes[1], ["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
            assert code == 0 and f"10.199.{x}.2/24" in out
            code, out, _ = launchers.run(cluster.nodes[2], ["tc", "qdisc", "show", "dev", "eth0"])
            assert "qdisc htb 1: root" in out
            # node 0 reaches node 2 across the bridge
            probe = (f"import socket; s = socket.create_server(('10.199.{x}.3', 7001)); print('up', flush=True); "
                     "c, _ = s.accept(); c.sendall(c.recv(5))")
            server = launchers.start(cluster.nodes[2], [sys.executable, "-c", probe])
            from pytest_hpcnet.cluster.pool import wait_for_line
            wait_for_line(server, "^up$")
            client = launchers.start(cluster.nodes[0], [sys.executable, "-c",
                                     f"import socket; c = socket.create_connection(('10.199.{x}.3', 7001), 5); "
                                     "c.sendall(b'hello'); print(c.recv(5).decode())"])
            out, _ = finish(client, 30)
            assert out.strip() == "hello"
            # a node reaches the controller (this process, root namespace) at its derived address, but
            # not this host's loopback: nodes share no loopback with the controller
            with socket.create_server((cluster.controller_address(), 0)) as listener:
                port = listener.getsockname()[1]
                code, out, err = launchers.run(cluster.nodes[1], [sys.executable, "-c",
                                               "import socket, sys; socket.create_connection((sys.argv[1], "
                                               "int(sys.argv[2])), 5).sendall(b'hi')",
                                               cluster.controller_address(), str(port)])
                assert code == 0, err
                conn, peer = listener.accept()
                assert peer[0] == f"10.199.{x}.2" and conn.recv(2) == b"hi"
                conn.close()
                code, _, err = launchers.run(cluster.nodes[1], [sys.executable, "-c",
                                             "import socket, sys; socket.create_connection(('127.0.0.1', "
                                             "int(sys.argv[1])), 2)", str(port)])
                assert code != 0 and "ConnectionRefused" in err
    finally:
        netns.teardown(cluster)  # no-op after close(): teardown is idempotent
    assert ours() == [] and root_links() == links_before


@needs_root
def test_clusters_alive_together_get_different_subnets(tmp_path):
    with netns.temporary_netns_cluster(1, tmp_path / "a") as a, netns.temporary_netns_cluster(1, tmp_path / "b") as b:
        assert a.controller_address() != b.controller_address()
        assert a.nodes[0].address().rsplit(".", 1)[0] != b.nodes[0].address().rsplit(".", 1)[0]


@needs_root
def test_two_clusters_in_one_run_do_not_collide(tmp_path):
    with netns.temporary_netns_cluster(2, tmp_path / "a") as a, netns.temporary_netns_cluster(2, tmp_path / "b") as b:
        names_a = {n.extra["netns"]["namespace"] for n in a.nodes}
        names_b = {n.extra["netns"]["namespace"] for n in b.nodes}
        assert not names_a & names_b and len(ours()) == 6
    assert ours() == []


@needs_root
def test_so_priority_selects_the_level_class(tmp_path):
    """A barrier at level 5 lands in class 1:6; one without a level in the default class 1:1."""
    with netns.temporary_netns_cluster(2, tmp_path / "c") as cluster, \
            Launchers(cluster, tmp_path / "logs") as launchers:
        node0 = cluster.nodes[0]

        def counters():
            code, out, err = launchers.run(node0, ["tc", "-s", "class", "show", "dev", "eth0"])
            assert code == 0, err
            return {cid: packets for cid, (_, packets) in levels.class_counters(out).items()}

        before = counters()
        scenarios.run_barrier(launchers, cluster.nodes, tmp_path / "out", "p5", rounds=200, warmup=0, level=5)
        after = counters()
        assert after["1:6"] - before["1:6"] >= 200  # at least one packet per round from node 0
        for level in (1, 2, 3, 4, 6, 7):
            assert after[levels.class_id(level)] == before[levels.class_id(level)] == 0

        scenarios.run_barrier(launchers, cluster.nodes, tmp_path / "out", "p0", rounds=200, warmup=0)
        final = counters()
        assert final["1:6"] == after["1:6"] and final["1:1"] - after["1:1"] >= 200


@needs_root
def test_failed_build_removes_what_it_made(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "tc_commands", lambda *a: [["qdisc", "add", "dev", "nosuchdev", "root", "htb"]])
    with pytest.raises(LaunchError, match="QJump qdisc on node 0"):
        netns.netns_cluster(3, tmp_path)
    assert ours() == []


@needs_root
def test_stale_namespaces_of_dead_runs_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netns.PREFIX}-{dead.pid}-0-n0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        with netns.temporary_netns_cluster(1, tmp_path):
            assert stale not in netns.namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True)


_CTRL_C = textwrap.dedent("""
    import sys, time
    from pytest_hpcnet.cluster import netns
    cluster = netns.netns_cluster(2, sys.argv[1])   # no with-block: only atexit can clean up
    print(" ".join(n.extra["netns"]["namespace"] for n in cluster.nodes), flush=True)
    time.sleep(60)
""")


@needs_root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_tears_down(tmp_path, sig):
    """Ctrl-C: atexit tears down; SIGKILL: the reaper does (the process cannot)."""
    proc = subprocess.Popen([sys.executable, "-c", _CTRL_C, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, preexec_fn=default_sigint)
    try:
        names = proc.stdout.readline().split()
        assert len(names) == 2, proc.stderr.read()
        assert set(names) <= set(netns.namespaces())
        proc.send_signal(sig)
        proc.wait(180)   # Ctrl-C: atexit deletes each namespace, which on a loaded box took 10 s and more
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 120
    while set(names) & set(netns.namespaces()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(names) & set(netns.namespaces())
    assert not {link for link in root_links() if link.startswith(f"hn{proc.pid}c")}


@needs_root
def test_qjump_config_apply_changes_a_nodes_layout(tmp_path, capsys):
    from pytest_hpcnet import cli
    with netns.temporary_netns_cluster(1, tmp_path) as cluster:
        ns = cluster.nodes[0].extra["netns"]["namespace"]
        assert cli.main(["qjump-config", "--apply", ns, "--dev", "eth0", "--link-rate", "100mbit",
                         "--bytesq", "64", "--timeq", "20"]) == 0
        assert f"applied in namespace {ns}" in capsys.readouterr().out
        out = subprocess.run(["tc", "-n", ns, "class", "show", "dev", "eth0"], capture_output=True, text=True,
                             check=True).stdout
        assert "class htb 1:100 root rate 100Mbit" in out
        assert "class htb 1:8 parent 1:100 prio 0 rate 25600Kbit ceil 25600Kbit" in out
        assert cli.main(["qjump-config", "--apply", ns, "--dev", "nosuch0"]) == 2
        assert "failed" in capsys.readouterr().err


@needs_root
def test_cli_jobs_and_dfsio_run_on_netns_hosts(tmp_path, capsys):
    """``hpcnet teragen|terasort|dfsio --cluster netns:2``: the engine's workers and the block store's
    services on two namespace hosts, the driver on the controller's port; shm between them is refused."""
    from pytest_hpcnet import cli
    assert cli.main(["teragen", "5000", str(tmp_path / "in"), "--cluster", "netns:2", "--maps", "2"]) == 0
    checksum = capsys.readouterr().out.split("checksum ")[1].split()[0]
    assert cli.main(["terasort", str(tmp_path / "in"), str(tmp_path / "out"), "--cluster", "netns:2"]) == 0
    assert cli.main(["teravalidate", str(tmp_path / "out"), str(tmp_path / "report")]) == 0
    assert capsys.readouterr().out.strip().endswith(f"checksum\t{checksum}")
    assert cli.main(["terasort", str(tmp_path / "in"), str(tmp_path / "out2"), "--cluster", "netns:2",
                     "--config", "transport=shm"]) == 2
    assert "node0 on 10.199." in capsys.readouterr().err
    assert cli.main(["dfsio", "-write", "-nrFiles", "2", "-size", "1MB", "-resFile", str(tmp_path / "res.log"),
                     "--fs", "blockstore", "--replication", "2", "--cluster", "netns:2",
                     "--workdir", str(tmp_path / "dfs")]) == 0
    assert "Number of files: 2" in capsys.readouterr().out
    assert ours() == []
