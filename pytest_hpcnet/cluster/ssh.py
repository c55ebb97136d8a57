"""The ``ssh`` launcher: run a command on a real machine through the system ``ssh`` client (OpenSSH).

The local end is an ordinary ``LocalProcess`` (its own process group, output captured to files), whose
command is ``ssh -o BatchMode=yes [-p port] [-i key] [user@]host -- <remote command>``. BatchMode makes a
missing key fail at once instead of waiting at a password prompt nobody will answer.

**Connection reuse.** The first start on a node opens one master connection (``ssh -M -S <socket> -N``,
itself a ``LocalProcess``) and waits until its control socket exists, which OpenSSH creates only after
authentication; a node that cannot be reached, or refuses the key, fails here with one line naming the
node, the host and ssh's own reason, within ``connect_timeout`` (default 10 s). Every later command is
``ssh -S <socket> -o ControlMaster=no ...``: a new channel on that connection, no handshake.

**Remote teardown.** sshd starts the remote command in a new session and process group. The remote
command records that group id in the node's work dir, starts the program in the background and then
reads its stdin until EOF. The local client's stdin is a pipe the controller keeps open, so EOF comes
when ``kill()`` closes it, or when the controller dies however it died (the kernel closes the pipe; the
controller's reaper kills the local ssh processes, which ends the session): then the remote side
signals its whole group (TERM, then KILL). This works across machines, where ``reaper``'s watchdog
(same kernel only) cannot. ``kill()`` falls back to a second ssh call that signals the recorded group.
Both remote commands are wrapped in ``sh -c`` so the user's login shell does not matter, and use only
POSIX shell and ``ps -o pgid=``.

**Python on the nodes.** The workloads start ``sys.executable``; on an ssh node that becomes the
inventory's ``python`` (default: the same path, a shared install). A node without it fails with one
line naming the node, the host and the path.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

from ..errors import LaunchError
from . import reaper
from .launcher import _LIVE, ClientProcess, LocalProcess, node_argv, register
from .model import Node

DEFAULT_CONNECT_TIMEOUT = 10
LAUNCHED_BY_ENV = "HPCNET_LAUNCHED_BY"


def ssh_prefix(node: Node, ssh: str = "ssh", control: str | None = None) -> list[str]:
    """``ssh`` and its options up to and including ``--``, from the node's ``[nodes.ssh]`` settings;
    with ``control``, a client of the master connection listening on that socket."""
    settings = node.extra.get("ssh", {})
    argv = [ssh, "-o", "BatchMode=yes"]
    if control:
        argv += ["-S", control, "-o", "ControlMaster=no"]
    if "port" in settings:
        argv += ["-p", str(settings["port"])]
    if "identity_file" in settings:
        argv += ["-i", str(settings["identity_file"])]
    if "connect_timeout" in settings:
        argv += ["-o", f"ConnectTimeout={settings['connect_timeout']}"]
    for option in sorted(settings.get("options", ())):
        argv += ["-o", option]
    argv += [destination(node), "--"]
    return argv


def destination(node: Node) -> str:
    user = node.extra.get("ssh", {}).get("user")
    return f"{user}@{node.host}" if user else node.host


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
                   read_secrets: bool = False, watch_stdin: bool = False) -> str:
    """One shell line for the remote side: make and enter the work dir, record the group id, run the
    program; with ``read_secrets`` first export ``K=V`` lines read from stdin up to an empty line; with
    ``watch_stdin`` the program runs in the background while the shell reads stdin, and EOF there (the
    controller closed it, or is gone) ends the whole process group. A ``python`` that is not there
    ends it at once with one line naming node, host and path."""
    workdir = str(cwd) if cwd is not None else str(PurePosixPath(node.workdir))
    assignments = {**(env or {}), "HPCNET_NODE": node.name}
    q = shlex.quote
    argv = [str(a) for a in argv]
    read = 'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv"; done; ' if read_secrets else ""
    check = ""
    if argv and argv[0] == (node.python or sys.executable):
        what = f"node {node.name} (host {node.host}): no Python at {argv[0]}"
        check = (f"[ -x {q(argv[0])} ] || {{ echo {q(what + ' (set the inventory key python)')} >&2; "
                 f"exit 127; }}; ")
    program = f"env {' '.join(q(f'{k}={v}') for k, v in assignments.items())} {' '.join(map(q, argv))}"
    prologue = f"{read}{check}mkdir -p -- {q(workdir)} && cd -- {q(workdir)} && "
    if not watch_stdin:
        return f"sh -c {q(prologue + f'ps -o pgid= -p $$ > {q(pidfile)} && exec {program}')}"
    # A background list's stdin is /dev/null unless redirected explicitly: the watcher gets the
    # channel as fd 3 -> 0, the program /dev/null.
    script = (prologue + f"pg=$(ps -o pgid= -p $$) && pg=$((pg)) && echo $pg > {q(pidfile)} || exit 126; exec 3<&0; "
              f"{program} </dev/null 3<&- & c=$!; "
              # the watcher: stdin's EOF means the controller closed it or died
              f"{{ trap '' TERM; while read -r _; do :; done; rm -f {q(pidfile)}; kill -s TERM -- -$pg 2>/dev/null; sleep 2; "
              f"kill -s KILL -- -$pg 2>/dev/null; }} <&3 3<&- >/dev/null 2>&1 & w=$!; exec 3<&-; "
              f"wait $c; rc=$?; kill -s KILL $w 2>/dev/null; rm -f {q(pidfile)}; exit $rc")
    return f"sh -c {q(script)}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


class Master:
    """One reusable ssh connection to a node: ``ssh -M -S <socket> -N``, a LocalProcess of its own."""

    def __init__(self, node: Node, socket: str, logdir: Path, ssh: str):
        self.node, self.socket = node, socket
        settings = node.extra.get("ssh", {})
        self.timeout = float(settings.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT))
        prefix = ssh_prefix(node, ssh)
        argv = prefix[:1] + ["-M", "-S", socket, "-N", "-o", "ControlPersist=no",
                             "-o", f"ConnectTimeout={int(self.timeout)}", "-o", "ServerAliveInterval=5",
                             "-o", "ServerAliveCountMax=3"] + prefix[1:-1]
        self.proc = LocalProcess(node, argv, None, logdir, logdir, keep_stdin=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout + 5
        while not os.path.exists(self.socket):
            code = self.proc.poll()
            if code is not None:
                raise LaunchError(f"node {self.node.name} (host {self.node.host}): ssh failed: "
                                  f"{_last_line(self.proc.output()[1])}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise LaunchError(f"node {self.node.name} (host {self.node.host}): ssh did not connect "
                                  f"within {self.timeout:g}s: {_last_line(self.proc.output()[1])}")
            time.sleep(0.01)

    def close(self) -> None:
        self.proc.kill(grace=1.0)


class SshProcess(ClientProcess):
    """A command running on another machine; the handle is the local ssh client's process."""

    def __init__(self, node: Node, argv: Sequence[str], env, cwd, logdir: Path, ssh: str = "ssh",
                 control: str | None = None, watch_stdin: bool = True):
        self.node, self.argv = node, list(map(str, argv))
        self._ssh, self._control = ssh, control
        # Holds the remote process group id. Absolute, in the work dir, so the kill call finds it
        # whatever directory the command ran in.
        self.pidfile = str(PurePosixPath(node.workdir) / f".hpcnet-{uuid.uuid4().hex}.pid")
        public, secret = split_secrets(env)
        # which controller started it (informational; tests look for it): not HPCNET_CONTROLLER, whose
        # watchdog would end it on this machine and hide whether the stdin watch works
        public.setdefault(LAUNCHED_BY_ENV, reaper.controller_id())
        self.ssh_argv = ssh_prefix(node, ssh, control) + [
            remote_command(node, node_argv(node, argv), public, cwd, self.pidfile,
                           read_secrets=bool(secret), watch_stdin=watch_stdin)]
        # The node's work dir is a remote path; the local client runs in the log dir. Its stdin stays
        # open as long as the process should run (see the module's docstring).
        self._client = LocalProcess(node, self.ssh_argv, None, logdir, logdir,
                                    stdin_data=secrets_stdin(secret) if secret else None,
                                    keep_stdin=watch_stdin)
        self._watched = watch_stdin

    def kill_argv(self) -> list[str]:
        """The ssh call that signals the remote process group (TERM, then KILL) and removes the pid file."""
        f = shlex.quote(self.pidfile)
        script = (f"if read pgid < {f}; then kill -s TERM -- -$pgid 2>/dev/null && sleep 1 && "
                  f"kill -s KILL -- -$pgid 2>/dev/null; rm -f {f}; fi; true")
        return ssh_prefix(self.node, self._ssh, self._control) + [f"sh -c {shlex.quote(script)}"]

    def kill(self, grace: float = 2.0):
        if self._client.poll() is None and self._watched:
            self._client.close_stdin()          # the remote watcher ends the group (TERM, 2 s, KILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._client.wait(grace + 3)
        if self._client.poll() is None:
            # An unreachable node: killing the local client below is all we can do.
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(self.kill_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30, check=False)
        self._client.kill(grace)


