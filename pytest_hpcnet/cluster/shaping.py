"""Traffic shaping on a cluster's links: QJump's priority levels on stock Linux. Which SO_PRIORITY value
selects which HTB class, each level's rate, the ``tc`` commands that build the layout on one device,
and the per-class counters that show what each level sent. The netns cluster applies the layout to
every node's link; the QJump workload (``workloads.qjump``) runs its programs at a level.

The original QJump kernel module reads ``skb->priority`` (set with ``SO_PRIORITY``) as the level 0..7 and
rate-limits each level to ``pXrate * bytesq / timeq``. Stock HTB has no such qdisc, but it classifies a
packet straight into the class whose id equals ``skb->priority`` (``major:minor`` as one 32-bit value),
without any filter. This kernel family often ships without tc classifiers (cls_flow, cls_basic), so the
layout relies on that direct match only:

    root qdisc   1:      htb, unclassified packets go to ``default 1`` (= level 0)
    link class   1:100   rate = ceil = link rate (the emulated wire)
    level L      1:<L+1> child of 1:100, rate = ceil = min(pL_rate * bytesq / timeq, link), prio 7-L

so a socket runs at level L by setting ``SO_PRIORITY = priority_value(L) = 0x10000 | (L + 1)`` (values
above 6 need CAP_NET_ADMIN, which root inside the namespace has). HTB dequeues lower ``prio`` first, so
a higher level jumps the queue; ceil = rate makes the level's budget a hard limit (the original drops
over-budget packets; HTB delays them instead, which is the one behavioural difference).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

LEVELS = range(8)
QDISC_HANDLE = "1:"
LINK_CLASS = "1:100"
DEFAULT_LEVEL = 0
QUANTUM = 1514  # one full frame: explicit, so HTB neither warns about nor guesses it from r2q

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)?\s*$", re.I)
_SCALE = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,  # tc's units: SI, bits/s ...
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}  # ... and bytes/s


def check_level(level, where: str = "level") -> int:
    if isinstance(level, bool) or not isinstance(level, int) or level not in LEVELS:
        raise ConfigError(f"QJump level must be a whole number 0..7, got {level!r}", where)
    return level


def class_minor(level: int) -> int:
    return check_level(level) + 1


def class_id(level: int) -> str:
    return f"1:{class_minor(level):x}"


def priority_value(level: int) -> int:
    """The SO_PRIORITY value that makes HTB put a socket's packets in ``level``'s class."""
    return (1 << 16) | class_minor(level)


def parse_rate(text: str, where: str = "rate") -> float:
    """A tc rate ("200mbit", "1gbit", "5000kbps", "100" = bits/s) in bits per second."""
    m = _RATE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{text!r} is not a positive tc rate like 200mbit, 1gbit or 12500kbps", where)
    return float(m.group(1)) * _SCALE[(m.group(2) or "bit").lower()]


@dataclass(frozen=True)
class QJumpParams:
    """The original module's parameters. Defaults are the Naiad experiment's (bytesq=256 timeq=5
    p0rate=100); the module's other levels default to 1x the base rate."""

    bytesq: int = 256          # bytes a level may send per epoch at 1x
    timeq: float = 5.0         # epoch length in microseconds
    rates: tuple[float, ...] = (100, 1, 1, 1, 1, 1, 1, 1)  # pXrate for X = 0..7

    def __post_init__(self):
        if isinstance(self.bytesq, bool) or not isinstance(self.bytesq, int) or self.bytesq <= 0:
            raise ConfigError(f"bytesq must be a positive whole number of bytes, got {self.bytesq!r}", "bytesq")
        if not isinstance(self.timeq, (int, float)) or self.timeq <= 0:
            raise ConfigError(f"timeq must be a positive number of microseconds, got {self.timeq!r}", "timeq")
        if len(self.rates) != len(LEVELS):
            raise ConfigError(f"need one pXrate per level 0..7, got {len(self.rates)}", "pXrate")
        for level, r in enumerate(self.rates):
            if isinstance(r, bool) or not isinstance(r, (int, float)) or r <= 0:
                raise ConfigError(f"must be a positive multiple of the base rate, got {r!r}", f"p{level}rate")

    @property
    def base_rate_bits(self) -> float:
        """bytesq per timeq, in bits per second."""
        return self.bytesq * 8 * 1e6 / self.timeq

    def level_rate_bits(self, level: int, link_bits: float) -> float:
        return min(self.rates[check_level(level)] * self.base_rate_bits, link_bits)


def _bits(value: float) -> str:
    return f"{max(1, round(value))}bit"


def tc_commands(dev: str, params: QJumpParams, link_rate: str = "200mbit") -> list[list[str]]:
    """The tc invocations (argv without the ``tc`` binary or ``-n NS``) that build the layout on ``dev``.

    They ``add``, so ``dev`` must have no root qdisc of its own yet: HTB cannot ``replace`` itself in
    place. ``remove_command`` deletes an earlier one (and fails harmlessly when there is none).
    """
    link = parse_rate(link_rate, "link rate")
    cmds = [["qdisc", "add", "dev", dev, "root", "handle", QDISC_HANDLE, "htb", "default",
             f"{class_minor(DEFAULT_LEVEL):x}"],
            ["class", "add", "dev", dev, "parent", QDISC_HANDLE, "classid", LINK_CLASS, "htb",
             "rate", _bits(link), "ceil", _bits(link), "quantum", str(QUANTUM)]]
    for level in LEVELS:
        rate = _bits(params.level_rate_bits(level, link))
        cmds.append(["class", "add", "dev", dev, "parent", LINK_CLASS, "classid", class_id(level), "htb",
                     "rate", rate, "ceil", rate, "prio", str(7 - level), "quantum", str(QUANTUM)])
    return cmds


def remove_command(dev: str) -> list[str]:
    """Delete ``dev``'s root qdisc (and with it every class), back to the kernel's default."""
    return ["qdisc", "del", "dev", dev, "root"]


_CLASS_LINE = re.compile(r"^class htb (\S+) ")
_SENT = re.compile(r"^\s*Sent (\d+) bytes (\d+) pkt")


def class_counters(tc_show: str) -> dict[str, tuple[int, int]]:
    """Parse ``tc -s class show dev DEV``: class id -> (bytes sent, packets sent)."""
    out: dict[str, tuple[int, int]] = {}
    current = None
    for line in tc_show.splitlines():
        if m := _CLASS_LINE.match(line):
            current = m.group(1)
        elif current and (m := _SENT.match(line)):
            out[current] = (int(m.group(1)), int(m.group(2)))
            current = None
    return out


def level_bytes(launchers, nodes, level: int = DEFAULT_LEVEL) -> int | None:
    """Bytes sent so far in ``level``'s class, summed over the nodes' egress devices; None where the
    nodes are not netns hosts with this layout (nothing to count: an inventory's own namespace, or
    another launcher). ``launchers`` is anything with ``run(node, argv, timeout=)``."""
    if any(n.launcher != "netns" for n in nodes):
        return None
    total = 0
    for node in nodes:
        dev = node.extra["netns"].get("device", "eth0")
        code, out, err = launchers.run(node, ["tc", "-s", "class", "show", "dev", dev], timeout=30)
        counters = class_counters(out) if code == 0 else {}
        if class_id(level) not in counters:
            return None
        total += counters[class_id(level)][0]
    return total
