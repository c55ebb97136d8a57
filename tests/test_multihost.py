"""The ssh and slurm launchers against the real daemons, on four netns hosts of this box.

A session fixture builds one ``netns:4`` network; ``sshd -D`` runs in every host (generated host key,
per-session client key, private config) and a real Slurm (munged, slurmctld, one slurmd per host with
its own NodeAddr) on the same hosts. Each launcher gets a generated inventory, and pytest runs on it in
a subprocess, as a user would: the rpc, mapreduce and dfsio acceptance (a 1M-row TeraSort that
TeraValidate accepts with TeraGen's checksum; TestDFSIO on the block store with replication 3), bad
input (unreachable node, refused key, missing Python, dead slurmd: one line naming node, host and
cause), and SIGKILL of pytest in the middle of a TeraSort (nothing of the run left within 30 s).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from child_signals import default_sigint


from pytest_hpcnet.cluster import load_cluster, netns, reaper, slurmbox, sshd
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.cluster.ssh import LAUNCHED_BY_ENV
from pytest_hpcnet.errors import LaunchError

pytestmark = pytest.mark.skipif(not netns.available(), reason=netns.NEEDS_ROOT)

ROOT = Path(__file__).resolve().parents[1]
ROWS = int(os.environ.get("HPCNET_MULTIHOST_ROWS", "1000000"))
LEFT_WITHIN = 30.0

ACCEPTANCE = textwrap.dedent('''
    import os
    from pytest_hpcnet.reference.mapreduce.engine import jobs
    from pytest_hpcnet.reference.mapreduce.engine.driver import Engine
    from pytest_hpcnet.reference.dfs.store import BlockStore
    from pytest_hpcnet.workloads.dfsio import FsTarget, parse_dfsio_args, run_dfsio

    def test_terasort_validates_with_teragen_checksum(cluster, launchers):
        assert len({n.host for n in cluster.nodes}) == 4
        shared = cluster.shared / f"accept-{os.getpid()}"
        shared.mkdir()
        with Engine(cluster, launchers) as engine:
            gen = jobs.teragen(engine, ROWS, shared / "in", maps=4)
            result = jobs.terasort(engine, shared / "in", shared / "out", reduces=4)
            check = jobs.teravalidate(engine, shared / "out", shared / "report")
        assert check.details["lines"] == [f"checksum\\t{gen.details['checksum']}"]
        assert result.records == ROWS

    def test_dfsio_block_store_replication_3(cluster, launchers, workdirs, tmp_path):
        dirs = {name: path / "dfs" for name, path in workdirs.items()}
        with BlockStore(launchers, cluster, transport="tcp", dirs=dirs).start() as store:
            target = FsTarget("blockstore", store=store.spec(replication=3, block_size=512 * 1024))
            def run(*args, **kw):
                opts = parse_dfsio_args(["-nrFiles", "4", *args, "-resFile", str(tmp_path / "res.log")])
                return run_dfsio(opts, target, launchers, cluster, seed=1, **kw)
            written = run("-write", "-size", "2MB")
            assert {t.size for t in written.tasks} == {2 * 2**20}
            assert {t.node for t in written.tasks} == set(cluster.names)
            read = run("-read", "-size", "2MB", verify=True)
            assert {t.size for t in read.tasks} == {2 * 2**20}
''').replace("ROWS", str(ROWS))

TERASORT_UNTIL_KILLED = textwrap.dedent('''
    import os
    from pytest_hpcnet.reference.mapreduce.engine import jobs
    from pytest_hpcnet.reference.mapreduce.engine.driver import Engine

    def test_terasort_until_killed(cluster, launchers):
        shared = cluster.shared / f"killed-{os.getpid()}"
        shared.mkdir()
        with Engine(cluster, launchers) as engine:
            jobs.teragen(engine, 100_000, shared / "in", maps=2)
            marker = os.environ["HPCNET_TEST_MARKER"]

            def hook(event, **info):
                if event == "dispatch" and info.get("kind") == "reduce":
                    open(marker, "w").close()
            engine.on_event = hook
            for i in range(10_000):
                jobs.terasort(engine, shared / "in", shared / f"out{i}", reduces=2)
''')


# --- the daemons ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hosts(tmp_path_factory):
    """Four netns hosts, shared by the sshd and Slurm fixtures."""
    if not netns.available():
        pytest.skip(netns.NEEDS_ROOT)
    root = tmp_path_factory.mktemp("hosts")
    with netns.temporary_netns_cluster(4, root) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def sshds(hosts, tmp_path_factory):
    if why := sshd.missing():
        pytest.skip(why)
    with sshd.EmbeddedSshd(hosts, tmp_path_factory.mktemp("sshd")) as daemons:
        yield daemons


@pytest.fixture(scope="session")
def ssh_inventory(sshds, tmp_path_factory):
    return sshds.write_inventory(tmp_path_factory.mktemp("inv") / "ssh.toml")


@pytest.fixture(scope="session")
def slurm(hosts, tmp_path_factory):
    if why := slurmbox.missing():
        pytest.skip(why)
    with slurmbox.EmbeddedSlurm(hosts, tmp_path_factory.mktemp("slurm")) as box:
        yield box


@pytest.fixture(scope="session")
def slurm_inventory(slurm, tmp_path_factory):
    return slurm.write_inventory(tmp_path_factory.mktemp("inv") / "slurm.toml")


def inner_env(**extra) -> dict:
    env = dict(os.environ, **extra)
    for name in (reaper.RUN_ENV, reaper.CONTROLLER_ENV, "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS",
                 "HPCNET_RUN_SECRET", "SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        env.pop(name, None)
    return env


def run_pytest(args, cwd, timeout=600, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           "-rs", *args], cwd=cwd, env=env or inner_env(), capture_output=True, text=True,
                          timeout=timeout)


# --- acceptance: the suites over each launcher -------------------------------------------------------

def _acceptance(inventory: Path, tmp_path: Path):
    (tmp_path / "test_acceptance.py").write_text(ACCEPTANCE)
    done = run_pytest([str(tmp_path / "test_acceptance.py"),
                       str(ROOT / "suites/rpc/test_conformance.py"),
                       f"--hpcnet-cluster={inventory}", f"--hpcnet-report={tmp_path / 'report'}"], tmp_path)
    (tmp_path / "inner.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
    return done


def test_suites_over_ssh_to_real_sshd(ssh_inventory, tmp_path):
    _acceptance(ssh_inventory, tmp_path)


@pytest.mark.slurm
def test_suites_over_slurm_steps(slurm_inventory, tmp_path):
    _acceptance(slurm_inventory, tmp_path)


# --- bad input: one line naming node, host and cause, within the connect timeout, nothing left ------

def _first_start_error(inventory: Path, tmp_path: Path, node_index: int = 0) -> tuple[str, float]:
    cluster = load_cluster(str(inventory), tmp_path)
    node = cluster.nodes[node_index]
    t0 = time.monotonic()
    with Launchers(cluster, tmp_path / "logs") as launchers:
        with pytest.raises(LaunchError) as err:
            proc = launchers.start(node, [sys.executable, "-c", "print('hi')"])
            code = proc.wait(30)
            out, errtext = proc.output()
            raise LaunchError(errtext.strip() or f"exit {code}")
    elapsed = time.monotonic() - t0
    message = str(err.value)
    print(f"{elapsed:.1f}s: {message}")
    assert "\n" not in message.strip(), message
    return message, elapsed


def _edit(inventory: Path, tmp_path: Path, old: str, new: str, name="bad.toml") -> Path:
    text = inventory.read_text()
    assert old in text
    bad = tmp_path / name
    bad.write_text(text.replace(old, new, 1))
    return bad


def test_ssh_unreachable_node_is_one_line(ssh_inventory, hosts, tmp_path):
    # an address on the hosts' bridge that nobody has: ARP fails, "No route to host"
    first = hosts.nodes[0].host
    ghost = first.rsplit(".", 1)[0] + ".77"
    bad = _edit(ssh_inventory, tmp_path, f'host = "{first}"', f'host = "{ghost}"')
    message, elapsed = _first_start_error(bad, tmp_path)
    assert message.startswith(f"node node0 (host {ghost}): ssh ") and ("route" in message or "timed out" in message), message
    assert elapsed < 10 + 6


def test_ssh_refused_key_is_one_line(ssh_inventory, sshds, tmp_path):
    other = tmp_path / "other_key"
    sshd.keygen(other)
    bad = _edit(ssh_inventory, tmp_path, str(sshds.client_key), str(other))
    message, elapsed = _first_start_error(bad, tmp_path, 1)
    assert message.startswith(f"node node1 (host {load_cluster(str(bad), tmp_path).nodes[1].host}): ssh failed: ")
    assert "Permission denied" in message, message
    assert elapsed < 16


def test_ssh_missing_python_is_one_line(sshds, tmp_path):
    inventory = sshds.write_inventory(tmp_path / "nopy.toml", python="/opt/no/such/python3")
    message, _ = _first_start_error(inventory, tmp_path, 2)
    host = load_cluster(str(inventory), tmp_path).nodes[2].host
    assert message == (f"node node2 (host {host}): no Python at /opt/no/such/python3 "
                       f"(set the inventory key python)"), message


@pytest.mark.slurm
def test_slurm_missing_python_is_one_line(slurm, tmp_path):
    inventory = slurm.write_inventory(tmp_path / "nopy.toml", python="/opt/no/such/python3")
    message, _ = _first_start_error(inventory, tmp_path, 2)
    host = load_cluster(str(inventory), tmp_path).nodes[2].host
    assert message == (f"node node2 (host {host}): no Python at /opt/no/such/python3 "
                       f"(set the inventory key python)"), message


@pytest.mark.slurm
def test_slurmctld_finds_its_port_taken_and_starts_on_another(monkeypatch, tmp_path):
    """Another process binds slurmctld's port between the pick and slurmctld's own bind (a CI run
    lost every Slurm test to that once): slurmctld dies with "Address already in use", and the
    embedded Slurm starts it again on a fresh port."""
    if why := slurmbox.missing():
        pytest.skip(why)
    with netns.temporary_netns_cluster(1, tmp_path / "hosts") as cluster, socket.socket() as taken:
        taken.bind((cluster.controller_address(), 0))
        taken.listen()
        picks = iter([taken.getsockname()[1]])
        fresh = slurmbox.free_port
        monkeypatch.setattr(slurmbox, "free_port", lambda address: next(picks, None) or fresh(address))
        with slurmbox.EmbeddedSlurm(cluster, tmp_path / "slurm") as box:
            assert box.port != taken.getsockname()[1]
            assert f"SlurmctldPort={box.port}" in box.conf.read_text()
            assert [d.poll() for d in box.daemons] == [None] * 3   # munged, slurmctld, one slurmd


@pytest.mark.slurm
def test_slurm_dead_slurmd_is_one_line_and_comes_back(slurm, slurm_inventory, tmp_path):
    # an earlier test's allocation may still be completing on node3: killed now, its slurmd could
    # not confirm, the nodes would stay completing and the allocation below would pend until
    # salloc --immediate gives up (seen: "Connection timed out" after 60 s, naming no node)
    slurm.wait_idle()
    daemon = slurm.slurmd("node3")
    daemon.kill(grace=2.0)
    try:
        message, elapsed = _first_start_error(slurm_inventory, tmp_path, 3)
        host = load_cluster(str(slurm_inventory), tmp_path).nodes[3].host
        assert message.startswith(f"node node3 (host {host}): slurm"), message
        assert elapsed < 10 + 15, elapsed
    finally:
        slurm.restart_slurmd("node3")
    # the cancelled allocation completes (CG) once node3's slurmd is back to confirm it
    deadline = time.monotonic() + 30
    while _squeue(slurm) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _squeue(slurm), "the failed run left a job or step behind"


def _squeue(slurm) -> list[str]:
    env = {**os.environ, **slurm.env()}
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], env=env, capture_output=True, text=True).stdout
    steps = subprocess.run(["squeue", "-h", "-s", "-o", "%i %j"], env=env, capture_output=True, text=True).stdout
    return out.splitlines() + steps.splitlines()


# --- SIGKILL or SIGTERM of pytest in the middle of a TeraSort ---------------------------------------

def _run_processes(pid: int) -> list[int]:
    """Processes started for the controller ``pid``: locally (HPCNET_CONTROLLER), or over ssh
    (HPCNET_LAUNCHED_BY names the controller too)."""
    found = set(reaper.processes_of_controller(pid))
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(LAUNCHED_BY_ENV.encode() + b"=") and item.split(b":")[1:2] == [str(pid).encode()]:
                found.add(int(entry.name))
    return sorted(p for p in found if _alive(p))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_mid_terasort(inventory: Path, tmp_path: Path, sig: signal.Signals, extra_check=None):
    """SIGKILL: nothing tears down, the remote ends notice their controller is gone (channel closed,
    watchdog, reaper). SIGTERM: pytest's own teardown ends them. Either way nothing is left."""
    (tmp_path / "test_inner.py").write_text(TERASORT_UNTIL_KILLED)
    marker = tmp_path / "in-reduce"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider", "-q",
                             "-p", "no:xdist", f"--hpcnet-cluster={inventory}",
                             f"--hpcnet-report={tmp_path / 'report'}"],
                            cwd=tmp_path, env=inner_env(HPCNET_TEST_MARKER=str(marker)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, f"pytest ended before the TeraSort's reduces: {proc.stdout.read()}"
            assert time.monotonic() < deadline, "no reduce dispatched within 120 s"
            time.sleep(0.05)
        time.sleep(0.2)
        started = _run_processes(proc.pid)
        assert len(started) >= 4, f"the run's remote workers are not running: {started}"
        proc.send_signal(sig)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + LEFT_WITHIN
    while True:
        left = _run_processes(proc.pid) + [p for p in started if _alive(p)]
        extra = extra_check() if extra_check else []
        if not (left or extra) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes of the run still there {LEFT_WITHIN:g}s after {sig.name}: {sorted(set(left))}"
    assert not extra, f"left behind {LEFT_WITHIN:g}s after {sig.name}: {extra}"


KILLS = pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)