def _remove_stale_socket_dirs() -> None:
    """Control-socket dirs of controllers that died without ``close()`` (SIGKILL): their masters were
    killed by the reaper, the dirs stay. Named ``hpcnet-ssh-<pid>-*``; a dead pid's dir goes."""
    for d in Path(tempfile.gettempdir()).glob("hpcnet-ssh-*-*"):
        pid = d.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


@register
class SshLauncher:
    """Nodes are machines reachable with key-based ``ssh``; per-node settings come from ``[nodes.ssh]``."""

    name = "ssh"
    # The inventory checks [cluster.ssh] / [nodes.ssh] against this: key -> type.
    settings = {"user": str, "port": int, "identity_file": Path, "options": list, "connect_timeout": int,
                "reuse": bool}

    def __init__(self, logdir: str | os.PathLike | None = None, ssh: str = "ssh", reuse: bool = True):
        self.logdir = Path(logdir) if logdir else Path(tempfile.mkdtemp(prefix="hpcnet-ssh-logs-"))
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.ssh, self.reuse = ssh, reuse
        self.started: list[SshProcess] = []
        self._masters: dict[str, Master] = {}
        self._sockets: str | None = None       # a short dir: a unix socket path has ~100 bytes
        self._lock = threading.Lock()
        _LIVE.add(self)  # the atexit safety net closes us too

    def _control(self, node: Node) -> str | None:
        if not (self.reuse and node.extra.get("ssh", {}).get("reuse", True)):
            return None
        key = f"{destination(node)}:{node.extra.get('ssh', {}).get('port', 22)}"
        with self._lock:
            master = self._masters.get(key)
            if master is None or master.proc.poll() is not None:
                if self._sockets is None:
                    _remove_stale_socket_dirs()
                    self._sockets = tempfile.mkdtemp(prefix=f"hpcnet-ssh-{os.getpid()}-")
                socket = os.path.join(self._sockets, f"m{len(self._masters)}")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(socket)
                master = self._masters[key] = Master(node, socket, self.logdir, self.ssh)
                try:
                    master.wait_ready()
                except LaunchError:
                    del self._masters[key]
                    raise
            return master.socket

    def connect(self, node: Node) -> None:
        """Open (or check) the node's master connection now: a bad node fails here in one line."""
        self._control(node)

    def start(self, node, argv, *, env=None, cwd=None):
        proc = SshProcess(node, argv, env, cwd, self.logdir, self.ssh, control=self._control(node))
        self.started.append(proc)
        return proc

    def close(self):
        for proc in self.started:           # every remote watcher at once, then each in turn
            if proc.poll() is None and proc._watched:
                proc._client.close_stdin()
        for proc in self.started:
            proc.kill()
        for master in self._masters.values():
            master.close()
        self._masters.clear()
        if self._sockets:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None
