"""``netns:N`` embedded clusters: one network namespace per node, joined by veth pairs to a bridge.

    hpcnet-<pid>-<seq>-sw      "switch" namespace: bridge br0 with ports p0 .. pN-1
    hpcnet-<pid>-<seq>-n<i>    node i: eth0 = 10.199.0.<i+1>/24 (the peer of p<i>), lo
                               eth0 egress: the QJump HTB layout (qjump.levels) at the link rate

Nothing is created in the root namespace (the veth pairs are made inside the switch namespace with
their peer placed straight into the node's), so the host's interfaces and routes are never touched,
and 10.199.0.0/24 exists only inside the cluster: traffic stays between the project's own namespaces.
Names carry this process's pid and a counter, so parallel runs and several clusters per run do not
collide; a later run deletes namespaces whose pid is dead (a run killed with SIGKILL).

Deleting a namespace destroys its interfaces, the veth peers and the qdiscs on them, so teardown is
``ip netns delete`` of every namespace. It is idempotent and runs from the ``NetnsLauncher``'s
``close()``, from ``teardown()`` (the suites' fixtures), and at interpreter exit.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError, LaunchError
from ..qjump.levels import QJumpParams, parse_rate, tc_commands
from .launcher import LocalLauncher, LocalProcess, register
from .model import Cluster, Node

PREFIX = "hpcnet"
SUBNET = "10.199.0"   # /24, inside the cluster's namespaces only
DEVICE = "eth0"
BRIDGE = "br0"
DEFAULT_LINK_RATE = "200mbit"  # the design's 2-core measurement (section 8)
NEEDS_ROOT = "netns clusters need root (euid 0) and iproute2's ip"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-\d+-(sw|n\d+)$")
_seq = itertools.count()
_LIVE: dict[str, "NetnsNetwork"] = {}


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"{what}: {' '.join(argv)}: {e}") from None
    if done.returncode != 0:
        raise LaunchError(f"{what}: {' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """Names from ``ip netns list`` (its lines look like ``name (id: 3)``)."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"], "list namespaces").splitlines() if line]