@KILLS
def test_killed_mid_terasort_over_ssh_leaves_nothing(ssh_inventory, tmp_path, sig):
    _kill_mid_terasort(ssh_inventory, tmp_path, sig)


@KILLS
@pytest.mark.slurm
def test_killed_mid_terasort_over_slurm_leaves_nothing(slurm, slurm_inventory, tmp_path, sig):
    _kill_mid_terasort(slurm_inventory, tmp_path, sig, extra_check=lambda: _squeue(slurm))


# --- the vendor-CI rehearsal: pytest -m ib_qdr suites/mapreduce on 4 hosts through Slurm -------------

@pytest.mark.slurm
def test_vendor_ci_rehearsal_reaches_a_verdict_for_every_seed000_claim(slurm, tmp_path):
    """Each node reads the QDR canned sysfs (the inventory's sysroot) and has an ``ib`` address (the
    same netns link plays IPoIB). Every seed 000 claim needs transport=verbs for its candidate, which
    pyverbs cannot run on a netns host: each must end n/a saying so, none "not evaluated" or failed."""
    import json
    inventory = slurm.write_inventory(tmp_path / "qdr.toml", sysroot=ROOT / "fixtures/sysfs/qdr-westmere",
                                      networks=("eth", "ib"))
    env = inner_env(HPCNET_MAPREDUCE_PAPER_ROWS="20000", HPCNET_MAPREDUCE_PAPER_BYTES="2000000",
                    HPCNET_MAPREDUCE_PAPER_ROUNDS="2")
    done = run_pytest(["-m", "ib_qdr", str(ROOT / "suites/mapreduce"), f"--hpcnet-cluster={inventory}",
                       "--hpcnet-verdicts", "report", f"--hpcnet-report={tmp_path / 'report'}"], tmp_path,
                      env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    record = json.loads(next((tmp_path / "report").glob("*.json")).read_text())
    nodes = record["provenance"]["cluster"]["nodes"]
    assert len({n["host"] for n in nodes}) == 4 and {n["launcher"] for n in nodes} == {"slurm"}
    assert all({"ib_qdr", "lustre"} <= set(n["features"]) for n in nodes)
    seed000 = {v["claim_id"]: v for v in record["verdicts"] if v["claim_id"].startswith("mapreduce.seed000.")}
    assert len(seed000) == 8
    for claim_id, v in seed000.items():
        assert v["outcome"] in ("pass", "warn", "fail", "n/a"), (claim_id, v["outcome"], v["reason"])
        if v["outcome"] == "n/a":
            assert "pyverbs" in v["reason"], v["reason"]


# --- a launched process's kill ends its remote group; --hpcnet-cluster=slurm inside salloc ---------------

def test_ssh_kill_ends_the_remote_process_group(ssh_inventory, tmp_path):
    cluster = load_cluster(str(ssh_inventory), tmp_path)
    with Launchers(cluster, tmp_path / "logs") as launchers:
        proc = launchers.start(cluster.nodes[1], ["sh", "-c", "sleep 60 & echo $!; wait"])
        deadline = time.monotonic() + 20
        while not proc.output()[0].strip():
            assert proc.poll() is None and time.monotonic() < deadline, proc.output()
            time.sleep(0.02)
        grandchild = int(proc.output()[0].split()[0])
        assert _alive(grandchild)
        proc.kill()
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), "the remote program's child outlived kill()"


INSIDE_ALLOCATION = textwrap.dedent('''
    import os

    def test_nodes_come_from_the_allocation(cluster, launchers):
        assert cluster.source == "slurm" and len(cluster.nodes) == 4
        for node in cluster.nodes:
            code, out, err = launchers.run(node, ["ip", "-o", "-4", "addr", "show", "eth0"], timeout=60)
            assert code == 0 and f"inet {node.host}/" in out, (node, out, err)
''')


@pytest.mark.slurm
def test_hpcnet_cluster_slurm_inside_salloc(slurm, tmp_path):
    (tmp_path / "test_inside.py").write_text(INSIDE_ALLOCATION)
    env = inner_env(**slurm.env(), HPCNET_SHARED=str(tmp_path / "shared"), HPCNET_WORKDIR=str(tmp_path / "work"))
    done = subprocess.run(["salloc", "-N", "4", "--immediate=30", sys.executable, "-m", "pytest", "-p",
                           "no:cacheprovider", "-p", "no:xdist", "-q", "test_inside.py", "--hpcnet-cluster=slurm",
                           f"--hpcnet-report={tmp_path / 'report'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout
