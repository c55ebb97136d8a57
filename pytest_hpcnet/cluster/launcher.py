"""Starting processes on nodes.

A ``Launcher`` starts a command on a node and hands back a ``Process``. Backends are small classes in
``LAUNCHERS`` (keyed by the inventory's ``launcher`` field); ``local`` runs subprocesses on this host,
others (netns, ssh, slurm) add themselves with ``@register``. Every launcher remembers what it started
so ``close()`` can kill it all: the plugin calls it on success, failure and Ctrl-C.

A third party adds a launcher without editing this package: its distribution names the class under the
entry point group ``pytest_hpcnet.launchers`` (loaded on the first lookup, ``known_launchers()``), or a
conftest/plugin implements the ``pytest_hpcnet_launchers`` hook (see ``hookspec``). A name is taken
once: registering a second class under it is refused, in one line naming both classes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import ClassVar, Mapping, Protocol, Sequence

from ..errors import ConfigError, LaunchError
from ..registry import Registry
from . import reaper
from .model import Node


class Process(Protocol):
    node: Node
    argv: Sequence[str]

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...
    def output(self) -> tuple[str, str]: ...  # (stdout, stderr) so far


class Launcher(Protocol):
    name: ClassVar[str]

    def start(self, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike | None = None) -> Process: ...
    def close(self) -> None: ...


ENTRY_POINT_GROUP = "pytest_hpcnet.launchers"
_REGISTRY = Registry("launcher", ENTRY_POINT_GROUP, ("start", "close"), "pytest_hpcnet_launchers hook")
LAUNCHERS = _REGISTRY.classes
register, unregister = _REGISTRY.register, _REGISTRY.unregister
load_entry_points, register_from_hook = _REGISTRY.load_entry_points, _REGISTRY.register_from_hook
known_launchers = _REGISTRY.known


def node_argv(node: Node, argv: Sequence[str]) -> list[str]:
    """``argv`` for ``node``: the controller's interpreter (``sys.executable``, what the workloads start)
    becomes the node's ``python`` from the inventory, if it names one."""
    argv = [str(a) for a in argv]
    if argv and node.python and argv[0] == sys.executable:
        argv[0] = node.python
    return argv


def launcher_for(name: str, where: str | None = None):
    known = known_launchers()
    try:
        return known[name]
    except KeyError:
        raise ConfigError(f"unknown launcher {name!r} (known: {', '.join(sorted(known))})",
                          where) from None


def run(launcher: Launcher, node: Node, argv: Sequence[str], *, timeout: float = 120,
        env: Mapping[str, str] | None = None, cwd=None) -> tuple[int, str, str]:
    """Start, wait (killing it past ``timeout``) and return (exit code, stdout, stderr)."""
    proc = launcher.start(node, argv, env=env, cwd=cwd)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.output()
        raise LaunchError(f"{' '.join(map(str, argv))} on {node.name} did not finish in {timeout}s; "
                          f"stderr: {err[-500:]}") from None
    except BaseException:  # Ctrl-C while waiting: do not leave the command behind
        proc.kill()
        raise
    out, err = proc.output()
    return code, out, err


class LocalProcess:
    """A subprocess in its own process group, with output captured to files (no pipe can fill up)."""

    def __init__(self, node: Node, argv: Sequence[str], env, cwd, logdir: Path, stdin_data: bytes | None = None,
                 keep_stdin: bool = False):
        self.node, self.argv = node, list(map(str, argv))
        fd_out, self._out_path = tempfile.mkstemp(prefix=f"{node.name}-", suffix=".out", dir=logdir)
        fd_err, self._err_path = tempfile.mkstemp(prefix=f"{node.name}-", suffix=".err", dir=logdir)
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["HPCNET_NODE"] = node.name
        full_env.update(reaper.run_env())   # marks the process as this run's: see reaper
        try:
            self.popen = subprocess.Popen(self.argv, stdout=fd_out, stderr=fd_err,
                                          stdin=subprocess.PIPE if stdin_data is not None or keep_stdin
                                          else subprocess.DEVNULL,
                                          env=full_env, cwd=cwd or node.workdir, start_new_session=True)
        except OSError as e:
            raise LaunchError(f"cannot start {self.argv[0]!r} on node {node.name}: {e}") from None
        finally:
            os.close(fd_out)
            os.close(fd_err)
        if stdin_data is not None:     # e.g. secrets for a remote command: never on a command line
            # OSError: it exited already, and poll()/output() say why
            with contextlib.suppress(OSError):
                self.popen.stdin.write(stdin_data)
                self.popen.stdin.flush()
                if not keep_stdin:
                    self.popen.stdin.close()
        # keep_stdin: the pipe stays open while this process (the controller) lives; its end (close_stdin,
        # or the controller's death, however it dies) is what a remote side watches for (see ssh).

    def close_stdin(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self):
        return self.popen.poll()

    def wait(self, timeout=None):
        return self.popen.wait(timeout)

    def kill(self, grace: float = 2.0):
        """Terminate the whole process group: the command and anything it forked."""
        if self.popen.returncode is not None and _pid_exists(self.popen.pid):
            # We reaped the leader earlier, yet its pid is in use: the kernel only hands out a pid that
            # is no longer any group's id, so our group is empty and this group is someone else's.
            return
        self.close_stdin()
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        # Children may outlive the leader; the group id stays the leader's pid.
        _signal_group(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in D state
            pass

    def output(self):
        return (Path(self._out_path).read_text(errors="replace"),
                Path(self._err_path).read_text(errors="replace"))


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_LIVE: "weakref.WeakSet[LocalLauncher]" = weakref.WeakSet()


class ClientProcess:
    """A process on another machine seen through a local client process (``ssh``, ``srun``): pid, poll,
    wait and output are the client's; subclasses say how to kill the remote side."""

    _client: LocalProcess

    @property
    def pid(self) -> int:
        return self._client.pid

    def poll(self):
        return self._client.poll()

    def wait(self, timeout=None):
        return self._client.wait(timeout)

    def output(self):
        return self._client.output()


@register
class LocalLauncher:
    """Nodes are process groups on this host; they share loopback and have their own work dirs."""

    name = "local"

    def __init__(self, logdir: str | os.PathLike | None = None):
        self.logdir = Path(logdir) if logdir else Path(tempfile.mkdtemp(prefix="hpcnet-logs-"))
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.started: list[LocalProcess] = []
        _LIVE.add(self)

    def start(self, node, argv, *, env=None, cwd=None):
        Path(node.workdir).mkdir(parents=True, exist_ok=True)
        proc = LocalProcess(node, argv, env, cwd, self.logdir)
        self.started.append(proc)
        return proc

    def live_pids(self) -> list[int]:
        return [p.pid for p in self.started if p.poll() is None]

    def close(self):
        for proc in self.started:
            proc.kill()


@atexit.register
def _kill_leftovers():  # last line of defence if a caller forgot close() (e.g. a crashed CLI)
    for launcher in list(_LIVE):
        launcher.close()


def wait_all(procs: Sequence[Process], timeout: float) -> list[int]:
    """Wait for several processes with one overall deadline."""
    deadline = time.monotonic() + timeout
    return [p.wait(max(0.0, deadline - time.monotonic())) for p in procs]
