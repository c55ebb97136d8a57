"""The ``ssh`` launcher: run a command on a real machine through the system ``ssh`` client.

The local end is an ordinary ``LocalProcess`` (its own process group, output captured to files), whose
command is ``ssh -o BatchMode=yes [-p port] [-i key] [user@]host -- <remote command>``. BatchMode makes a
missing key fail at once instead of waiting at a password prompt nobody will answer.

sshd starts the remote command in a new session and process group. The remote command records that group
id in the node's work dir before it execs the real program; ``kill()`` uses a second ssh call to signal
the whole group, because killing only the local client (no tty, so no SIGHUP) would leave the remote
program running. Both remote commands are wrapped in ``sh -c`` so the user's login shell (bash, tcsh,
...) does not matter, and use only POSIX shell and ``ps -o pgid=``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import tempfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

from .launcher import _LIVE, LocalProcess, register
from .model import Node


def ssh_prefix(node: Node, ssh: str = "ssh") -> list[str]:
    """``ssh`` and its options up to and including ``--``, from the node's ``[nodes.ssh]`` settings."""
    settings = node.extra.get("ssh", {})
    argv = [ssh, "-o", "BatchMode=yes"]
    if "port" in settings:
        argv += ["-p", str(settings["port"])]
    if "identity_file" in settings:
        argv += ["-i", str(settings["identity_file"])]
    for option in sorted(settings.get("options", ())):
        argv += ["-o", option]
    user = settings.get("user")
    argv += [f"{user}@{node.host}" if user else node.host, "--"]
    return argv


# Variables that must not appear on a command line (ps shows argv to every user of a machine): the
# run's secret and the engine's per-launch tokens travel on the ssh client's stdin instead.
SECRET_ENV = ("HPCNET_RUN_SECRET", "HPCNET_WORKER_TOKEN")


def split_secrets(env: Mapping[str, str] | None) -> tuple[dict, dict]:
    """(ordinary variables, secret ones) of ``env``; the run's secret is always among the secret ones."""
    public, secret = {}, {}
    for k, v in (env or {}).items():
        (secret if k in SECRET_ENV else public)[k] = v
    if os.environ.get("HPCNET_RUN_SECRET") and "HPCNET_RUN_SECRET" not in secret:
        secret["HPCNET_RUN_SECRET"] = os.environ["HPCNET_RUN_SECRET"]
    return public, secret


def secrets_stdin(secret: Mapping[str, str]) -> bytes:
    """What the ssh client writes to the remote command's stdin: ``K=V`` lines and an empty line."""
    return "".join(f"{k}={v}\n" for k, v in secret.items()).encode() + b"\n"


def remote_command(node: Node, argv: Sequence[str], env: Mapping[str, str] | None, cwd, pidfile: str,
                   read_secrets: bool = False) -> str:
    """One shell line for the remote side: make and enter the work dir, record the group id, exec the
    program; with ``read_secrets`` first export ``K=V`` lines read from stdin up to an empty line."""
    workdir = str(cwd) if cwd is not None else str(PurePosixPath(node.workdir))
    assignments = {**(env or {}), "HPCNET_NODE": node.name}
    q = shlex.quote
    read = 'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv"; done; ' if read_secrets else ""
    script = (f"{read}mkdir -p -- {q(workdir)} && cd -- {q(workdir)} && ps -o pgid= -p $$ > {q(pidfile)} && "
              f"exec env {' '.join(q(f'{k}={v}') for k, v in assignments.items())} "
              f"{' '.join(q(str(a)) for a in argv)}")
    return f"sh -c {q(script)}"


class SshProcess:
    """A command running on another machine; the handle is the local ssh client's process."""

    def __init__(self, node: Node, argv: Sequence[str], env, cwd, logdir: Path, ssh: str = "ssh"):
        self.node, self.argv = node, list(map(str, argv))
        self._ssh = ssh
        # Holds the remote process group id. Absolute, in the work dir, so the kill call finds it
        # whatever directory the command ran in.
        self.pidfile = str(PurePosixPath(node.workdir) / f".hpcnet-{uuid.uuid4().hex}.pid")
        public, secret = split_secrets(env)
        self.ssh_argv = ssh_prefix(node, ssh) + [remote_command(node, argv, public, cwd, self.pidfile,
                                                                read_secrets=bool(secret))]
        # The node's work dir is a remote path; the local client runs in the log dir.
        self._client = LocalProcess(node, self.ssh_argv, None, logdir, logdir,
                                    stdin_data=secrets_stdin(secret) if secret else None)

    def kill_argv(self) -> list[str]:
        """The ssh call that signals the remote process group (TERM, then KILL) and removes the pid file."""
        f = shlex.quote(self.pidfile)
        script = (f"if read pgid < {f}; then kill -s TERM -- -$pgid 2>/dev/null && sleep 1 && "
                  f"kill -s KILL -- -$pgid 2>/dev/null; rm -f {f}; fi; true")
        return ssh_prefix(self.node, self._ssh) + [f"sh -c {shlex.quote(script)}"]

    @property
    def pid(self) -> int:
        return self._client.pid

    def poll(self):
        return self._client.poll()

    def wait(self, timeout=None):
        return self._client.wait(timeout)

    def kill(self, grace: float = 2.0):
        if self._client.poll() is None:
            # An unreachable node: killing the local client below is all we can do.
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(self.kill_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30, check=False)
        self._client.kill(grace)

    def output(self):
        return self._client.output()


@register
class SshLauncher:
    """Nodes are machines reachable with key-based ``ssh``; per-node settings come from ``[nodes.ssh]``."""

    name = "ssh"
    # The inventory checks [cluster.ssh] / [nodes.ssh] against this: key -> type.
    settings = {"user": str, "port": int, "identity_file": Path, "options": list}

    def __init__(self, logdir: str | os.PathLike | None = None, ssh: str = "ssh"):
        self.logdir = Path(logdir) if logdir else Path(tempfile.mkdtemp(prefix="hpcnet-ssh-logs-"))
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.ssh = ssh
        self.started: list[SshProcess] = []
        _LIVE.add(self)  # the atexit safety net closes us too

    def start(self, node, argv, *, env=None, cwd=None):
        proc = SshProcess(node, argv, env, cwd, self.logdir, self.ssh)
        self.started.append(proc)
        return proc

    def close(self):
        for proc in self.started:
            proc.kill()