def _delete_namespace(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


def remove_stale() -> list[str]:
    """Delete namespaces of earlier runs whose process is gone; return their names."""
    removed = []
    for name in namespaces():
        m = _NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            _delete_namespace(name)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NetnsNetwork:
    """The namespaces, veths, bridge and qdiscs of one cluster; ``build()`` then ``teardown()``."""

    def __init__(self, n: int, link_rate: str = DEFAULT_LINK_RATE, qjump: QJumpParams | None = None):
        if not 1 <= n <= 64:
            raise ConfigError(f"netns cluster needs 1..64 nodes, got {n}")
        parse_rate(link_rate, "netns link rate")  # fail before creating anything
        self.n, self.link_rate, self.qjump = n, link_rate, qjump or QJumpParams()
        self.tag = f"{PREFIX}-{os.getpid()}-{next(_seq)}"
        self.switch = f"{self.tag}-sw"
        self.nodes = [f"{self.tag}-n{i}" for i in range(n)]
        self.created: list[str] = []

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def build(self) -> "NetnsNetwork":
        if not available():
            raise ConfigError(NEEDS_ROOT)
        _LIVE[self.tag] = self
        try:
            remove_stale()
            self._add_namespace(self.switch)
            ip_sw = ["ip", "-n", self.switch]
            _run(ip_sw + ["link", "add", BRIDGE, "type", "bridge"], "create bridge")
            _run(ip_sw + ["link", "set", BRIDGE, "up"], "bring up bridge")
            for i, ns in enumerate(self.nodes):
                self._add_namespace(ns)
                port = f"p{i}"
                _run(ip_sw + ["link", "add", port, "type", "veth", "peer", "name", DEVICE, "netns", ns],
                     f"create veth for node {i}")
                _run(ip_sw + ["link", "set", port, "master", BRIDGE, "up"], f"attach p{i} to the bridge")
                ip = ["ip", "-n", ns]
                _run(ip + ["addr", "add", f"{self.address(i)}/24", "dev", DEVICE], f"address node {i}")
                _run(ip + ["link", "set", DEVICE, "up"], f"bring up node {i}")
                _run(ip + ["link", "set", "lo", "up"], f"bring up node {i} loopback")
                for cmd in tc_commands(DEVICE, self.qjump, self.link_rate):
                    _run(["tc", "-n", ns] + cmd, f"QJump qdisc on node {i}")
        except BaseException:
            self.teardown()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        self.created.append(name)  # before creating: a half-made namespace is still deleted
        _run(["ip", "netns", "add", name], f"create namespace {name}")

    def teardown(self) -> None:
        """Delete every namespace this network made; safe to call twice or after a failed build."""
        for name in reversed(self.created):
            _delete_namespace(name)
        self.created.clear()
        _LIVE.pop(self.tag, None)


def netns_cluster(n: int, root: Path, *, link_rate: str = DEFAULT_LINK_RATE,
                  qjump: QJumpParams | None = None, features=frozenset()) -> Cluster:
    """Build the namespaces and return a Cluster whose nodes run commands inside them.

    Tear it down with ``teardown(cluster)`` (or use ``temporary_netns_cluster``); the netns launcher's
    ``close()`` and interpreter exit do it too."""
    net = NetnsNetwork(n, link_rate, qjump).build()
    try:
        root = Path(root)
        shared = root / "shared"
        shared.mkdir(parents=True, exist_ok=True)
        nodes = []
        for i, ns in enumerate(net.nodes):
            workdir = root / f"node{i}"
            workdir.mkdir(parents=True, exist_ok=True)
            nodes.append(Node(name=f"node{i}", host=net.address(i), addresses={"eth": net.address(i)},
                              workdir=workdir, shared=shared, features=frozenset(features), launcher="netns",
                              extra={"netns": {"namespace": ns, "network": net.tag, "device": DEVICE}}))
    except BaseException:
        net.teardown()
        raise
    return Cluster(name=f"netns:{n}", nodes=tuple(nodes), source=f"netns:{n}", shared=shared)


def teardown(cluster: Cluster) -> None:
    for node in cluster.nodes:
        _teardown_node(node)


def _teardown_node(node: Node) -> None:
    tag = node.extra.get("netns", {}).get("network")
    if tag in _LIVE:
        _LIVE[tag].teardown()


@contextmanager
def temporary_netns_cluster(n: int, root: Path, **kwargs):
    """``with temporary_netns_cluster(4, tmp) as cluster:`` - torn down on any exit, Ctrl-C included."""
    cluster = netns_cluster(n, root, **kwargs)
    try:
        yield cluster
    finally:
        teardown(cluster)


@atexit.register
def _teardown_all() -> None:
    for net in list(_LIVE.values()):
        net.teardown()


@register
class NetnsLauncher(LocalLauncher):
    """Runs commands with ``ip netns exec <namespace>`` in their own process group (a LocalProcess).

    ``close()`` kills what it started, then tears down the networks of the nodes it ran on. A node from
    an inventory may name an existing namespace with ``[nodes.netns] namespace = "..."``; such a
    namespace is not ours and is left alone."""

    name = "netns"
    settings = {"namespace": str}

    def __init__(self, logdir=None):
        super().__init__(logdir)
        self._nodes: list[Node] = []

    def start(self, node, argv, *, env=None, cwd=None):
        namespace = node.extra.get("netns", {}).get("namespace")
        if not namespace:
            raise LaunchError(f"node {node.name} uses the netns launcher but names no namespace")
        if not available():
            raise LaunchError(f"node {node.name}: {NEEDS_ROOT}")
        Path(node.workdir).mkdir(parents=True, exist_ok=True)
        proc = LocalProcess(node, ["ip", "netns", "exec", namespace, *map(str, argv)], env, cwd, self.logdir)
        self.started.append(proc)
        self._nodes.append(node)
        return proc

    def close(self):
        try:
            super().close()
        finally:
            for node in self._nodes:
                _teardown_node(node)
