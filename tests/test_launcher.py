"""The local launcher: processes start where and how they were asked to, and nothing outlives kill/close."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pytest_hpcnet.cluster import LAUNCHERS, local_cluster, run
from pytest_hpcnet.cluster.launcher import LocalLauncher, wait_all
from pytest_hpcnet.cluster.model import Node
from pytest_hpcnet.cluster.ssh import SshLauncher, remote_command, ssh_prefix
from pytest_hpcnet.errors import LaunchError

# Prints the pid of a forked grandchild (a sleep), then waits for it: the shape of a daemon-spawning tool.
SPAWN_GRANDCHILD = ["sh", "-c", "sleep 60 & echo $!; wait"]


@pytest.fixture
def cluster(tmp_path):
    return local_cluster(2, tmp_path / "cluster")


@pytest.fixture
def launcher(tmp_path):
    launcher = LocalLauncher(logdir=tmp_path / "logs")
    yield launcher
    launcher.close()


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def wait_until(condition, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def first_line_pid(proc) -> int:
    wait_until(lambda: proc.output()[0].strip(), what="the grandchild's pid on stdout")
    return int(proc.output()[0].split()[0])


def test_local_launcher_is_registered():
    assert LAUNCHERS["local"] is LocalLauncher


def test_start_wait_and_output(launcher, cluster):
    proc = launcher.start(cluster.nodes[0], ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert proc.wait(10) == 3
    assert proc.poll() == 3
    assert proc.output() == ("out\n", "err\n")


def test_output_larger_than_a_pipe_buffer_does_not_block(launcher, cluster):
    code, out, _ = run(launcher, cluster.nodes[0], ["sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x"],
                       timeout=30)
    assert code == 0 and len(out) == 1_000_000


def test_env_cwd_and_node_name_are_honoured(launcher, cluster, tmp_path):
    node = cluster.nodes[1]
    code, out, _ = run(launcher, node, ["sh", "-c", 'echo "$GREETING"; pwd; echo "$HPCNET_NODE"'],
                       env={"GREETING": "hello there"}, cwd=tmp_path, timeout=30)
    assert code == 0
    assert out.splitlines() == ["hello there", str(tmp_path), node.name]


def test_default_cwd_is_the_node_workdir_and_it_is_created(launcher, tmp_path):
    node = local_cluster(1, tmp_path / "c").nodes[0]
    node.workdir.rmdir()
    code, out, _ = run(launcher, node, ["pwd"], timeout=30)
    assert code == 0 and Path(out.strip()) == node.workdir.resolve()


def test_kill_ends_the_whole_process_group_including_a_grandchild(launcher, cluster):
    proc = launcher.start(cluster.nodes[0], SPAWN_GRANDCHILD)
    grandchild = first_line_pid(proc)
    assert alive(proc.pid) and alive(grandchild)
    proc.kill()
    assert proc.poll() is not None
    wait_until(lambda: not alive(grandchild), what="the grandchild to die")
    assert launcher.live_pids() == []


def test_kill_escalates_to_sigkill_for_a_grandchild_that_ignores_sigterm(launcher, cluster):
    proc = launcher.start(cluster.nodes[0], ["sh", "-c", "trap '' TERM; sleep 60 & echo $!; wait"])
    grandchild = first_line_pid(proc)
    proc.kill(grace=0.2)
    wait_until(lambda: not alive(grandchild), what="the grandchild to die")


def test_close_kills_everything_started_including_orphans_of_an_exited_leader(launcher, cluster):
    running = [launcher.start(node, SPAWN_GRANDCHILD) for node in cluster.nodes]
    # The leader exits at once; its background sleep is orphaned but stays in the process group.
    orphaning = launcher.start(cluster.nodes[0], ["sh", "-c", "sleep 60 & echo $!"])
    pids = [p.pid for p in running] + [first_line_pid(p) for p in running] + [first_line_pid(orphaning)]
    assert orphaning.wait(10) == 0
    assert all(alive(pid) for pid in pids)
    launcher.close()
    wait_until(lambda: not any(alive(pid) for pid in pids), what="every started process to die")
    with pytest.raises(ProcessLookupError):
        os.kill(running[0].pid, 0)  # reaped, not just signalled


def test_close_does_not_signal_a_group_whose_id_was_reused(launcher, cluster):
    # A long run wraps pids around; a finished process's group id may then belong to a stranger.
    proc = launcher.start(cluster.nodes[0], ["true"])
    assert proc.wait(10) == 0
    stranger = LocalLauncher(logdir=launcher.logdir / "stranger")
    try:
        other = stranger.start(cluster.nodes[0], ["sleep", "60"])
        proc.popen.pid = other.pid  # pretend the kernel handed our old pid to the stranger
        launcher.close()
        with pytest.raises(subprocess.TimeoutExpired):  # a SIGKILL would have ended it well within this
            other.wait(0.5)
    finally:
        stranger.close()


def test_run_timeout_raises_and_leaves_nothing_running(launcher, cluster):
    with pytest.raises(LaunchError, match="did not finish in 0.5s"):
        run(launcher, cluster.nodes[0], SPAWN_GRANDCHILD, timeout=0.5)
    proc = launcher.started[-1]
    grandchild = int(proc.output()[0].split()[0])
    assert proc.poll() is not None
    wait_until(lambda: not alive(grandchild), what="the grandchild to die")


def test_starting_a_missing_binary_raises_launch_error(launcher, cluster):
    with pytest.raises(LaunchError, match="no-such-binary-hpcnet.*node0"):
        launcher.start(cluster.nodes[0], ["no-such-binary-hpcnet", "--flag"])
    assert launcher.started == []


def test_wait_all_returns_every_exit_code(launcher, cluster):
    procs = [launcher.start(node, ["sh", "-c", f"exit {i}"]) for i, node in enumerate(cluster.nodes)]
    assert wait_all(procs, timeout=10) == [0, 1]


def test_run_kills_the_command_when_interrupted(launcher, cluster, monkeypatch):
    started = []
    real_start = launcher.start

    def start_then_interrupt(*args, **kwargs):
        proc = real_start(*args, **kwargs)
        started.append(proc)
        monkeypatch.setattr(proc, "wait", lambda timeout=None: (_ for _ in ()).throw(KeyboardInterrupt))
        return proc

    monkeypatch.setattr(launcher, "start", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run(launcher, cluster.nodes[0], ["sleep", "60"], timeout=30)
    assert started[0].poll() is not None


# --- the ssh launcher: argv construction, and the remote command run by a local stand-in for ssh ---

def ssh_node(tmp_path, **settings):
    return Node(name="ri-node01", host="ri-node01.example", addresses={"eth": "ri-node01.example"},
                workdir=tmp_path / "remote work", launcher="ssh", extra={"ssh": settings} if settings else {})


def test_ssh_launcher_is_registered():
    assert LAUNCHERS["ssh"] is SshLauncher


def test_ssh_prefix_without_settings_is_batch_mode_to_the_host(tmp_path):
    assert ssh_prefix(ssh_node(tmp_path)) == ["ssh", "-o", "BatchMode=yes", "ri-node01.example", "--"]


def test_ssh_prefix_carries_user_port_identity_and_options(tmp_path):
    node = ssh_node(tmp_path, user="hpc", port=2222, identity_file=Path("/keys/id"),
                    options=["StrictHostKeyChecking=accept-new"])
    assert ssh_prefix(node, ssh="/usr/bin/ssh") == [
        "/usr/bin/ssh", "-o", "BatchMode=yes", "-p", "2222", "-i", "/keys/id",
        "-o", "StrictHostKeyChecking=accept-new", "hpc@ri-node01.example", "--"]


def test_ssh_process_argv_ends_with_one_quoted_remote_command(tmp_path):
    launcher = SshLauncher(logdir=tmp_path / "logs", ssh="false", reuse=False)  # `false` stands in: nothing connects
    try:
        proc = launcher.start(ssh_node(tmp_path, port=22), ["echo", "two words", "$HOME"], env={"A": "b c"})
        assert proc.ssh_argv[:-1] == ["false", "-o", "BatchMode=yes", "-p", "22", "ri-node01.example", "--"]
        command = proc.ssh_argv[-1]
        assert "'two words'" in command and "'$HOME'" in command and "'A=b c'" in command
        assert "HPCNET_NODE=ri-node01" in command and proc.pidfile in command
        assert proc.wait(10) == 1
    finally:
        launcher.close()


def test_remote_command_runs_in_the_workdir_with_env_and_records_its_group(tmp_path):
    # What sshd does with the command: hand it to the login shell, in a new session. Do that here.
    node = ssh_node(tmp_path)
    pidfile = str(tmp_path / "cmd.pid")
    command = remote_command(node, ["sh", "-c", 'echo "$A|$HPCNET_NODE"; pwd', "ignored"],
                             {"A": "x y"}, None, pidfile)
    shell = subprocess.Popen(["sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    out, err = shell.communicate(timeout=30)
    assert shell.returncode == 0, err
    assert out.splitlines() == ["x y|ri-node01", str(node.workdir)]
    assert int(Path(pidfile).read_text()) == shell.pid  # the group the kill call will signal


@pytest.fixture
def fake_ssh(tmp_path):
    """An executable that acts like ssh + sshd on this host: drop the options, run the command in a new
    session. It never opens a socket."""
    script = tmp_path / "fake-ssh"
    script.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift\nexec setsid -w sh -c "$1"\n')
    script.chmod(0o755)
    return str(script)


def test_ssh_kill_signals_the_remote_process_group(tmp_path, fake_ssh):
    launcher = SshLauncher(logdir=tmp_path / "logs", ssh=fake_ssh, reuse=False)
    remote_group = None
    try:
        proc = launcher.start(ssh_node(tmp_path), SPAWN_GRANDCHILD)
        grandchild = first_line_pid(proc)
        wait_until(lambda: Path(proc.pidfile).exists(), what="the pid file")
        remote_group = int(Path(proc.pidfile).read_text())
        proc.kill()
        assert proc.poll() is not None
        wait_until(lambda: not alive(grandchild) and not alive(remote_group), what="the remote group to die")
        assert not Path(proc.pidfile).exists()
    finally:
        launcher.close()
        if remote_group is not None:  # the "remote" side is its own session: clean it up if kill() failed
            try:
                os.killpg(remote_group, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_ssh_hands_secrets_to_the_remote_command_on_stdin_not_argv(tmp_path, fake_ssh, monkeypatch):
    monkeypatch.setenv("HPCNET_RUN_SECRET", "s3cr3t-run")
    launcher = SshLauncher(logdir=tmp_path / "logs", ssh=fake_ssh, reuse=False)
    try:
        proc = launcher.start(ssh_node(tmp_path), ["sh", "-c", 'echo "$HPCNET_RUN_SECRET|$HPCNET_WORKER_TOKEN|$A"'],
                              env={"HPCNET_WORKER_TOKEN": "t0ken", "A": "plain"})
        assert proc.wait(30) == 0, proc.output()[1]
        assert proc.output()[0].strip() == "s3cr3t-run|t0ken|plain"
        argv = " ".join(proc.ssh_argv)
        assert "s3cr3t-run" not in argv and "t0ken" not in argv and "A=plain" in argv
    finally:
        launcher.close()


# -- the registry: one class per name; third parties through entry points or the hook -----------------
class _Echoing(LocalLauncher):
    name = "test-echoing"


def test_registering_a_second_class_under_a_taken_name_is_refused_in_one_line():
    from pytest_hpcnet.cluster.launcher import register
    from pytest_hpcnet.errors import ConfigError

    class Impostor(LocalLauncher):
        name = "local"

    with pytest.raises(ConfigError) as e:
        register(Impostor)
    message = str(e.value)
    assert "\n" not in message
    assert "'local' is taken by pytest_hpcnet.cluster.launcher.LocalLauncher" in message
    assert "Impostor" in message
    assert LAUNCHERS["local"] is LocalLauncher


def test_registering_the_same_class_again_is_harmless_and_unregister_removes_it():
    from pytest_hpcnet.cluster.launcher import register, unregister
    try:
        assert register(_Echoing) is _Echoing
        assert register(_Echoing) is _Echoing
        assert LAUNCHERS["test-echoing"] is _Echoing
    finally:
        unregister(_Echoing)
    assert "test-echoing" not in LAUNCHERS


def test_a_launcher_without_a_name_or_start_is_refused():
    from pytest_hpcnet.cluster.launcher import register
    from pytest_hpcnet.errors import ConfigError

    class Nameless(LocalLauncher):
        name = ""

    class NoStart:
        name = "test-nostart"

        def close(self):
            pass

    with pytest.raises(ConfigError, match="non-empty string class attribute 'name'"):
        register(Nameless)
    with pytest.raises(ConfigError, match="lacks start"):
        register(NoStart)


THIRD_PARTY = '''
from pytest_hpcnet.cluster.launcher import LocalLauncher


class TaggingLauncher(LocalLauncher):
    """Local processes that see HPCNET_VIA=tagging: proves which launcher started them."""
    name = "tagging"

    def start(self, node, argv, *, env=None, cwd=None):
        return super().start(node, argv, env={**(env or {}), "HPCNET_VIA": "tagging"}, cwd=cwd)
'''


def _install_fake_distribution(where: Path, entry_points: str) -> None:
    """A distribution as an installer leaves it: a module plus a dist-info with entry_points.txt."""
    (where / "vendor_launch.py").write_text(THIRD_PARTY)
    info = where / "vendor_launch-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-launch\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_entry_points_register_third_party_launchers(tmp_path, monkeypatch):
    from pytest_hpcnet.cluster import launcher as registry
    _install_fake_distribution(tmp_path, "[pytest_hpcnet.launchers]\ntagging = vendor_launch:TaggingLauncher\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = registry.load_entry_points()
        assert [cls.name for cls in found] == ["tagging"]
        launcher = registry.launcher_for("tagging")(logdir=tmp_path / "logs")
        node = local_cluster(1, tmp_path / "cluster").nodes[0]
        try:
            code, out, _ = run(launcher, node, ["sh", "-c", "echo $HPCNET_VIA"], timeout=30)
        finally:
            launcher.close()
        assert (code, out.strip()) == (0, "tagging")
    finally:
        for cls in list(LAUNCHERS.values()):
            if cls.__module__ == "vendor_launch":
                registry.unregister(cls)


def test_an_entry_point_whose_name_differs_from_the_launchers_or_that_clashes_is_refused(tmp_path, monkeypatch):
    from pytest_hpcnet.cluster import launcher as registry
    from pytest_hpcnet.errors import ConfigError
    _install_fake_distribution(tmp_path, "[pytest_hpcnet.launchers]\nlocal = vendor_launch:TaggingLauncher\n"
                                         "broken = vendor_launch:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from importlib import metadata
    eps = list(metadata.entry_points(group=registry.ENTRY_POINT_GROUP))
    by_name = {ep.name: ep for ep in eps if ep.value.startswith("vendor_launch:")}
    with pytest.raises(ConfigError, match=r"entry point local = vendor_launch:TaggingLauncher .*names launcher "
                                          r"'tagging'; the entry point's name must be the launcher's name"):
        registry.load_entry_points([by_name["local"]])
    with pytest.raises(ConfigError, match=r"entry point broken = vendor_launch:Missing .*cannot load: AttributeError"):
        registry.load_entry_points([by_name["broken"]])
    assert LAUNCHERS["local"] is LocalLauncher


def test_an_inventory_can_name_a_launcher_a_conftest_adds_through_the_hook(pytester, tmp_path):
    """The hook end to end: the conftest's launcher starts the probe and the test's command."""
    pytester.makeconftest(THIRD_PARTY + '''

def pytest_hpcnet_launchers():
    return [TaggingLauncher]
''')
    pytester.makefile(".toml", cluster=f'''
[cluster]
launcher = "tagging"
workdir = "{tmp_path / 'nodes'}"

[[nodes]]
name = "n0"
host = "localhost"
addresses = {{ eth = "127.0.0.1" }}
''')
    pytester.makepyfile('''
def test_tagged(cluster, launchers):
    node = cluster.nodes[0]
    code, out, err = launchers.run(node, ["sh", "-c", "echo $HPCNET_VIA"], timeout=30)
    assert (code, out.strip()) == (0, "tagging"), err
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hpcnet-cluster=cluster.toml",
                                           f"--hpcnet-report={tmp_path / 'report'}", timeout=240)
    result.assert_outcomes(passed=1)


def test_a_hook_launcher_clashing_with_a_built_in_one_is_a_usage_error(pytester, tmp_path):
    pytester.makeconftest('''
from pytest_hpcnet.cluster.launcher import LocalLauncher


class Clash(LocalLauncher):
    name = "ssh"


def pytest_hpcnet_launchers():
    return [Clash]
''')
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--hpcnet-report={tmp_path / 'report'}",
                                           timeout=240)
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*pytest-hpcnet: *launcher name 'ssh' is taken by "
                                 "pytest_hpcnet.cluster.ssh.SshLauncher; refusing conftest.Clash*"])


def test_the_hookspec_example_launcher_runs_as_pasted(pytester, tmp_path):
    """hookspec.py's example conftest, pasted unchanged, adds a launcher an inventory can name."""
    import textwrap

    from pytest_hpcnet import hookspec
    doc = hookspec.pytest_hpcnet_launchers.__doc__
    example = doc.split("Example::", 1)[1].split("\n\n    A package", 1)[0]
    pytester.makeconftest(textwrap.dedent(example))
    pytester.makefile(".toml", cluster=f'''
[cluster]
launcher = "nice"
workdir = "{tmp_path / 'nodes'}"

[[nodes]]
name = "n0"
host = "localhost"
''')
    pytester.makepyfile('''
import os

def test_niced(cluster, launchers):
    code, out, err = launchers.run(cluster.nodes[0], ["nice"], timeout=30)
    assert (code, int(out)) == (0, min(19, os.nice(0) + 10)), err
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hpcnet-cluster=cluster.toml",
                                           f"--hpcnet-report={tmp_path / 'report'}", timeout=240)
    result.assert_outcomes(passed=1)


def test_cluster_open_is_a_cluster_and_its_launchers_for_a_with_block(tmp_path):
    """``cluster.open(spec, root)``: the cluster a ``--hpcnet-cluster`` value names, launchers on it, and
    at the end every process they started is gone; a bad spec is one ConfigError line."""
    from pytest_hpcnet import cluster as clusters
    from pytest_hpcnet.errors import ConfigError
    with clusters.open("local:2", tmp_path) as (cluster, launchers):
        assert [n.name for n in cluster.nodes] == ["node0", "node1"]
        assert cluster.nodes[1].workdir == tmp_path / "node1"
        proc = launchers.start(cluster.nodes[1], ["sleep", "60"])
        assert proc.poll() is None
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is not None
    with pytest.raises(ConfigError, match="'local:x': expected local:N or netns:N") as e:
        with clusters.open("local:x", tmp_path, where="--cluster"):
            pass
    assert "\n" not in str(e.value)
