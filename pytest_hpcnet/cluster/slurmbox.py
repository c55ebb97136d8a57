"""A real Slurm (Debian's 22.05 slurmctld, slurmd and munge) on one box: one slurmd per netns host.

    with EmbeddedSlurm(netns_cluster, root) as slurm:   # munged, slurmctld -D, slurmd -D -N <node> each
        env = slurm.env()                               # SLURM_CONF=<root>/slurm.conf for the clients
        path = slurm.write_inventory(root / "slurm.toml")

All configuration and state live under ``root``: a munge key from ``mungekey``, ``munged --force`` with
its own socket, pid, log and seed files (``AuthInfo=socket=...`` points Slurm at it), and ``slurm.conf``
with ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none`` (no systemd, no cgroups),
``SelectType=select/cons_tres``, per-node spool/pid/log files with ``%n``. Each node is
``NodeName=<node> NodeAddr=<its netns address>``, so job traffic (slurmctld -> slurmd, slurmstepd ->
srun) crosses the netns links. slurmctld runs in the root namespace on the controller's bridge address
(``SlurmctldHost=<hostname>(<address>)``) with a free port; every slurmd runs in its node's namespace.

Every daemon is a ``LocalProcess`` of this process (its reaper ends them if this process dies); ``stop()``
ends them in any case.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from ..errors import LaunchError
from ..sockets import free_port
from .launcher import LocalProcess
from .model import Cluster
from .sshd import write_inventory

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "salloc", "scancel", "squeue", "scontrol")
SLURMD_PORT = 6818


def missing() -> str | None:
    """Why an embedded Slurm cannot run here, or None."""
    for tool in DAEMONS:
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            return (f"{tool} is not installed (Debian: slurmctld, slurmd, slurm-client and munge), so the "
                    f"real-Slurm tests cannot run")
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class EmbeddedSlurm:
    def __init__(self, cluster: Cluster, root: Path, partition: str = "hpcnet"):
        if why := missing():
            raise LaunchError(why)
        self.cluster, self.root, self.partition = cluster, Path(root), partition
        self.root.mkdir(parents=True, exist_ok=True)
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.controller = cluster.controller_address()
        self.daemons: list[LocalProcess] = []
        self.port: int | None = None

    def env(self) -> dict[str, str]:
        """What a Slurm client (srun, salloc, squeue, scancel) needs in its environment to use this one."""
        return {"SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(exist_ok=True)
        self.port = free_port(self.controller)
        nodes = [f"NodeName={n.name} NodeAddr={n.host} NodeHostname={n.name} Port={SLURMD_PORT} CPUs={os.cpu_count() or 1} "
                 f"RealMemory=256 State=UNKNOWN" for n in self.cluster.nodes]
        for n in self.cluster.nodes:
            (r / "spool" / n.name).mkdir(exist_ok=True)
        self.conf.write_text("\n".join([
            "ClusterName=hpcnet",
            f"SlurmctldHost={socket.gethostname()}({self.controller})",
            f"SlurmctldPort={self.port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill", "SwitchType=switch/none", "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}", f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            f"PlugStackConfig={r / 'plugstack.conf'}",
            "ReturnToService=2", "SlurmdTimeout=30", "SlurmctldTimeout=30", "MessageTimeout=10",
            "InactiveLimit=0", "KillWait=2", "MinJobAge=30", "Waittime=0",
            "SlurmctldDebug=error", "SlurmdDebug=error", "MailProg=/bin/true",
            *nodes,
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            ""]))
        (r / "plugstack.conf").write_text("")

    def start(self) -> "EmbeddedSlurm":
        r = self.root
        self._write_config()
        key = r / "munge" / "munge.key"
        subprocess.run([_tool("mungekey"), "--create", "--keyfile", str(key)], check=True,
                       capture_output=True, timeout=30)
        os.chmod(key, 0o600)
        os.chmod(r / "munge", 0o755)   # munged: the socket's directory must be searchable by all
        env = self.env()
        logdir = r / "log"
        head = self.cluster.nodes[0]
        try:
            munged = LocalProcess(head, [_tool("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                                         f"--key-file={key}", f"--pid-file={r / 'munge' / 'munged.pid'}",
                                         f"--log-file={logdir / 'munged.log'}",
                                         f"--seed-file={r / 'munge' / 'munged.seed'}"], env, r, logdir)
            self.daemons.append(munged)
            self._wait(lambda: self.munge_socket.exists(), munged, "munged", 20)
            self._start_slurmctld(head, env, logdir)
            for node in self.cluster.nodes:
                ns = node.extra["netns"]["namespace"]
                # nsenter, not ``ip netns exec``: that remounts /sys, and slurmd 22.05 loads its cgroup
                # plugin (unused with proctrack/linuxproc) from /sys/fs/cgroup even so
                self.daemons.append(LocalProcess(node, ["nsenter", f"--net=/run/netns/{ns}", _tool("slurmd"),
                                                        "-D", "-N", node.name], env, r, logdir))
            self._wait(self._all_idle, None, "every slurmd to register (sinfo: idle)", 60)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_slurmctld(self, head, env, logdir, attempts: int = 3) -> None:
        """slurmctld on a free port; a port taken in the moment before slurmctld binds it (another
        process picked it too) means a fresh port and a fresh start, not a failed session."""
        for attempt in range(attempts):
            ctld = LocalProcess(head, [_tool("slurmctld"), "-D", "-i"], env, self.root, logdir)
            self.daemons.append(ctld)
            try:
                # the port answering is not enough: whoever took it answers too
                self._wait(self._controller_up, ctld, "slurmctld", 30)
                return
            except LaunchError as e:
                if "Address already in use" not in str(e) or attempt == attempts - 1:
                    raise
                ctld.kill(grace=3.0)
                self.daemons.remove(ctld)
                self._write_config()   # a new port

    def _wait(self, ready, proc, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [d for d in ([proc] if proc else self.daemons) if d.poll() is not None]
            if dead:
                raise LaunchError(f"{what}: {' '.join(dead[0].argv[:6])} exited with {dead[0].poll()}: "
                                  f"{dead[0].output()[1].strip()[-500:]}")
            if time.monotonic() > deadline:
                raise LaunchError(f"{what}: not ready after {timeout:g}s; see {self.root / 'log'}")
            time.sleep(0.2)

    def _controller_up(self) -> bool:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **self.env()})
        return " is UP" in done.stdout

    def _all_idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                              timeout=30, env={**os.environ, **self.env()})
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(n.name, "").startswith("idle") for n in self.cluster.nodes)

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until no job is left (an earlier allocation's cancel completes only once every slurmd
        of it confirms) and every node is idle: a test that kills a slurmd while a job is still
        completing there leaves that job, and its nodes, completing until the slurmd is back."""
        def idle() -> bool:
            done = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30,
                                  env={**os.environ, **self.env()})
            return not done.stdout.strip() and self._all_idle()
        self._wait(idle, None, "every job to end and every node to be idle", timeout)

    def _responding(self, node_name: str) -> bool:
        """The node answers slurmctld again (any state without the not-responding ``*``, not down)."""
        done = subprocess.run(["sinfo", "-h", "-N", "-n", node_name, "-o", "%t"], capture_output=True,
                              text=True, timeout=30, env={**os.environ, **self.env()})
        state = done.stdout.strip()
        return bool(state) and not state.endswith("*") and not state.startswith(("down", "drain", "fail"))

    def slurmd(self, node_name: str) -> LocalProcess:
        for d in self.daemons:
            if d.node.name == node_name and "slurmd" in " ".join(d.argv):
                return d
        raise KeyError(node_name)

    def restart_slurmd(self, node_name: str) -> None:
        """Start ``node_name``'s slurmd again (after a test killed it) and wait until it is idle."""
        old = self.slurmd(node_name)
        old.kill(grace=2.0)
        self.daemons.remove(old)
        self.daemons.append(LocalProcess(old.node, old.argv, self.env(), self.root, self.root / "log"))
        self._wait(lambda: self._responding(node_name), None, f"slurmd on {node_name} to come back", 90)

    def write_inventory(self, path: Path, *, name: str = "slurm-netns", sysroot: Path | None = None,
                        features=(), python: str | None = None, networks=("eth",)) -> Path:
        return write_inventory(path, self.cluster, name=name, launcher="slurm",
                               settings={"slurm": {"conf": str(self.conf), "partition": self.partition}},
                               sysroot=sysroot, features=features, python=python, networks=networks)

    def stop(self) -> None:
        for daemon in reversed(self.daemons):   # slurmds, slurmctld, then munged
            daemon.kill(grace=3.0)
        self.daemons.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
