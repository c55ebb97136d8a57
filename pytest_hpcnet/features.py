"""Hardware feature names: what the probe can find on a node (``FEATURES``, registered as pytest
markers), and the check of names users write (inventories, ``--hpcnet-assume``, claims). A leaf module:
the node probe, the cluster inventory and the plugin all read it.
"""

from __future__ import annotations

import difflib
from typing import Iterable

from .errors import ConfigError

FEATURES: dict[str, str] = {
    "ib": "an ACTIVE InfiniBand port",
    "ib_sdr": "an ACTIVE InfiniBand port at SDR (2.5 Gb/s lanes)",
    "ib_ddr": "an ACTIVE InfiniBand port at DDR (5 Gb/s lanes)",
    "ib_qdr": "an ACTIVE InfiniBand port at QDR (10 Gb/s lanes, 40 Gb/s 4X)",
    "ib_fdr": "an ACTIVE InfiniBand port at FDR (14 Gb/s lanes, 56 Gb/s 4X)",
    "edr": "an ACTIVE InfiniBand port at EDR (25 Gb/s lanes, 100 Gb/s 4X)",
    "hdr": "an ACTIVE InfiniBand port at HDR (50 Gb/s lanes, 200 Gb/s 4X)",
    "ndr": "an ACTIVE InfiniBand port at NDR (100 Gb/s lanes, 400 Gb/s 4X)",
    "roce": "an ACTIVE RDMA port over Ethernet (RoCE, incl. Soft-RoCE)",
    "rdma": "any ACTIVE RDMA port (InfiniBand or RoCE)",
    "pyverbs": "pyverbs imports and lists an RDMA device (the reference verbs transport can run)",
    "ipoib": "an IP-over-InfiniBand network interface",
    "eth_10g": "a physical 10 Gb/s Ethernet interface with link",
    "eth_25g": "a physical 25 Gb/s Ethernet interface with link",
    "eth_40g": "a physical 40 Gb/s Ethernet interface with link",
    "eth_100g": "a physical 100 Gb/s Ethernet interface with link",
    "x86_64": "x86-64 CPU",
    "aarch64": "64-bit ARM CPU",
    "ppc64le": "64-bit little-endian POWER CPU",
    "power8": "IBM POWER8 CPU",
    "power9": "IBM POWER9 CPU",
    "power10": "IBM POWER10 CPU",
    "lustre": "a Lustre file system is mounted",
    "netns": "can create network namespaces (root and the ip tool; probed on the real root only)",
    "kvm": "/dev/kvm is present (and usable, on the real root)",
}


# --- feature names from users -----------------------------------------------------------------------

def unknown_feature(name: str) -> str | None:
    """Why ``name`` is not a hardware feature, with the nearest one, or None if it is one."""
    if name in FEATURES:
        return None
    # "qdr" means ib_qdr, not the nearer-spelled ndr: a whole word of a name beats spelling.
    close = [f for f in FEATURES if name.lower() in f.split("_")] or \
        difflib.get_close_matches(name.lower(), FEATURES, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown hardware feature {name!r} ({hint}known: {', '.join(FEATURES)})"


def check_feature_names(names: Iterable[str], where: str | None) -> frozenset[str]:
    """Return the names as a set, or raise ConfigError for the first unknown one (with a suggestion)."""
    names = frozenset(names)
    for name in sorted(names):
        if problem := unknown_feature(name):
            raise ConfigError(problem, where)
    return names
