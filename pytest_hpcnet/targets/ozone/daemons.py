"""One Hadoop or Ozone daemon as a JVM of its own on a cluster node, started through the node's launcher.

    d = Daemon("namenode", node, argv, log=workdir / "namenode.log", ready=(address, port))
    d.start(launchers); d.wait_ready(deadline); ...; d.stop()

A daemon is ready when it still runs and its port answers a TCP connect from the controller (the
address the clients use, so a daemon bound to the wrong interface is not ready). Everything it prints
goes to its own log file; a daemon that exits, or is not ready in time, raises ``DaemonError``: one line
naming the daemon, its node and its log, then the log's last error lines. ``stop()`` kills the JVM and
everything below it (a NodeManager's containers run in sessions of their own).
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import time
from pathlib import Path

from ...errors import HpcnetError
from ..hadoop.jobs import _tail
from ..hadoop.minicluster import kill_tree


class DaemonError(HpcnetError, RuntimeError):
    """A daemon did not start or stopped serving; the first line names it and its log file."""


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        return _tail(Path(path).read_text(errors="replace"), lines)
    except OSError:
        return ""


class Daemon:
    def __init__(self, name: str, node, argv: list[str], *, log: Path, ready: tuple[str, int] | None,
                 env: dict | None = None):
        self.name, self.node, self.argv = name, node, [str(a) for a in argv]
        self.log, self.ready, self.env = Path(log), ready, env or {}
        self.proc = None
        self.started_at = self.ready_s = None

    def __repr__(self) -> str:
        return f"{self.name} on {self.node.name}"

    def start(self, launchers) -> "Daemon":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # the daemon's own log file, whatever the launcher does with a process's output
        wrapped = ["sh", "-c", f'exec "$@" >>{shlex.quote(str(self.log))} 2>&1', self.name, *self.argv]
        self.started_at = time.monotonic()
        self.proc = launchers.start(self.node, wrapped, env=self.env)
        return self

    def failure(self, why: str) -> DaemonError:
        return DaemonError(f"{self.name} on {self.node.name} {why} (log: {self.log})\n{log_tail(self.log)}")

    def check_alive(self) -> None:
        if self.proc is None:
            raise self.failure("was never started")
        code = self.proc.poll()
        if code is not None:
            raise self.failure(f"exited with status {code}")

    def answers(self) -> bool:
        if self.ready is None:
            return True
        try:
            socket.create_connection(self.ready, timeout=1).close()
            return True
        except OSError:
            return False

    def wait_ready(self, deadline: float) -> None:
        while True:
            self.check_alive()
            if self.answers():
                self.ready_s = time.monotonic() - self.started_at
                return
            if time.monotonic() > deadline:
                host, port = self.ready
                raise self.failure(f"does not answer on {host}:{port} after "
                                   f"{time.monotonic() - self.started_at:.0f} s")
            time.sleep(0.5)

    def wait_exit(self, timeout: float) -> None:
        """For a one-shot command (a format, an --init): it must exit 0 in time."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise self.failure(f"did not finish in {timeout:.0f} s") from None
        if code != 0:
            raise self.failure(f"exited with status {code}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        try:
            self.proc.kill()          # the launcher's own kill: its process group, and forget it
        except Exception:
            pass
