"""The ``slurm`` launcher: every node process is a Slurm job step, started with ``srun``.

    srun --jobid=<job> --nodes=1 --ntasks=1 --nodelist=<node> --overlap --job-name=hpcnet-<run>-<n>
         --export=ALL --quiet sh -c '<mkdir + cd the work dir, check python, exec the program>'

Inside an allocation (``salloc``/``sbatch``: ``SLURM_JOB_ID`` is set) the steps run in it. Outside
one, the first start obtains an allocation of every slurm node of the inventory (``salloc --no-shell
--immediate=<allocation_timeout>``) and ``close()`` releases it (``scancel <job>``). ``--overlap`` lets
many steps share a node's CPUs, as the workloads need (a server and its clients on one node).

The environment reaches the tasks through ``--export=ALL`` (the run's secret included: never on a
command line). ``kill()`` is ``scancel <job>.<step>`` (the step is found by its unique name), then a
wait for ``srun`` to end. If the controller dies, its reaper kills the local ``srun`` clients and runs
``scancel`` of this run's steps (and of the allocation it made), registered with ``watch_command``; on
the same machine the servers' watchdog ends them too.

The first start on a node runs a trivial step there: a node Slurm cannot run a step on (slurmd dead,
node down) fails with one line naming the node, its host and srun's reason, within ``connect_timeout``.

Settings (``[cluster.slurm]``): ``conf`` (a ``slurm.conf`` for the clients: ``SLURM_CONF``),
``partition``, ``account``, ``time`` (the allocation's limit), ``options`` (more ``srun`` options),
``connect_timeout`` (s, default 10), ``allocation_timeout`` (s, default 60).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..errors import ConfigError, LaunchError
from . import reaper
from .launcher import _LIVE, ClientProcess, LocalProcess, node_argv, register
from .model import Cluster, Node
from .ssh import _last_line, remote_command

DEFAULT_CONNECT_TIMEOUT = 10
DEFAULT_ALLOCATION_TIMEOUT = 60


def _settings(node: Node) -> dict:
    return node.extra.get("slurm", {})


def client_env(node: Node | None = None, conf: str | None = None) -> dict[str, str]:
    conf = conf or (str(_settings(node)["conf"]) if node is not None and "conf" in _settings(node) else None)
    return {"SLURM_CONF": conf} if conf else {}


def _client(argv, env: dict, timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env={**os.environ, **env})
    except FileNotFoundError:
        raise LaunchError(f"{argv[0]} not found: the slurm launcher needs Slurm's client commands") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{' '.join(argv[:3])} ... did not answer within {timeout:g}s") from None


class SlurmStep(ClientProcess):
    """One job step; the handle is the local ``srun`` client's process."""

    def __init__(self, launcher: "SlurmLauncher", node: Node, argv, env, cwd, job: str, name: str):
        self.node, self.argv = node, list(map(str, argv))
        self.launcher, self.job, self.name = launcher, job, name
        settings = _settings(node)
        self.srun_argv = ["srun", f"--jobid={job}", "--nodes=1", "--ntasks=1", f"--nodelist={node.name}",
                          "--overlap", f"--job-name={name}", "--export=ALL", "--quiet", "--chdir=/",
                          *settings.get("options", ()),
                          *shlex.split(remote_command(node, node_argv(node, argv), None, cwd, "/dev/null"))]
        self._client = LocalProcess(node, self.srun_argv, {**(env or {}), **client_env(node)},
                                    launcher.logdir, launcher.logdir)

    def step_id(self) -> str | None:
        done = _client(["squeue", "--steps", f"--jobs={self.job}", "--noheader", "--format=%i %j"],
                       client_env(self.node), 30)
        for line in done.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == self.name:
                return parts[0]
        return None

    def kill(self, grace: float = 2.0):
        if self._client.poll() is None:
            with contextlib.suppress(LaunchError):
                step = self.step_id()
                if step:
                    _client(["scancel", step], client_env(self.node), 30)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._client.wait(grace + 8)
        if self._client.poll() is None:
            # no step registered yet (or scancel failed): srun ends its step on a second Ctrl-C
            for _ in range(2):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._client.pid, 2)
                time.sleep(0.2)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._client.wait(grace + 3)
        self._client.kill(grace)


