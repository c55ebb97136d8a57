"""What a cluster is: nodes with addresses per network, directories and declared features."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Node:
    name: str
    host: str
    # network name -> address, e.g. {"eth": "10.0.0.1", "ib": "192.168.1.1"}; "eth" is the default network.
    addresses: dict[str, str]
    workdir: Path
    shared: Path | None = None
    features: frozenset[str] = frozenset()  # declared by hand in the inventory / --hpcnet-assume
    launcher: str = "local"
    # Root the hardware probe reads /sys and /proc under; "/" on real nodes, a canned tree in tests.
    sysroot: Path = Path("/")
    extra: dict = field(default_factory=dict)  # launcher-specific settings (ssh user, port, ...)
    # The interpreter remote launchers (ssh, slurm) start instead of the controller's sys.executable;
    # None: the same path (a shared install). Inventory key ``python``.
    python: str | None = None

    def address(self, network: str = "eth") -> str:
        try:
            return self.addresses[network]
        except KeyError:
            raise KeyError(f"node {self.name!r} has no address on network {network!r} "
                           f"(has: {', '.join(sorted(self.addresses)) or 'none'})") from None


@dataclass(frozen=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    source: str  # what the user gave: "local:4", a TOML path, ...
    shared: Path | None = None
    # The controller's (this process's) address per network, which nodes connect back to (the engine
    # driver listens there), and where it came from: the inventory, or how it was derived.
    controller: dict[str, str] = field(default_factory=dict)
    controller_source: str = ""
    # Claims files of this cluster's own (e.g. [[override]]s of shipped bounds, as ReFrame keeps
    # per-system references), loaded after the suites' files.
    claims: tuple[Path, ...] = ()

    def controller_address(self, network: str = "eth") -> str:
        """The address the nodes reach the controller at on ``network``."""
        try:
            return self.controller[network]
        except KeyError:
            raise KeyError(f"cluster {self.name!r} has no controller address on network {network!r} "
                           f"(has: {', '.join(sorted(self.controller)) or 'none'}; set [cluster] controller "
                           f"= {{ {network} = \"...\" }} in the inventory)") from None

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"cluster {self.name!r} has no node {name!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)


def cross_host_reason(transport: str, nodes) -> str | None:
    """Why ``transport`` cannot connect these nodes (shm between hosts), naming them; None if it can."""
    if transport != "shm":
        return None
    hosts: dict[str, list[str]] = {}
    for n in nodes:
        hosts.setdefault(n.host, []).append(n.name)
    if len(hosts) < 2:
        return None
    spread = "; ".join(f"{', '.join(names)} on {host}" for host, names in hosts.items())
    return f"transport=shm works between processes on one host, and the nodes are on {len(hosts)} hosts: {spread}"
