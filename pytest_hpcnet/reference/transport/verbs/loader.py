"""Whether the verbs transport can run here: loading pyverbs (either enum API) and finding this
machine's RDMA address (rdma_cm cannot use loopback)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from types import SimpleNamespace

from ..base import TransportError


class VerbsUnavailable(TransportError):
    """pyverbs is missing or there is no usable RDMA device."""


def load_pyverbs() -> SimpleNamespace:
    """pyverbs' modules, with the enum module of either API (``libibverbs_enums`` from rdma-core 59,
    ``enums`` before). Raises VerbsUnavailable saying what to install."""
    try:
        from pyverbs import cmid, cq, device, mr, pd, qp, wr
        from pyverbs.pyverbs_error import PyverbsError
    except ImportError as e:
        raise VerbsUnavailable(
            f"the verbs transport needs pyverbs, which does not import here ({e}); install the "
            "distribution's rdma-core Python package (Debian/Ubuntu: apt install python3-pyverbs)") from None
    try:
        import pyverbs.libibverbs_enums as enums
    except ImportError:
        import pyverbs.enums as enums
    try:
        import pyverbs.librdmacm_enums as cm_enums
    except ImportError:
        import pyverbs.cm_enums as cm_enums
    return SimpleNamespace(cmid=cmid, cq=cq, device=device, mr=mr, pd=pd, qp=qp, wr=wr, e=enums,
                           ce=cm_enums, Error=PyverbsError)


def unavailable_reason() -> str | None:
    """Why the verbs transport cannot run in this process (pyverbs missing, no ACTIVE RDMA port with an
    address), or None when it can. Cached: the answer does not change while the process runs."""
    global _unavailable
    if _unavailable is None:
        try:
            load_pyverbs()
            rdma_host("127.0.0.1")
            _unavailable = ""
        except VerbsUnavailable as e:
            _unavailable = str(e)
    return _unavailable or None


_unavailable: str | None = None


def looks_usable() -> bool:
    """A cheap check (no pyverbs import): pyverbs is installed and an ACTIVE RDMA port has an address."""
    import importlib.util
    try:
        found = importlib.util.find_spec("pyverbs") is not None
    except (ImportError, ValueError):
        found = False
    return found and bool(os.environ.get("HPCNET_VERBS_HOST") or gid_ipv4_addresses())


# -- addresses ---------------------------------------------------------------------------------------

def gid_ipv4_addresses(sysfs: Path = Path("/sys/class/infiniband")) -> list[str]:
    """IPv4 addresses in the GID tables of ACTIVE RDMA ports (RoCE v2 GIDs are ::ffff:a.b.c.d)."""
    found = []
    for port in sorted(sysfs.glob("*/ports/*")):
        try:
            if "ACTIVE" not in (port / "state").read_text():
                continue
        except OSError:
            continue
        for index in range(16):   # the table has hundreds of (mostly empty) entries; IPs come first
            try:
                raw = (port / "gids" / str(index)).read_text().strip().replace(":", "")
            except OSError:
                break
            if len(raw) == 32 and raw[:24] == "00000000000000000000ffff":
                addr = str(ipaddress.IPv4Address(bytes.fromhex(raw[24:])))
                if addr not in found:
                    found.append(addr)
    return found


def rdma_host(host: str, sysfs: Path = Path("/sys/class/infiniband")) -> str:
    """The address rdma_cm should use for ``host``: itself, unless it is loopback or the wildcard."""
    try:
        special = host == "localhost" or ipaddress.ip_address(host).is_loopback or \
            ipaddress.ip_address(host).is_unspecified
    except ValueError:
        special = False
    if not special:
        return host
    override = os.environ.get("HPCNET_VERBS_HOST")
    if override:
        return override
    addresses = gid_ipv4_addresses(sysfs)
    if not addresses:
        raise VerbsUnavailable(f"no ACTIVE RDMA port with an IPv4 address to use for {host} (rdma_cm "
                               "cannot use loopback); set HPCNET_VERBS_HOST or bind an RDMA device to a netdev")
    return addresses[0]
