"""Clusters: the inventory model, embedded clusters and the launchers that start processes on nodes.

``load_cluster(spec)`` turns what the user wrote after ``--hpcnet-cluster`` into a ``Cluster``:
``local:N`` (N nodes on this host), ``netns:N`` (namespaces, see ``netns``), ``slurm`` (inside an
allocation: its nodes, see ``slurm``), or a TOML inventory path. ``open(spec, root)`` is the same as a
context: the cluster and launchers on it, everything they started killed (and embedded namespaces
torn down) at the end.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError
from .launcher import LAUNCHERS, Launcher, Process, known_launchers, launcher_for, register, run  # noqa: F401
from .model import Cluster, Node
from . import ssh  # noqa: F401  (registers the "ssh" launcher)
from . import netns  # noqa: F401  (registers the "netns" launcher)
from . import slurm  # noqa: F401  (registers the "slurm" launcher)

_EMBEDDED = re.compile(r"^(local|netns):(\d+)$")


def local_cluster(n: int, root: Path, sysroot: Path = Path("/"), features=frozenset()) -> Cluster:
    """N nodes on loopback, each with its own work dir under ``root``, plus a shared dir."""
    root = Path(root)
    shared = root / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    nodes = tuple(
        Node(name=f"node{i}", host="localhost", addresses={"eth": "127.0.0.1"},
             workdir=root / f"node{i}", shared=shared, features=frozenset(features),
             launcher="local", sysroot=Path(sysroot))
        for i in range(n))
    for node in nodes:
        node.workdir.mkdir(parents=True, exist_ok=True)
    return Cluster(name=f"local:{n}", nodes=nodes, source=f"local:{n}", shared=shared,
                   controller={"eth": "127.0.0.1"}, controller_source="local: loopback (every node is this host)")


def load_cluster(spec: str, root: Path, where: str | None = None, sysroot: Path | None = None) -> Cluster:
    """Parse a ``--hpcnet-cluster`` value. ``root`` holds embedded clusters' directories."""
    m = _EMBEDDED.match(spec.strip())
    if m:
        kind, n = m.group(1), int(m.group(2))
        if not 1 <= n <= 64:
            raise ConfigError(f"{spec!r}: node count must be 1..64", where)
        if kind == "netns":
            if not netns.available():
                raise ConfigError(f"{spec!r}: {netns.NEEDS_ROOT}", where)
            return netns.netns_cluster(n, root)
        return local_cluster(n, root, sysroot=sysroot or Path("/"))
    if spec.strip() == "slurm":    # inside salloc/sbatch: the allocation's nodes
        return slurm.cluster_from_allocation(root, where)
    if spec.startswith(("local:", "netns:")):
        raise ConfigError(f"{spec!r}: expected local:N or netns:N with N a whole number", where)
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"{spec!r} is neither local:N, netns:N, slurm nor an existing inventory file", where)
    from .inventory import load_inventory
    return load_inventory(path)


@contextmanager
def open(spec: str | Cluster, root: Path, *, where: str | None = None):  # noqa: A001 (cluster.open)
    """``with cluster.open("local:4", root) as (c, launchers):`` -- ``spec`` as ``--hpcnet-cluster`` takes
    it (or a ``Cluster`` already built); node dirs under ``root``, the launchers' logs in ``root/logs``.
    At the end every process the launchers started is killed and a netns cluster's namespaces go."""
    from .pool import Launchers
    built = spec if isinstance(spec, Cluster) else load_cluster(spec, Path(root), where)
    launchers = Launchers(built, Path(root) / "logs")
    try:
        yield built, launchers
    finally:
        try:
            launchers.close()
        finally:
            if any(node.launcher == "netns" for node in built.nodes):
                netns.teardown(built)
