"""Hardware features of a cluster: probing every node, checking feature names users write, and the
skip reasons of tests whose features are missing.

What runs on a node to probe it is ``nodeprobe`` (``describe``, ``features_from``, ``probe`` and the
``FEATURES`` it can find, re-exported here); ``probe_cluster`` starts it on every node through the
cluster's own launcher and reads its JSON. ``python -m pytest_hpcnet.hardware`` still runs the node
probe, for scripts written before the split.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import ConfigError, HpcnetError
from .features import FEATURES, check_feature_names, unknown_feature  # noqa: F401  (re-exported)
from .nodeprobe import describe, features_from, main, probe  # noqa: F401  (re-exported)


# --- probing a cluster ------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeProbe:
    node: str
    features: frozenset[str]  # probed | declared; only declared when the probe failed
    declared: frozenset[str] = frozenset()
    facts: dict = field(default_factory=dict)
    error: str | None = None


# What a configuration's transport needs on every node, beyond a claim's hardware markers.
TRANSPORT_FEATURES = {"verbs": ("rdma", "pyverbs")}


def config_features(*configs: str) -> list[str]:
    """Features the configurations (``"transport=verbs,net=ib,..."``) need on every node: a claim
    whose candidate runs over verbs is n/a where pyverbs cannot run, whatever its markers say."""
    needed: set[str] = set()
    for config in configs:
        for part in config.split(","):
            key, _, value = part.strip().partition("=")
            if key == "transport":
                needed.update(TRANSPORT_FEATURES.get(value, ()))
    return sorted(needed)


def missing(required: Iterable[str], probes: Mapping[str, NodeProbe]) -> dict[str, list[str]]:
    """Feature -> the nodes that lack it, for every required feature some node lacks."""
    out = {}
    for feature in sorted(set(required)):
        lacking = [name for name, p in probes.items() if feature not in p.features]
        if lacking:
            out[feature] = lacking
    return out


def skip_reason(lacking: Mapping[str, list[str]]) -> str:
    """``missing()``'s answer as one line: "requires ib_qdr, missing on node0, node1; requires ..."."""
    return "; ".join(f"requires {f}, missing on {', '.join(nodes)}" for f, nodes in lacking.items())


def probe_cluster(cluster, launcher, timeout: float = 60, python: str = sys.executable
                  ) -> dict[str, NodeProbe]:
    """Run this module on every node through ``launcher`` (all at once, one deadline); never raises
    for a node that cannot be reached or whose probe fails: its entry carries ``error`` instead.
    ``launcher`` is anything with ``start(node, argv)``: a Launcher, or ``cluster.pool.Launchers``."""
    def failed(node, why: str) -> NodeProbe:
        return NodeProbe(node.name, node.features, node.features, {}, f"{node.name}: {why}")

    results: dict[str, NodeProbe] = {}
    running = []
    for node in cluster.nodes:
        argv = [python, "-m", "pytest_hpcnet.nodeprobe", "--root", str(node.sysroot)]
        try:
            running.append((node, launcher.start(node, argv)))
        except (HpcnetError, OSError) as e:
            results[node.name] = failed(node, f"cannot start the hardware probe: {e}")
    deadline = time.monotonic() + timeout
    for node, proc in running:
        try:
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                results[node.name] = failed(node, f"hardware probe did not finish in {timeout}s")
                continue
            out, err = proc.output()
        except (HpcnetError, OSError) as e:
            results[node.name] = failed(node, f"hardware probe failed: {e}")
            continue
        if code != 0:
            tail = err.strip().splitlines()[-1:] or ["no stderr"]
            results[node.name] = failed(node, f"hardware probe exited with status {code}: {tail[0]}")
            continue
        try:
            doc = json.loads(out)
            names, facts = doc["features"], doc["facts"]
            if not isinstance(names, list) or not all(isinstance(f, str) for f in names) \
                    or not isinstance(facts, dict):
                raise TypeError("features must be a list of strings and facts an object")
            probed = frozenset(names)
        except (ValueError, KeyError, TypeError) as e:
            results[node.name] = failed(node, f"hardware probe printed unreadable output ({e}): {out[:200]!r}")
            continue
        results[node.name] = NodeProbe(node.name, probed | node.features, node.features, facts)
    return {node.name: results[node.name] for node in cluster.nodes}


# --- the `hpcnet probe` subcommand --------------------------------------------------------------------

def add_commands(subparsers) -> None:
    p = subparsers.add_parser("probe", help="show each node's hardware features",
                              description="Probe every node of a cluster for hardware features.")
    p.add_argument("--cluster", default="local:1", help="local:N or an inventory TOML (default local:1)")
    p.add_argument("--root", help="read /sys and /proc under this directory on every node (canned tree)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for all probes")
    p.set_defaults(func=_probe_command)


def _probe_command(args) -> int:
    import tempfile

    from tabulate import tabulate

    from .cluster import load_cluster
    from .cluster.pool import Launchers

    if args.root and not Path(args.root).is_dir():
        raise ConfigError(f"{args.root!r} is not a directory", "--root")
    with tempfile.TemporaryDirectory(prefix="hpcnet-probe-") as tmp:
        cluster = load_cluster(args.cluster, root=Path(tmp), where="--cluster")
        if args.root:  # applies to inventories too, whose nodes name their own sysroot
            root = Path(args.root).absolute()
            cluster = replace(cluster, nodes=tuple(replace(n, sysroot=root) for n in cluster.nodes))
        with Launchers(cluster, Path(tmp) / "logs") as launchers:
            probes = probe_cluster(cluster, launchers, timeout=args.timeout)
    if args.json:
        print(json.dumps({name: {"features": sorted(p.features), "declared": sorted(p.declared),
                                 "facts": p.facts, "error": p.error} for name, p in probes.items()},
                         indent=2))
    else:
        rows = [[name, p.facts.get("cpu", {}).get("arch") or "", _cpu_summary(p.facts),
                 " ".join(sorted(p.features)) or "-", p.error or ""] for name, p in probes.items()]
        print(tabulate(rows, headers=["node", "arch", "cpu", "features", "probe error"]))
    return 1 if any(p.error for p in probes.values()) else 0


def _cpu_summary(facts: Mapping[str, Any]) -> str:
    cpu = facts.get("cpu") or {}
    parts = [cpu.get("model") or ""]
    if cpu.get("logical_cpus"):
        parts.append(f"({cpu['logical_cpus']} cpus)")
    if facts.get("memory_bytes"):
        parts.append(f"{facts['memory_bytes'] / 2**30:.0f} GiB")
    return " ".join(p for p in parts if p)


if __name__ == "__main__":
    sys.exit(main())