@register
class SlurmLauncher:
    """Nodes are Slurm nodes (``NodeName``s); processes are job steps. See the module's docstring."""

    name = "slurm"
    settings = {"conf": Path, "partition": str, "account": str, "time": str, "options": list,
                "connect_timeout": int, "allocation_timeout": int}
    wants_cluster = True   # pool.Launchers passes the cluster: the allocation covers all its slurm nodes

    def __init__(self, logdir: str | os.PathLike | None = None, cluster: Cluster | None = None):
        self.logdir = Path(logdir) if logdir else Path(tempfile.mkdtemp(prefix="hpcnet-slurm-logs-"))
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster
        self.started: list[SlurmStep] = []
        self.job: str | None = None
        self.owned = False             # the allocation is ours to release
        self._checked: set[str] = set()
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self.run_tag = f"hpcnet-{reaper.ensure_started()}"
        self._cleanup: list[str] = []
        _LIVE.add(self)

    def _nodes(self, node: Node) -> list[Node]:
        if self.cluster is None:
            return [node]
        return [n for n in self.cluster.nodes if n.launcher == self.name] or [node]

    def allocation(self, node: Node) -> str:
        """The job the steps run in: the one we are inside, or one obtained now for the inventory's nodes."""
        with self._lock:
            if self.job:
                return self.job
            env = client_env(node)
            conf = env.get("SLURM_CONF", "")
            inside = os.environ.get("SLURM_JOB_ID")
            if inside:
                self.job = inside
            else:
                self._allocate(node, env)
            # should this controller die: cancel this run's steps (they live under slurmd, maybe on
            # other machines), and the allocation if it is ours
            prefix = f"SLURM_CONF={shlex.quote(conf)} " if conf else ""
            steps = (f"{prefix}squeue --steps --jobs={self.job} --noheader --format='%i %j' | "
                     f"awk '$2 ~ /^{self.run_tag}-/ {{print $1}}' | xargs -r {prefix}scancel")
            self._cleanup.append(steps)
            if self.owned:
                self._cleanup.append(f"{prefix}scancel {self.job}")
            for line in self._cleanup:
                reaper.watch_command(line)
            return self.job

    def _allocate(self, node: Node, env: dict) -> None:
        settings = _settings(node)
        nodes = self._nodes(node)
        wait = int(settings.get("allocation_timeout", DEFAULT_ALLOCATION_TIMEOUT))
        argv = ["salloc", "--no-shell", f"--nodes={len(nodes)}",
                f"--nodelist={','.join(n.name for n in nodes)}", f"--job-name={self.run_tag}",
                f"--immediate={wait}"]
        for key, flag in (("partition", "--partition"), ("account", "--account"), ("time", "--time")):
            if key in settings:
                argv.append(f"{flag}={settings[key]}")
        done = _client(argv, env, wait + 30)
        m = re.search(r"Granted job allocation (\d+)", done.stderr + done.stdout)
        if done.returncode != 0 or not m:
            names = ", ".join(f"{n.name} (host {n.host})" for n in nodes)
            raise LaunchError(f"slurm: no allocation of {names}: {_last_line(done.stderr)}")
        self.job, self.owned = m.group(1), True

    def connect(self, node: Node) -> None:
        """Run a trivial step on ``node`` now: a node Slurm cannot run steps on fails here, in one line."""
        job = self.allocation(node)
        if node.name in self._checked:
            return
        timeout = float(_settings(node).get("connect_timeout", DEFAULT_CONNECT_TIMEOUT))
        # the node's Python too: its absence is one line from the step (see ssh.remote_command)
        step = SlurmStep(self, node, [sys.executable, "-c", "pass"], None, "/", job,
                         f"{self.run_tag}-check-{next(self._seq)}")
        try:
            code = step.wait(timeout)
        except subprocess.TimeoutExpired:
            step.kill()
            raise LaunchError(f"node {node.name} (host {node.host}): slurm could not run a step there "
                              f"within {timeout:g}s: {_last_line(step.output()[1])}") from None
        if code != 0:
            err = step.output()[1]
            ours = [line for line in err.splitlines() if line.startswith(f"node {node.name} (")]
            raise LaunchError(ours[0] if ours else
                              f"node {node.name} (host {node.host}): slurm step failed: {_last_line(err)}")
        self._checked.add(node.name)

    def start(self, node, argv, *, env=None, cwd=None):
        self.connect(node)
        step = SlurmStep(self, node, argv, env, cwd, self.job, f"{self.run_tag}-{next(self._seq)}")
        self.started.append(step)
        return step

    def close(self):
        live = [s for s in self.started if s.poll() is None]
        if live and self.job:
            # one scancel for every live step of this run, then each in turn
            with contextlib.suppress(LaunchError):
                ids = [s.step_id() for s in live]
                ids = [i for i in ids if i]
                if ids:
                    _client(["scancel", *ids], client_env(live[0].node), 30)
        for step in self.started:
            step.kill()
        if self.owned and self.job:
            with contextlib.suppress(LaunchError):
                _client(["scancel", self.job], client_env(self.started[0].node if self.started else None,
                                                          self._conf()), 30)
            self.job, self.owned = None, False
        for line in self._cleanup:
            reaper.forget_command(line)
        self._cleanup.clear()

    def _conf(self) -> str | None:
        if self.cluster:
            for n in self.cluster.nodes:
                if "conf" in _settings(n):
                    return str(_settings(n)["conf"])
        return None


