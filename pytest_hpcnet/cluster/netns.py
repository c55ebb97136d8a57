"""``netns:N`` embedded clusters: one network namespace per node, joined by veth pairs to a bridge.

    hpcnet-<pid>-<seq>-sw      "switch" namespace: bridge br0 with ports p0 .. pN-1 and c0
    hpcnet-<pid>-<seq>-n<i>    node i: eth0 = 10.199.<X>.<i+1>/24 (the peer of p<i>), lo
                               eth0 egress: the QJump HTB layout (shaping) at the link rate
    hn<pid>c<seq> (root ns)    the controller's port: 10.199.<X>.254/24, the peer of c0

Each node is a host of its own: its own namespace, address and work dir, no loopback shared with the
others. The controller (the process that builds the cluster: pytest, the CLI) stays in the root
namespace and reaches the nodes through one veth whose far end is a bridge port, so servers the
controller runs (the MapReduce driver) listen on ``controller_address`` and the nodes connect to it.
That veth is the only thing made in the root namespace; it has no route but its own /24, and it dies
with the switch namespace (a veth pair is deleted together). ``X`` (1..250) is picked under a lock so
that no two live clusters on this host share a subnet in the root namespace.

Names carry this process's pid and a counter, so parallel runs and several clusters per run do not
collide; a later run deletes namespaces whose pid is dead (a run killed with SIGKILL), and a reaper
process (``_reaper``) does it as soon as the building process dies, however it died.

Deleting a namespace destroys its interfaces, the veth peers and the qdiscs on them, so teardown is
``ip netns delete`` of every namespace (after killing what still runs inside). It is idempotent and
runs from the ``NetnsLauncher``'s ``close()``, from ``teardown()`` (the suites' fixtures), at
interpreter exit, and from the reaper.
"""

from __future__ import annotations

import atexit
import fcntl
import itertools
import os
import re
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError, LaunchError
from . import reaper
from .launcher import LocalLauncher, LocalProcess, register
from .model import Cluster, Node
from .shaping import QJumpParams, parse_rate, tc_commands

PREFIX = "hpcnet"
SUBNET = "10.199"     # 10.199.<X>.0/24 per cluster; X is free among this host's root-namespace addresses
CONTROLLER_HOST = 254  # the controller's address in its cluster's /24
DEVICE = "eth0"
BRIDGE = "br0"
DEFAULT_LINK_RATE = "200mbit"  # the design's 2-core measurement (section 8)
NEEDS_ROOT = "netns clusters need root (euid 0) and iproute2's ip"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-\d+-(sw|n\d+)$")
_LOCK = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
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
    reaper._delete_namespace(name)   # kills what still runs inside, then deletes


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
        seq = next(_seq)
        self.tag = f"{PREFIX}-{os.getpid()}-{seq}"
        self.switch = f"{self.tag}-sw"
        self.nodes = [f"{self.tag}-n{i}" for i in range(n)]
        self.controller_link = f"hn{os.getpid()}c{seq}"[:15]   # the root namespace's end (IFNAMSIZ)
        self.subnet: int | None = None
        self.created: list[str] = []
        self.root_links: list[str] = []

    def address(self, i: int) -> str:
        return f"{SUBNET}.{self.subnet}.{i + 1}"

    @property
    def controller_address(self) -> str:
        return f"{SUBNET}.{self.subnet}.{CONTROLLER_HOST}"

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
            with _subnet_lock():
                self.subnet = _free_subnet()
                self.root_links.append(self.controller_link)
                reaper.watch_link(self.controller_link)
                # the controller's port: c0 on the bridge, its peer in this (the root) namespace
                _run(ip_sw + ["link", "add", "c0", "type", "veth", "peer", "name", self.controller_link,
                              "netns", str(os.getpid())], "create the controller's veth")
                _run(["ip", "addr", "add", f"{self.controller_address}/24", "dev", self.controller_link],
                     "address the controller's veth")
            _run(ip_sw + ["link", "set", "c0", "master", BRIDGE, "up"], "attach c0 to the bridge")
            _run(["ip", "link", "set", self.controller_link, "up"], "bring up the controller's veth")
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
        reaper.watch_namespace(name)   # deleted by the reaper if this process dies before teardown
        _run(["ip", "netns", "add", name], f"create namespace {name}")

    def teardown(self) -> None:
        """Delete every namespace this network made (the controller's veth goes with the switch's);
        safe to call twice or after a failed build."""
        for link in self.root_links:      # at once: a deleted namespace's veths vanish only later
            reaper.delete_link(link)
            reaper.forget_namespace(link)
        self.root_links.clear()
        for name in reversed(self.created):
            _delete_namespace(name)
            reaper.forget_namespace(name)
        self.created.clear()
        _LIVE.pop(self.tag, None)


@contextmanager
def _subnet_lock():
    """Serialise subnet choice between processes on this host (parallel runs, xdist workers)."""
    with open(_LOCK / "hpcnet-netns.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_subnet() -> int:
    """An X in 1..250 such that no root-namespace address is in 10.199.X.0/24."""
    used = set(re.findall(rf"inet {re.escape(SUBNET)}\.(\d+)\.", _run(["ip", "-o", "-4", "addr", "show"],
                                                                      "list addresses")))
    for x in range(1, 251):
        if str(x) not in used:
            return x
    raise LaunchError(f"no free {SUBNET}.X.0/24 subnet left for a netns cluster (all 250 in use)")


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
    return Cluster(name=f"netns:{n}", nodes=tuple(nodes), source=f"netns:{n}", shared=shared,
                   controller={"eth": net.controller_address},
                   controller_source=f"derived: the bridge's port {net.controller_link} in the root namespace")


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
