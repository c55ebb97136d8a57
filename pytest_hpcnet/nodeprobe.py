"""The node side of the hardware probe: what runs on a node to find what it has (fabric, speed class,
CPU, file systems), as a set of feature names. The controller side (probing a cluster, checking feature
names, skip reasons) is ``hardware``.

``describe(root)`` reads the facts from ``/sys`` and ``/proc`` under ``root`` ("/" on a real node, a
canned tree in tests); ``features_from(facts)`` turns them into names from ``FEATURES``, which the plugin
registers as markers. ``python -m pytest_hpcnet.nodeprobe --root DIR`` prints both as JSON: that is how
``hardware.probe_cluster`` probes every node through the cluster's own launcher. This module imports
only the standard library and ``errors``, so the probe starts fast on a node.

Rules worth knowing (each one is a choice; tests pin them):
- Only ACTIVE RDMA ports count, for ``ib``, the speed classes, ``roce`` and ``rdma`` alike: a marker
  gates a test that needs a working fabric, and a DOWN or INIT port cannot carry traffic. ``describe``
  still lists down ports so the probe table shows why a feature is missing.
- IB speed classes come from the rate string's lane-speed word ("(4X QDR)"), on InfiniBand ports only.
  A RoCE port reports its rate in the same words, but it is Ethernet: it gives ``roce``, and the
  Ethernet class comes from its netdev's speed. FDR10 is not FDR (10 Gb/s lanes, not 14) and gets no class.
- Ethernet classes are exact (a 100 GbE port is not ``eth_10g``): a claim "vs 10GigE" needs a 10 GbE
  baseline. Only physical netdevs (with a ``device`` link) of type 1 count; veth reports 10000 Mb/s.
- The architecture of a canned tree is read from its cpuinfo; POWER is taken to be ppc64le (cpuinfo does
  not say the byte order; big-endian POWER distributions are gone). On "/" ``platform.machine()`` decides.
- ``netns`` and ``pyverbs`` are only probed on "/" (they are about this process's privileges and Python
  environment, which a canned tree cannot describe). ``netns`` = euid 0 and an ``ip`` binary; the probe
  never creates a namespace. ``pyverbs`` = pyverbs imports and lists a device; pyverbs raises (rather
  than returning []) when there is no RDMA subsystem, which counts as "no devices".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .features import FEATURES

# Lane-speed word in an IB rate string -> feature. Absent words (FDR10, XDR, ...) give no class.
_IB_CLASSES = {"SDR": "ib_sdr", "DDR": "ib_ddr", "QDR": "ib_qdr", "FDR": "ib_fdr",
               "EDR": "edr", "HDR": "hdr", "NDR": "ndr"}
_ETH_CLASSES = {10_000: "eth_10g", 25_000: "eth_25g", 40_000: "eth_40g", 100_000: "eth_100g"}
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec\s*\((\d+)X\s*([A-Z0-9]+)\)")
_ARPHRD = {1: "ethernet", 32: "ipoib", 772: "loopback"}  # /sys/class/net/<if>/type (linux/if_arp.h)
_MACHINES = {"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "x86_64": "x86_64",
             "aarch64": "aarch64"}


# --- reading the tree -------------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    """A sysfs/proc file's text, or None when absent or unreadable (sysfs returns EINVAL for a down link)."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _children(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _rdma_ports(root: Path) -> list[dict[str, Any]]:
    ports = []
    for dev in _children(root / "sys/class/infiniband"):
        for port in _children(dev / "ports"):
            rate = _read(port / "rate")
            state = _read(port / "state") or ""
            m = _RATE.match(rate or "")
            ports.append({
                "device": dev.name, "port": port.name, "rate": rate,
                "gbps": float(m.group(1)) if m else None,
                "lanes": int(m.group(2)) if m else None,
                "lane_speed": m.group(3) if m else None,
                "link_layer": _read(port / "link_layer"),
                "state": state.split(":", 1)[-1].strip().upper() or None,  # "4: ACTIVE" -> "ACTIVE"
            })
    return ports


def _netdevs(root: Path) -> list[dict[str, Any]]:
    out = []
    for dev in _children(root / "sys/class/net"):
        kind = _ARPHRD.get(_int(_read(dev / "type")), "other")
        speed = _int(_read(dev / "speed"))
        out.append({"name": dev.name, "kind": kind,
                    "speed_mbps": speed if speed and speed > 0 else None,  # -1 = unknown / no link
                    "physical": (dev / "device").exists(),
                    "operstate": _read(dev / "operstate")})
    return out


