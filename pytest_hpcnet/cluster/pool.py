"""One object to start processes anywhere on a cluster: a launcher per backend, closed together."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import LaunchError
from ..timeouts import scaled
from .launcher import Process, launcher_for
from .nodeprogram import poll_output
from .runsecret import ensure_run_secret
from .model import Cluster, Node


class Launchers:
    """Hands each node's commands to the launcher its inventory names; ``close()`` kills everything."""

    def __init__(self, cluster: Cluster, logdir: Path):
        # The run's credentials: made here once (the controller), inherited through the environment by
        # every process started below, and checked by every service those processes run.
        ensure_run_secret()
        self.cluster = cluster
        self.logdir = Path(logdir)
        self._by_name: dict[str, object] = {}

    def for_node(self, node: Node):
        if node.launcher not in self._by_name:
            cls = launcher_for(node.launcher, f"node {node.name}")
            extra = {"cluster": self.cluster} if getattr(cls, "wants_cluster", False) else {}
            self._by_name[node.launcher] = cls(logdir=self.logdir / node.launcher, **extra)
        return self._by_name[node.launcher]

    def start(self, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd=None) -> Process:
        return self.for_node(node).start(node, argv, env=env, cwd=cwd)

    def run(self, node: Node, argv: Sequence[str], *, timeout: float = 120, env=None, cwd=None):
        from .launcher import run
        return run(self.for_node(node), node, argv, timeout=timeout, env=env, cwd=cwd)

    def close(self) -> None:
        for launcher in self._by_name.values():
            launcher.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_for_line(proc: Process, pattern: str, timeout: float = 30.0) -> re.Match:
    """Wait until the process prints a line matching ``pattern``: for programs that do not announce
    through ``nodeprogram`` (an external tool); this project's node programs are awaited with
    ``nodeprogram.await_ready``. ``timeout`` is scaled like every start-up budget (``timeouts``)."""
    regex = re.compile(pattern, re.MULTILINE)
    return poll_output(proc, regex.search, f"print /{pattern}/", scaled(timeout))


def finish(proc: Process, timeout: float) -> tuple[str, str]:
    """Wait for a process that must succeed; a non-zero exit or a hang is a LaunchError with its stderr."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise LaunchError(f"{' '.join(proc.argv)} on {proc.node.name} did not finish in {timeout}s") from None
    out, err = proc.output()
    if code != 0:
        raise LaunchError(f"{' '.join(proc.argv)} on {proc.node.name} exited with {code}: {err.strip()[-800:]}")
    return out, err