def cluster_from_allocation(root: Path, where: str | None = None) -> Cluster:
    """``--hpcnet-cluster=slurm`` inside ``salloc``/``sbatch``: the allocation's nodes
    (``scontrol show hostnames $SLURM_JOB_NODELIST``), each reached at its ``NodeAddr``, with the slurm
    launcher. Work dirs: ``$HPCNET_WORKDIR`` (default ``/tmp/hpcnet-<job>``) on each node; the shared dir:
    ``$HPCNET_SHARED`` (default ``.hpcnet-shared/<job>`` under the current directory, which on a cluster
    is normally on the shared file system)."""
    nodelist, job = os.environ.get("SLURM_JOB_NODELIST"), os.environ.get("SLURM_JOB_ID")
    if not nodelist or not job:
        raise ConfigError("'slurm': run inside a Slurm allocation (salloc or sbatch): SLURM_JOB_NODELIST "
                          "is not set", where)
    done = _client(["scontrol", "show", "hostnames", nodelist], {}, 30)
    names = done.stdout.split()
    if done.returncode != 0 or not names:
        raise ConfigError(f"'slurm': scontrol show hostnames {nodelist} failed: {_last_line(done.stderr)}", where)
    addrs = {}
    shown = _client(["scontrol", "show", "node", ",".join(names), "--oneliner"], {}, 30)
    for line in shown.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            addrs[fields["NodeName"]] = fields.get("NodeAddr", fields["NodeName"])
    workdir = Path(os.environ.get("HPCNET_WORKDIR", f"/tmp/hpcnet-{job}"))
    shared = Path(os.environ.get("HPCNET_SHARED", Path.cwd() / ".hpcnet-shared" / job)).absolute()
    shared.mkdir(parents=True, exist_ok=True)
    python = os.environ.get("HPCNET_PYTHON") or None
    nodes = tuple(Node(name=n, host=addrs.get(n, n), addresses={"eth": addrs.get(n, n)}, workdir=workdir / n,
                       shared=shared, launcher="slurm", python=python) for n in names)
    from .inventory import derive_controller
    controller, how = derive_controller(nodes)
    # the Slurm cluster's own name (Slurm sets it in every job) names the cluster across jobs: the
    # nightly history of one cluster is one line, whatever the job id
    name = f"slurm:{os.environ.get('SLURM_CLUSTER_NAME') or 'cluster'}:{job}"
    return Cluster(name=name, nodes=nodes, source="slurm", shared=shared, controller=controller,
                   controller_source=how)