def _cpuinfo(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Split /proc/cpuinfo into per-processor records and the machine-wide lines (POWER's last block)."""
    cpus, machine = [], {}
    for block in re.split(r"\n\s*\n", text):
        record = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                record[key.strip()] = value.strip()
        if "processor" in record:
            cpus.append(record)
        else:
            machine.update(record)
    return cpus, machine


def _cpu_facts(text: str | None) -> dict[str, Any]:
    cpus, machine = _cpuinfo(text or "")
    first = cpus[0] if cpus else {}
    arch = None
    if (first.get("cpu", "").upper().startswith("POWER")
            or machine.get("platform") in ("PowerNV", "pSeries")):
        arch, model = "ppc64le", first.get("cpu")
    elif "CPU architecture" in first:  # ARM: "8" (or "AArch64" on old kernels) is 64-bit
        arch = "aarch64" if first["CPU architecture"] in ("8", "AArch64") else None
        model = " ".join(f"{k} {first[k]}" for k in ("CPU implementer", "CPU part") if k in first) or None
    else:
        if "lm" in first.get("flags", "").split():  # "long mode": a 64-bit x86 CPU
            arch = "x86_64"
        model = first.get("model name")
    cores = {(c.get("physical id"), c.get("core id")) for c in cpus if "core id" in c}
    sockets = {c["physical id"] for c in cpus if "physical id" in c}
    power = re.match(r"POWER(\d+)", first.get("cpu", ""), re.I)
    return {"arch": arch, "model": re.sub(r"\s+", " ", model) if model else None,
            "power_generation": int(power.group(1)) if power else None,
            "logical_cpus": len(cpus), "cores": len(cores) or None, "sockets": len(sockets) or None,
            "machine": machine.get("machine") or machine.get("model")}


def _memory_bytes(text: str | None) -> int | None:
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", text or "", re.M)
    return int(m.group(1)) * 1024 if m else None


def _lustre_mounts(text: str | None) -> list[dict[str, str]]:
    mounts = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "lustre":
            # /proc/mounts escapes space, tab, newline and backslash as \ooo.
            unescape = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)  # noqa: E731
            mounts.append({"source": unescape(fields[0]), "mountpoint": unescape(fields[1])})
    return mounts


def _verbs_devices() -> tuple[list[str] | None, str | None]:
    """(device names, why none) from pyverbs; (None, reason) when pyverbs is missing or fails."""
    try:
        import pyverbs.device as verbs_device
    except ImportError as e:
        return None, f"pyverbs not importable: {e}"
    try:
        devices = verbs_device.get_device_list()
    except Exception as e:  # pyverbs raises PyverbsRDMAError when the kernel has no RDMA subsystem
        return [], f"{type(e).__name__}: {e}"
    return [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in devices], None


def describe(root: Path = Path("/")) -> dict[str, Any]:
    """The facts behind the features, as plain JSON-able data."""
    root = Path(root)
    real = root.resolve() == Path("/")
    cpu = _cpu_facts(_read(root / "proc/cpuinfo"))
    if real:
        cpu["arch"] = _MACHINES.get(platform.machine().lower(), platform.machine())
    kvm = root / "dev/kvm"
    facts: dict[str, Any] = {
        "root": str(root), "cpu": cpu, "memory_bytes": _memory_bytes(_read(root / "proc/meminfo")),
        "rdma_ports": _rdma_ports(root), "netdevs": _netdevs(root),
        "lustre_mounts": _lustre_mounts(_read(root / "proc/mounts")),
        "kvm": kvm.exists() and (not real or os.access(kvm, os.R_OK | os.W_OK)),
        "netns": None, "verbs_devices": None, "verbs_error": "not probed (canned tree)",
    }
    if real:
        facts["netns"] = os.geteuid() == 0 and shutil.which("ip") is not None
        facts["verbs_devices"], facts["verbs_error"] = _verbs_devices()
    return facts


def features_from(facts: Mapping[str, Any]) -> frozenset[str]:
    found = set()
    for port in facts["rdma_ports"]:
        if port["state"] != "ACTIVE":
            continue
        found.add("rdma")
        if port["link_layer"] == "InfiniBand":
            found.add("ib")
            if port["lane_speed"] in _IB_CLASSES:
                found.add(_IB_CLASSES[port["lane_speed"]])
        elif port["link_layer"] == "Ethernet":
            found.add("roce")
    for dev in facts["netdevs"]:
        if dev["kind"] == "ipoib" and dev["operstate"] != "down":
            found.add("ipoib")
        elif dev["kind"] == "ethernet" and dev["physical"] and dev["speed_mbps"] in _ETH_CLASSES:
            found.add(_ETH_CLASSES[dev["speed_mbps"]])
    cpu = facts["cpu"]
    if cpu["arch"] in FEATURES:
        found.add(cpu["arch"])
    if cpu["power_generation"] and f"power{cpu['power_generation']}" in FEATURES:
        found.add(f"power{cpu['power_generation']}")
    if facts["lustre_mounts"]:
        found.add("lustre")
    for name in ("kvm", "netns"):
        if facts[name]:
            found.add(name)
    if facts["verbs_devices"]:
        found.add("pyverbs")
    return frozenset(found)


def probe(root: Path = Path("/")) -> frozenset[str]:
    """Feature names this machine (or canned tree under ``root``) has."""
    return features_from(describe(root))


def main(argv: list[str] | None = None) -> int:
    from .cluster.nodeprogram import node_main
    parser = argparse.ArgumentParser(prog="python -m pytest_hpcnet.nodeprobe",
                                     description="Print this node's hardware features and facts as JSON.")
    parser.add_argument("--root", default="/", help="read /sys and /proc under this directory")
    return node_main(parser, _run, argv, label="hardware probe", watchdog=False)   # done in milliseconds


def _run(args) -> int:
    root = Path(args.root)
    if not root.is_dir():
        raise ConfigError(f"{args.root!r} is not a directory", "--root")
    facts = describe(root)
    print(json.dumps({"features": sorted(features_from(facts)), "facts": facts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
