"""What the fabric alone allows for a claim, and whose a FAIL is.

A claim with ``fabric = "latency"`` or ``"bandwidth"`` compares an RDMA stack (candidate) with an IP
one (baseline). The fabric's native tools give the same comparison without any stack: ``rdma`` and
``ip`` figures of that quantity (``fabric.latency`` in us, ``fabric.bandwidth`` in MB/s). From them
``fabric_quantity`` computes the claim's own quantity (a ratio or a reduction of its metric) as the
fabric gives it: the ceiling. Then, for the verdict:

- the ceiling misses the claim's bound: a FAIL is the fabric's (no stack could reach the claim here);
- the ceiling meets it: a FAIL is the stack's (the fabric allows it, the stack fell short).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

FABRIC_KINDS = ("latency", "bandwidth")


def fabric_quantity(claim, rdma: float, ip: float) -> float:
    """The claim's quantity from the fabric's figures (one-way latency in us, or bandwidth in MB/s)."""
    if rdma <= 0 or ip <= 0:
        raise ValueError(f"fabric figures must be positive, got rdma {rdma}, ip {ip}")
    speedup = ip / rdma if claim.fabric == "latency" else rdma / ip   # how many times faster RDMA is
    metric_higher_is_better = claim.kind == "ratio" and claim.direction == "higher"
    ratio = speedup if metric_higher_is_better else 1.0 / speedup     # candidate / baseline of the metric
    return 1.0 - ratio if claim.kind == "reduction" else ratio


def cause(claim, outcome: str, ceiling: float | None, reached: float | None) -> str:
    """One line: whose the verdict is, with the figures."""
    if ceiling is None:
        return "fabric ceiling not measured"
    allows = f"the fabric alone gives {ceiling:.3g} (claim {claim.stated_bound()})"
    stack = f", the stack reached {reached:.3g}" if reached is not None else ""
    if outcome == "fail":
        if claim.admits(ceiling):
            return f"FAIL is the stack's: {allows}{stack}"
        return f"FAIL is the fabric's: {allows}{stack}"
    if not claim.admits(ceiling):
        return f"{outcome}, though the fabric alone misses the claim: {allows}{stack}"
    return f"{outcome}: {allows}{stack}"


def baseline_net(claim) -> str:
    for part in (claim.baseline or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "net":
            return value
    return "eth"


def _median(measurements, metric: str, config: str) -> float | None:
    for m in measurements:
        if m.metric == metric and m.config == config:
            return float(m.value)
    return None


def attach_ceilings(verdicts: list[dict], measurements: Iterable, claims: Mapping,
                    notes: Mapping[str, list[str]] | None = None) -> None:
    """Add ``fabric`` to each verdict of a claim that names one: {quantity, rdma, ip, ceiling, cause}
    when the fabric was measured in this run, or {quantity, why} with the reasons it was not."""
    measurements = list(measurements)
    notes = notes or {}
    for v in verdicts:
        claim = claims.get(v["claim_id"])
        if claim is None or not getattr(claim, "fabric", None):
            continue
        metric = f"fabric.{claim.fabric}"
        net = baseline_net(claim)
        rdma = _median(measurements, metric, "transport=verbs,net=ib")
        ip = _median(measurements, metric, f"transport=tcp,net={net}")
        paper = (f"{claim.published[0]:g}..{claim.published[1]:g} " if claim.published else "") + f"({claim.stated_bound()})"
        entry = {"quantity": claim.fabric, "rdma": rdma, "ip": ip, "net": net, "paper": paper,
                 "unit": "us" if claim.fabric == "latency" else "MB/s"}
        if rdma is not None and ip is not None:
            entry["ceiling"] = fabric_quantity(claim, rdma, ip)
            entry["cause"] = cause(claim, v["outcome"], entry["ceiling"], v.get("quantity"))
        elif rdma is None and ip is None and not notes.get(claim.id):
            continue          # nothing measured, nothing said: the claim's test did not ask
        else:
            entry["ceiling"] = None
            entry["why"] = "; ".join(notes.get(claim.id, [])) or "a side of the comparison was not measured"
            entry["cause"] = f"fabric ceiling not measured: {entry['why']}"
        v["fabric"] = entry


def ceiling_rows(verdicts: Iterable[dict]) -> list[list[str]]:
    """Per claim with a fabric entry: claim, paper claim, fabric ceiling, stack reached, cause."""
    rows = []
    for v in sorted(verdicts, key=lambda v: v["claim_id"]):
        entry = v.get("fabric")
        if not entry:
            continue
        ceiling = entry.get("ceiling")
        sides = (f" [rdma {entry['rdma']:.3g} vs ip/{entry['net']} {entry['ip']:.3g} {entry['unit']}]"
                 if entry.get("rdma") is not None and entry.get("ip") is not None else "")
        reached = v.get("quantity")
        rows.append([v["claim_id"], entry.get("paper", ""), ("-" if ceiling is None else f"{ceiling:.3g}") + sides,
                     "-" if reached is None else f"{reached:.3g}", f"{v['outcome'].upper()}: {entry.get('cause', '')}"])
    return rows


CEILING_HEADERS = ["claim", "paper claim", "fabric allows", "stack reached", "verdict and cause"]
