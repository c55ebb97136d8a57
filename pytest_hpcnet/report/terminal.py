"""The tables printed at the end of a pytest run and by ``hpcnet report``."""

from __future__ import annotations

from tabulate import tabulate

from ..measure import Measurement


def fmt_number(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _params(p: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(p.items()))


def param_sort_value(v):
    """Numbers compare as numbers (1, 64, 1024, not 1, 1024, 64); anything else as text, after them."""
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def measurement_order(m: Measurement):
    """Metric, config, then parameters by ``param_sort_value``."""
    return m.metric, m.config, tuple((k, param_sort_value(v)) for k, v in sorted(m.params.items()))


def measurements_table(measurements: list[Measurement]) -> str:
    """One row per measurement, perftest-style columns (the unit says whether it is round-trip)."""
    rows = []
    for m in sorted(measurements, key=measurement_order):
        s = m.stats or {}
        rows.append([m.metric, m.config or "-", _params(m.params), m.unit, fmt_number(m.value),
                     fmt_number(s.get("min")), fmt_number(s.get("mean")), fmt_number(s.get("stdev")), fmt_number(s.get("p99")),
                     fmt_number(s.get("p99_9")), fmt_number(s.get("max")), s.get("n", len(m.samples))])
    return tabulate(rows, headers=["metric", "config", "params", "unit", "median", "min", "mean", "stdev",
                                   "p99", "p99.9", "max", "n"], tablefmt="simple", disable_numparse=True)


def gate_text(v: dict) -> str:
    """How a claim gates: 'report-only', the canary it got, or the smallest regression it catches."""
    if v.get("enforced") is False:
        return "report-only"
    if v.get("injected"):
        return f"canary +{v['injected']:.0%}"
    sens = v.get("sensitivity")
    if sens is not None:
        return f"catches +{sens:.0%}"
    if str(v.get("source", "")).startswith("local:") and v.get("outcome") in ("pass", "warn", "fail"):
        return "misses +100%"
    return "-"


def verdicts_table(verdicts: list[dict]) -> str:
    rows = []
    for v in sorted(verdicts, key=lambda v: v["claim_id"]):
        ci = v.get("ci")
        rows.append([v["claim_id"], v["outcome"].upper(), fmt_number(v.get("quantity")),
                     f"[{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "-",
                     v.get("bound", "-") + (" (override)" if v.get("bound_from") else ""), gate_text(v),
                     v.get("reason") or "", v.get("source", "")])
    return tabulate(rows, headers=["claim", "verdict", "measured", "CI", "bound", "gate", "why", "source"],
                    tablefmt="simple", disable_numparse=True,
                    maxcolwidths=[None, None, None, None, None, None, 48, 32])


OUTCOME_ORDER = ("pass", "warn", "fail", "n/a", "not evaluated")


def verdicts_summary(verdicts: list[dict]) -> list[str]:
    """A count line ('3 pass, 1 warn, ...'), then one line per warn and fail, so neither hides in a table."""
    counts = {o: sum(v["outcome"] == o for v in verdicts) for o in OUTCOME_ORDER}
    lines = [", ".join(f"{n} {o}" for o, n in counts.items() if n)]
    for v in sorted(verdicts, key=lambda v: (OUTCOME_ORDER.index(v["outcome"]), v["claim_id"])):
        if v["outcome"] in ("warn", "fail"):
            note = "" if v.get("enforced", True) else " (report-only)"
            if v.get("injected"):
                note = f" (canary: {v['injected']:.0%} injected, {'caught' if v['outcome'] == 'fail' else 'MISSED'})"
            cause = f" -- {v['fabric']['cause']}" if v.get("fabric", {}).get("cause") else ""
            lines.append(f"{v['outcome'].upper()} {v['claim_id']}{note}: {v.get('reason', '')}{cause}")
    return lines


def fabric_table(verdicts: list[dict]) -> str:
    """Per RDMA claim whose run measured the fabric: the paper's claim, what the fabric alone allows,
    what the stack reached, and whose a FAIL is ('' when no claim has a fabric entry)."""
    from ..fabric.ceiling import CEILING_HEADERS, ceiling_rows
    rows = ceiling_rows(verdicts)
    if not rows:
        return ""
    return tabulate(rows, headers=CEILING_HEADERS, tablefmt="simple", disable_numparse=True,
                    maxcolwidths=[None, 24, 40, None, 60])
