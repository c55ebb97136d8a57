"""The tables printed at the end of a pytest run and by ``hpcnet report``.

Three levels of detail (``TABLES``), every line at most ``WIDTH`` characters:

- ``summary``: verdict counts and one line per FAIL and WARN (pytest ``-q``);
- ``compact``: the claims (verdict, measured value, CI, bound, gate) and one row per measurement with
  its headline value, showing only the configuration and parameters that tell a metric's rows apart;
- ``full``: per metric, every configuration and parameter with the distribution the value came from,
  and per claim its statement, why it got its verdict, and its source (pytest ``-v``).

Column names say what a column holds: ``value`` is the metric's headline figure (a median, or a
percentile of pooled latencies for ``qjump.barrier.p99``), and ``median``..``max`` describe the
distribution it was computed from, so a p99 of 138 beside a median of 80 is not a contradiction.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict

from tabulate import tabulate

from ..measure import Measurement

TABLES = ("summary", "compact", "full")
WIDTH = 120
_SEP = 2   # tabulate's "simple" format puts two spaces between columns


def fmt_number(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _params(p: dict, keys=None) -> str:
    keys = sorted(p) if keys is None else keys
    return " ".join(f"{k}={p[k]}" for k in keys if k in p)


def param_sort_value(v):
    """Numbers compare as numbers (1, 64, 1024, not 1, 1024, 64); anything else as text, after them."""
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def measurement_order(m: Measurement):
    """Metric, config, then parameters by ``param_sort_value``."""
    return m.metric, m.config, tuple((k, param_sort_value(v)) for k, v in sorted(m.params.items()))


def fitted(rows: list[list], headers: list[str], *, flexible: dict[int, int], width: int = WIDTH) -> str:
    """``tabulate`` with the ``flexible`` columns ({index: narrowest}) wrapped so lines fit ``width``.

    Each column keeps its natural width when everything fits; otherwise the flexible columns share what
    the fixed ones leave, in proportion to their natural widths (never below their narrowest)."""
    rows = [[str(c) for c in row] for row in rows]
    # tabulate pads a column to its header plus MIN_PADDING (2) when headers are given
    natural = [max([len(h) + 2] + [max((len(x) for x in r[i].splitlines()), default=0) for r in rows])
               for i, h in enumerate(headers)]
    budget = width - _SEP * (len(headers) - 1) - sum(w for i, w in enumerate(natural) if i not in flexible)
    want = sum(natural[i] for i in flexible)
    limits: list[int | None] = [None] * len(headers)
    if want > budget:
        for i in flexible:
            limits[i] = max(flexible[i], budget * natural[i] // max(want, 1))
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True, maxcolwidths=limits)


# --- measurements -----------------------------------------------------------------------------------

def _by_metric(measurements: list[Measurement]) -> dict[str, list[Measurement]]:
    out: dict[str, list[Measurement]] = defaultdict(list)
    for m in sorted(measurements, key=measurement_order):
        out[m.metric].append(m)
    return out


def distinguishing(ms: list[Measurement]) -> tuple[list[str], list[str]]:
    """(config parts, param keys) that differ between a metric's rows: what a compact row must show
    (all of them for a metric with one row: there is nothing to tell apart, and nothing to repeat)."""
    def parts(m):
        return {p.split("=", 1)[0]: p for p in (m.config or "-").split(",")}
    all_parts = [parts(m) for m in ms]
    part_keys = list(dict.fromkeys(k for p in all_parts for k in p))
    if len(ms) == 1:
        return part_keys, sorted(ms[0].params)
    varying_parts = [k for k in part_keys if len({p.get(k) for p in all_parts}) > 1] or part_keys[:1]
    keys = sorted({k for m in ms for k in m.params})
    varying_keys = [k for k in keys if len({repr(m.params.get(k)) for m in ms}) > 1]
    return varying_parts, varying_keys


def config_text(m: Measurement, parts: list[str]) -> str:
    mine = {p.split("=", 1)[0]: p for p in (m.config or "-").split(",")}
    return ", ".join(mine[k] for k in parts if k in mine) or "-"   # spaces: where a long one may wrap


def measurements_compact(measurements: list[Measurement], width: int = WIDTH) -> str:
    """One row per measurement: metric (once per group), what tells its rows apart, value, unit, n."""
    rows = []
    for metric, ms in _by_metric(measurements).items():
        parts, keys = distinguishing(ms)
        for i, m in enumerate(ms):
            rows.append([metric if i == 0 else "", config_text(m, parts), _params(m.params, keys) or "-",
                         fmt_number(m.value), m.unit, len(m.samples)])
    table = fitted(rows, ["metric", "config", "params", "value", "unit", "samples"],
                   flexible={1: 16, 2: 16}, width=width)
    return table + ("\nconfig and params show only what differs between a metric's rows; value is the "
                    "metric's headline figure\n(-v or --hpcnet-tables=full: every key and the distribution "
                    "behind each value)")


STAT_COLUMNS = ("median", "min", "mean", "stdev", "p99", "p99_9", "max", "n")


def measurements_full(measurements: list[Measurement], width: int = WIDTH) -> str:
    """Per metric: a heading (unit, direction) and a row per measurement with the value and the
    distribution it came from (``Measurement.stats``: the samples, or the pooled data a statistic of
    pooled data was computed from, as qjump's percentiles are)."""
    out = ["value: the metric's headline figure; median..n: the distribution it was computed from", ""]
    for metric, ms in _by_metric(measurements).items():
        m0 = ms[0]
        out.append(f"{metric}  [{m0.unit}, {m0.direction} is better]")
        rows = []
        for m in ms:
            s = m.stats or {}
            rows.append([" ".join(x for x in ((m.config or "-").replace(",", ", "), _params(m.params)) if x),
                         fmt_number(m.value)]
                        + [fmt_number(s.get(k)) if k != "n" else s.get("n", len(m.samples)) for k in STAT_COLUMNS])
        out.append(fitted(rows, ["config and params", "value"] + [c.replace("_", ".") for c in STAT_COLUMNS],
                          flexible={0: 20}, width=width))
        out.append("")
    return "\n".join(out).rstrip()


def measurements_table(measurements: list[Measurement], tables: str = "compact", width: int = WIDTH) -> str:
    return measurements_full(measurements, width) if tables == "full" else measurements_compact(measurements, width)


# --- claims -----------------------------------------------------------------------------------------

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


OUTCOME_ORDER = ("pass", "warn", "fail", "n/a", "not evaluated")
# The order a reader needs: what went wrong first, what was not checked last.
READING_ORDER = ("fail", "warn", "pass", "not evaluated", "n/a")


def reading_order(v: dict):
    outcome = v.get("outcome", "")
    rank = READING_ORDER.index(outcome) if outcome in READING_ORDER else len(READING_ORDER)
    return rank, v.get("claim_id", "")


def ci_text(v: dict) -> str:
    ci = v.get("ci")
    return f"[{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "-"


def bound_core(v: dict) -> str:
    """The bound without its tolerance and warn band ('<= 1' of '<= 1 (tolerance 0.2, warn band 0.05)')."""
    return str(v.get("bound") or "-").split(" (", 1)[0]


def verdicts_table(verdicts: list[dict], tables: str = "compact", width: int = WIDTH) -> str:
    """One row per claim, FAIL and WARN first.

    ``compact``: the claims that were judged, bounds without tolerance and warn band, and one line
    counting the n/a and not-evaluated ones. ``full``: every claim, full bounds, then per claim its
    statement, why it got its verdict, where its bound came from, and its source."""
    full = tables == "full"
    judged = [v for v in sorted(verdicts, key=reading_order) if full or v["outcome"] in ("fail", "warn", "pass")]
    rows = []
    for v in judged:
        bound = (v.get("bound") or "-") if full else bound_core(v)
        rows.append([v["claim_id"], v["outcome"].upper(), fmt_number(v.get("quantity")), ci_text(v),
                     bound + (" (override)" if v.get("bound_from") else ""), gate_text(v)])
    parts = [fitted(rows, ["claim", "verdict", "measured", "CI", "bound", "gate"],
                    flexible={0: 30, 4: 12}, width=width)] if rows else []
    if not full:
        why = {"n/a": "n/a (hardware absent)", "not evaluated": "not evaluated (not measured in this run)"}
        unjudged = [f"{n} {why[o]}" for o in why if (n := sum(v["outcome"] == o for v in verdicts))]
        if unjudged:
            parts.append(f"Not listed: {' and '.join(unjudged)}; -v or --hpcnet-tables=full lists them "
                         "with the reason.")
        return "\n".join(parts)
    lines = ["\n".join(parts), ""]
    for v in judged:
        lines.append(f"{v['claim_id']}  [{v['outcome'].upper()}]")
        text = [v["statement"]] if v.get("statement") else []
        text.append(f"why: {v.get('reason') or '-'}")
        if v.get("bound_from"):
            text.append(f"bound from {v['bound_from']}")
        text.append(f"source: {v.get('source') or '-'}")
        for paragraph in text:
            lines.extend(textwrap.wrap(paragraph, width, initial_indent="    ", subsequent_indent="      ",
                                       break_on_hyphens=False))
    return "\n".join(lines)


def verdicts_summary(verdicts: list[dict], width: int = WIDTH) -> list[str]:
    """A count line ('3 pass, 1 warn, ...'), then one line per warn and fail, so neither hides in a table."""
    counts = {o: sum(v["outcome"] == o for v in verdicts) for o in OUTCOME_ORDER}
    lines = [", ".join(f"{n} {o}" for o, n in counts.items() if n)]
    for v in sorted(verdicts, key=lambda v: (OUTCOME_ORDER.index(v["outcome"]), v["claim_id"])):
        if v["outcome"] in ("warn", "fail"):
            note = "" if v.get("enforced", True) else " (report-only)"
            if v.get("injected"):
                note = f" (canary: {v['injected']:.0%} injected, {'caught' if v['outcome'] == 'fail' else 'MISSED'})"
            cause = f" -- {v['fabric']['cause']}" if v.get("fabric", {}).get("cause") else ""
            lines.extend(textwrap.wrap(f"{v['outcome'].upper()} {v['claim_id']}{note}: {v.get('reason', '')}{cause}",
                                       width, subsequent_indent="    ", break_on_hyphens=False))
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


def measurements_summary(measurements: list[Measurement]) -> str:
    metrics = {m.metric for m in measurements}
    return f"{len(measurements)} measurement(s) of {len(metrics)} metric(s)"


def choose_tables(setting: str | None, verbosity: int) -> str:
    """``--hpcnet-tables`` when given, else from pytest's verbosity: -q summary, default compact, -v full."""
    if setting and setting != "auto":
        return setting
    return "summary" if verbosity < 0 else "full" if verbosity > 0 else "compact"
