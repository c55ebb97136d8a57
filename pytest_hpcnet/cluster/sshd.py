"""A real OpenSSH ``sshd -D`` inside every host of a netns cluster: what the ssh launcher is tested against.

    with EmbeddedSshd(netns_cluster, root) as sshd:      # or .start() / .stop()
        path = sshd.write_inventory(root / "ssh.toml")   # launcher = "ssh", one [[nodes]] per host

Everything lives under ``root``: a generated host key, a per-session client key, the ``authorized_keys``
file, a known-hosts file with each node's address, the sshd config (a private one passed with ``-f``;
per node ``-o ListenAddress=<its address>`` and ``-o PidFile``). Nothing in the machine's own sshd
config or ``~/.ssh`` is read for the daemons or changed; the only thing outside ``root`` is OpenSSH's
privilege separation directory (``/run/sshd``), made if it is missing, as the package would.

Each sshd is a ``LocalProcess`` of this process, so its reaper ends them if this process dies; ``stop()``
ends them in any case (and the netns teardown kills whatever still runs inside a namespace).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..errors import LaunchError
from .launcher import LocalProcess
from .model import Cluster

SSHD = "/usr/sbin/sshd"


def missing() -> str | None:
    """Why an embedded sshd cannot run here, or None."""
    for tool in (SSHD, "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"OpenSSH's {tool} is not installed (Debian: openssh-server, openssh-client)"
    return None


def keygen(path: Path) -> str:
    """A new ed25519 key pair at ``path`` (no passphrase); returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hpcnet", "-f", str(path)],
                   check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    return Path(f"{path}.pub").read_text().strip()


def wait_port(host: str, port: int, timeout: float, proc=None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError as e:
            if proc is not None and proc.poll() is not None:
                raise LaunchError(f"{what} exited with {proc.poll()}: {proc.output()[1].strip()[-500:]}") \
                    from None
            if time.monotonic() > deadline:
                raise LaunchError(f"{what}: nothing listens on {host}:{port} after {timeout:g}s ({e})") from None
            time.sleep(0.05)


class EmbeddedSshd:
    def __init__(self, cluster: Cluster, root: Path, port: int = 22):
        if why := missing():
            raise LaunchError(why)
        self.cluster, self.root, self.port = cluster, Path(root), port
        self.root.mkdir(parents=True, exist_ok=True)
        self.host_key = self.root / "host_key"
        self.client_key = self.root / "id_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.config = self.root / "sshd_config"
        self.daemons: list[LocalProcess] = []

    def start(self) -> "EmbeddedSshd":
        host_pub = keygen(self.host_key)
        client_pub = keygen(self.client_key)
        (self.root / "authorized_keys").write_text(client_pub + "\n")
        self.known_hosts.write_text("".join(f"{n.host} {host_pub}\n" for n in self.cluster.nodes))
        self.config.write_text("\n".join([
            f"Port {self.port}",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no", "UseDNS no",
            # many commands share one connection (the launcher's ControlMaster): allow many channels
            "MaxSessions 256", "MaxStartups 64:30:128",
            "PrintMotd no", "PrintLastLog no", "LogLevel ERROR",
            "ClientAliveInterval 5", "ClientAliveCountMax 3", ""]))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        logdir = self.root / "logs"
        logdir.mkdir(exist_ok=True)
        try:
            for node in self.cluster.nodes:
                namespace = node.extra["netns"]["namespace"]
                argv = ["ip", "netns", "exec", namespace, SSHD, "-D", "-e", "-f", str(self.config),
                        "-o", f"ListenAddress={node.host}", "-o", f"PidFile={self.root / (node.name + '.pid')}"]
                self.daemons.append(LocalProcess(node, argv, None, self.root, logdir))
            for node, daemon in zip(self.cluster.nodes, self.daemons):
                wait_port(node.host, self.port, 20, daemon, f"sshd on {node.name}")
        except BaseException:
            self.stop()
            raise
        return self

    def ssh_settings(self) -> dict:
        """The ``[cluster.ssh]`` table of an inventory for these daemons."""
        return {"user": "root", "port": self.port, "identity_file": str(self.client_key), "connect_timeout": 10,
                "options": [f"UserKnownHostsFile={self.known_hosts}", "GlobalKnownHostsFile=/dev/null",
                            "StrictHostKeyChecking=yes", "IdentitiesOnly=yes", "LogLevel=ERROR"]}

    def write_inventory(self, path: Path, *, name: str = "sshd-netns", launcher: str = "ssh",
                        sysroot: Path | None = None, features=(), python: str | None = None,
                        extra_nodes: list[dict] | None = None, networks=("eth",)) -> Path:
        return write_inventory(path, self.cluster, name=name, launcher=launcher,
                               settings={"ssh": self.ssh_settings()}, sysroot=sysroot, features=features,
                               python=python, extra_nodes=extra_nodes, networks=networks)

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.kill(grace=1.0)
        self.daemons.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_inventory(path: Path, cluster: Cluster, *, name: str, launcher: str, settings: dict | None = None,
                    sysroot: Path | None = None, features=(), python: str | None = None,
                    extra_nodes: list[dict] | None = None, networks=("eth",)) -> Path:
    """A TOML inventory naming ``cluster``'s hosts (addresses, work dirs, shared dir, controller) with
    another launcher: what a user writes for a real cluster, generated for the embedded one. Every
    network in ``networks`` (e.g. ``eth, ib``) is the same netns link: a rehearsal of a cluster whose
    nodes have an IPoIB address, not a second fabric."""
    controller = {net: cluster.controller_address() for net in networks}
    lines = ["[cluster]", f"name = {_toml(name)}", f"launcher = {_toml(launcher)}",
             f"shared = {_toml(str(cluster.shared))}", f"controller = {_toml(controller)}",
             f"python = {_toml(python or sys.executable)}"]
    if sysroot is not None:
        lines.append(f"sysroot = {_toml(str(sysroot))}")
    if features:
        lines.append(f"features = {_toml(list(features))}")
    for table, values in (settings or {}).items():
        lines += ["", f"[cluster.{table}]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
    nodes = [{"name": n.name, "host": n.host, "addresses": {net: n.address() for net in networks},
              "workdir": str(n.workdir)}
             for n in cluster.nodes] + list(extra_nodes or [])
    for node in nodes:
        lines += ["", "[[nodes]]"] + [f"{k} = {_toml(v)}" for k, v in node.items() if not isinstance(v, dict)
                                      or k == "addresses"]
        for k, v in node.items():
            if isinstance(v, dict) and k != "addresses":
                lines += [f"[nodes.{k}]"] + [f"{kk} = {_toml(vv)}" for kk, vv in v.items()]
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)
