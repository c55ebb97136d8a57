"""Nothing a run started outlives it: Ctrl-C, SIGTERM, SIGHUP and SIGKILL of pytest in the middle of a
TeraSort leave no process, namespace or veth behind (within 30 s), on the local and netns launchers;
and a server whose controller is gone ends itself (the watchdog), without help from the reaper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from child_signals import default_sigint


from pytest_hpcnet.cluster import netns, reaper

LEFT_WITHIN = 30.0
# A catchable signal: pytest tears down by itself, deleting its namespaces one by one; each deletion
# waits for the kernel (an RCU grace period), which on a loaded 2-core box has taken 10 s and more.
OWN_TEARDOWN = 180.0

INNER = textwrap.dedent('''
    import os, time
    from pytest_hpcnet.reference.mapreduce.engine import jobs
    from pytest_hpcnet.reference.mapreduce.engine.driver import Engine

    def test_terasort_until_killed(cluster, launchers):
        with Engine(cluster, launchers) as engine:
            jobs.teragen(engine, 100_000, cluster.shared / "in", maps=2)
            marker = os.environ["HPCNET_TEST_MARKER"]

            def hook(event, **info):
                if event == "dispatch" and info.get("kind") == "reduce":
                    with open(marker, "w") as f:
                        f.write(" ".join(n.extra.get("netns", {}).get("namespace", "") for n in cluster.nodes))
            engine.on_event = hook
            for i in range(10_000):
                jobs.terasort(engine, cluster.shared / "in", cluster.shared / f"out{i}", reduces=2)
''')


def _reapers_of(pid: int) -> list[str]:
    out = subprocess.run(["pgrep", "-fa", f"pytest_hpcnet.cluster.reaper {pid}-"], capture_output=True,
                         text=True).stdout
    return out.splitlines()


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


CASES = [("local:2", signal.SIGKILL), ("netns:2", signal.SIGKILL), ("local:2", signal.SIGTERM),
         ("netns:2", signal.SIGHUP), ("netns:2", signal.SIGINT)]



@pytest.mark.parametrize("cluster_spec,sig", CASES, ids=[f"{c.split(':')[0]}-{s.name}" for c, s in CASES])
def test_killed_pytest_leaves_nothing(tmp_path, cluster_spec, sig):
    if cluster_spec.startswith("netns") and not netns.available():
        pytest.skip(netns.NEEDS_ROOT)
    (tmp_path / "test_inner.py").write_text(INNER)
    marker = tmp_path / "in-reduce"
    env = dict(os.environ, HPCNET_TEST_MARKER=str(marker))
    for name in (reaper.RUN_ENV, reaper.CONTROLLER_ENV, "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider", "-q",
                             "-p", "no:xdist", f"--hpcnet-cluster={cluster_spec}",
                             f"--hpcnet-report={tmp_path / 'report'}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert proc.poll() is None, f"pytest ended before the TeraSort's reduces: {proc.stdout.read()}"
            assert time.monotonic() < deadline, "no reduce dispatched within 90 s"
            time.sleep(0.05)
        time.sleep(0.1)
        namespaces = marker.read_text().split()
        started = reaper.processes_of_controller(proc.pid)
        assert len(started) >= 2, "the run's engine workers are not running"
        proc.send_signal(sig)
        proc.wait(OWN_TEARDOWN)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + LEFT_WITHIN
    while True:
        left = reaper.processes_of_controller(proc.pid) + [p for p in started if _alive(p)]
        ours = [n for n in netns.namespaces() if n.startswith(f"{netns.PREFIX}-{proc.pid}-")] \
            if netns.available() else []
        links = {link for link in _root_links() if link.startswith(f"hn{proc.pid}c")}
        reapers = _reapers_of(proc.pid)
        if not (left or ours or links or reapers) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes of the run still there {LEFT_WITHIN:g}s after {sig.name}: {sorted(set(left))}"
    assert not ours and not links, f"namespaces {ours} / links {links} left"
    assert not reapers, f"the reaper did not exit: {reapers}"
    assert all(n not in netns.namespaces() for n in namespaces if n) if netns.available() else True
    if sig != signal.SIGKILL:   # a catchable signal: pytest tore down by itself and said so
        assert proc.returncode == 2, proc.stdout.read()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_server_ends_itself_when_its_controller_dies(tmp_path):
    """The watchdog alone (no reaper involved): a metadata service whose controller is a short-lived
    process exits within a few seconds of that process dying."""
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        env = dict(os.environ, **{reaper.CONTROLLER_ENV: reaper.controller_id(controller.pid)})
        env.pop(reaper.RUN_ENV, None)
        server = subprocess.Popen([sys.executable, "-m", "pytest_hpcnet.reference.dfs.metaservice",
                                   "--dir", str(tmp_path / "meta")], env=env, stdout=subprocess.PIPE,
                                  text=True, start_new_session=True)
        try:
            assert server.stdout.readline().startswith("listening ")
            time.sleep(1.5)
            assert server.poll() is None, "the server exited while its controller was alive"
            controller.kill()
            controller.wait()
            server.wait(10)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    finally:
        controller.kill()
        controller.wait()


def test_watchdog_ignores_a_controller_on_another_machine(monkeypatch):
    monkeypatch.setenv(reaper.CONTROLLER_ENV, "another-boot-id:1:1")
    assert reaper.start_watchdog() is False
    monkeypatch.delenv(reaper.CONTROLLER_ENV)
    assert reaper.start_watchdog() is False
