"""The per-run HTML report: one self-contained file drawn from a run record.

Layout, top to bottom: provenance (where, when, what was run), every claim with its verdict, then one
section per suite (the first dotted part of a metric name) with its measurement table, a bar chart per
metric (configurations side by side per parameter set, median with interquartile error bars) and, for
latency metrics, the CDF of the samples. Charts are inline SVG and the page has no scripts and no
external links, so it opens from disk or a CI artifact with no network.

``write_html(record, outdir) -> Path`` is what the CLI and the plugin call.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..measure import Measurement
from ..results import RunRecord
from . import plots
from .terminal import fmt_number, gate_text, measurement_order, param_sort_value

# Units whose samples are latencies worth a CDF (the report draws one per metric).
LATENCY_UNITS = {"ns", "us", "µs", "ms"}
# A CDF of fewer samples than this says nothing a table does not (e.g. one p99 per repetition).
MIN_CDF_SAMPLES = 10

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 2em; }
h3 { font-size: 1.0em; margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; }
.pass { background: #d8f5d8; } .warn { background: #fff1c2; } .fail { background: #f9d0d0; }
.na { background: #eee; color: #666; }
figure.chart { display: inline-block; margin: 0.5em 1em 0.5em 0; vertical-align: top; }
figure.chart svg { max-width: 100%; height: auto; }
figcaption { font-size: 0.8em; color: #555; max-width: 40em; }
.muted { color: #777; }
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _params_text(params: dict, keys=None) -> str:
    keys = sorted(params) if keys is None else keys
    return " ".join(f"{k}={params[k]}" for k in keys if k in params)


def suite_of(metric: str) -> str:
    return metric.split(".", 1)[0]


def _table(headers: list[str] | None, rows: list[list], numeric: set[int] = frozenset(), row_classes=None) -> str:
    out = ["<table>"]
    if headers:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>")
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="num">{_e(c)}</td>' if j in numeric else f"<td>{_e(c)}</td>"
                        for j, c in enumerate(row))
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


# --- provenance ----------------------------------------------------------------------------------

def provenance_section(record: RunRecord) -> str:
    prov = record.provenance or {}
    git = prov.get("git") or {}
    commit = git.get("commit") or "-"
    if git.get("dirty"):
        commit += " (local changes)"
    cluster = prov.get("cluster") or {}
    nodes = cluster.get("nodes") or []
    node_names = ", ".join(n.get("name", "?") if isinstance(n, dict) else str(n) for n in nodes) or "-"
    target = prov.get("target") or {}
    packages = ", ".join(f"{k} {v}" for k, v in sorted((prov.get("packages") or {}).items())) or "-"
    rows = [
        ["run", record.run_id], ["time (UTC)", prov.get("time")], ["host", prov.get("host")],
        ["user", prov.get("user")], ["commit", commit],
        ["target", target.get("name", "-") + (f" ({json.dumps({k: v for k, v in target.items() if k != 'name'}, sort_keys=True)})"
                                             if len(target) > 1 else "")],
        ["cluster", f"{cluster.get('source', '-')} ({cluster.get('name', '-')})"], ["nodes", node_names],
        ["arguments", " ".join(map(str, prov.get("args") or [])) or "-"],
        ["python", prov.get("python")], ["platform", f"{prov.get('platform', '-')} {prov.get('machine', '')}"],
        ["packages", packages],
    ]
    return "<h2>Provenance</h2>\n" + _table(None, rows)


# --- claims --------------------------------------------------------------------------------------

def claims_section(verdicts: list[dict]) -> str:
    if not verdicts:
        return "<h2>Claims</h2>\n<p class=\"muted\">No claims were checked in this run.</p>"
    counts = defaultdict(int)
    rows, classes = [], []
    for v in sorted(verdicts, key=lambda v: v.get("claim_id", "")):
        outcome = v.get("outcome", "?")
        counts[outcome] += 1
        ci = v.get("ci")
        conf = v.get("confidence")
        ci_text = "-" if not ci else (f"{conf:.0%} " if conf else "") + f"[{ci[0]:.4g}, {ci[1]:.4g}]"
        rows.append([v.get("claim_id"), outcome.upper(), v.get("kind") or "-", fmt_number(v.get("quantity")), ci_text,
                     v.get("n", "-"), v.get("bound", "-"), gate_text(v), v.get("reason", ""), v.get("source", "")])
        classes.append({"pass": "pass", "warn": "warn", "fail": "fail"}.get(outcome, "na"))
    summary = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
    from ..fabric.ceiling import CEILING_HEADERS, ceiling_rows
    fabric = ceiling_rows(verdicts)
    fabric_html = ("\n<h3>Fabric ceilings</h3>\n<p>The same comparison measured with the fabric's native tools "
                   "(perftest vs qperf/sockperf) on the same nodes: what the fabric alone allows, beside what the "
                   "stack reached, and whose a FAIL is.</p>\n" + _table(CEILING_HEADERS, fabric)) if fabric else ""
    return (f"<h2>Claims</h2>\n<p>{_e(summary)}</p>\n"
            + _table(["claim", "verdict", "kind", "measured", "CI", "n", "bound", "gate", "why", "source"], rows,
                     numeric={3, 5}, row_classes=classes) + fabric_html)


# --- measurements --------------------------------------------------------------------------------

def measurements_table(measurements: list[Measurement]) -> str:
    rows = []
    for m in sorted(measurements, key=measurement_order):
        s = m.stats or {}
        rows.append([m.metric, m.config or "-", _params_text(m.params), m.unit, m.direction, fmt_number(m.value),
                     fmt_number(s.get("min")), fmt_number(s.get("mean")), fmt_number(s.get("stdev")), fmt_number(s.get("p99")),
                     fmt_number(s.get("p99_9")), fmt_number(s.get("max")), s.get("n", len(m.samples)), m.test or ""])
    return _table(["metric", "config", "params", "unit", "better", "median", "min", "mean", "stdev", "p99",
                   "p99.9", "max", "n", "test"], rows, numeric=set(range(5, 13)))


def group_keys(measurements: list[Measurement]) -> list[str]:
    """Parameters that vary *within* one configuration (e.g. payload size): they make the x-axis groups.

    Parameters that only differ between configurations (e.g. a QJump scenario's level) describe the
    configuration itself, so they do not split its bars into separate groups."""
    by_config: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for m in measurements:
        for k, v in m.params.items():
            by_config[m.config][k].add(json.dumps(v, sort_keys=True, default=str))
    keys = {k for values in by_config.values() for k, seen in values.items() if len(seen) > 1}
    return sorted(keys)


def _bars(measurements: list[Measurement], keys: list[str], metric: str) -> list[plots.Bar]:
    bars = []
    for m in sorted(measurements, key=lambda m: tuple(param_sort_value(m.params.get(k)) for k in keys)):
        group = _params_text(m.params, keys) or metric.rsplit(".", 1)[-1]
        p25 = p75 = None
        if len(m.samples) >= 2:
            q25, q75 = np.percentile(m.samples, [25, 75])
            # the headline value may be a pooled statistic rather than the samples' median: keep the
            # bar's whisker ends on their side of it
            p25, p75 = min(float(q25), m.value), max(float(q75), m.value)
        bars.append(plots.Bar(group=group, series=m.config or "-", median=m.value, p25=p25, p75=p75))
    return bars


def _figure(svg: str, kind: str, caption: str) -> str:
    return f'<figure class="chart" data-kind="{kind}">\n{svg}\n<figcaption>{_e(caption)}</figcaption></figure>'


def metric_charts(metric: str, measurements: list[Measurement], colours: dict[str, str]) -> list[str]:
    unit = measurements[0].unit
    direction = measurements[0].direction
    keys = group_keys(measurements)
    out = [_figure(plots.bar_chart(_bars(measurements, keys, metric), title=metric,
                                   ylabel=f"{unit} ({direction} is better)", colours=colours),
                   "bar", f"{metric}: median per configuration; error bars span the 25th-75th percentile "
                          f"of the samples.")]
    if unit in LATENCY_UNITS:
        series = {}
        for m in sorted(measurements, key=measurement_order):
            if len(m.samples) >= MIN_CDF_SAMPLES:
                label = " ".join(x for x in (m.config, _params_text(m.params, keys)) if x) or metric
                series[label] = m.samples
        if series:
            out.append(_figure(plots.cdf_chart(series, title=f"{metric} CDF", xlabel=unit,
                                               colours=plots.colour_map(series)),
                               "cdf", f"{metric}: empirical CDF of every sample, per configuration and "
                                      f"parameter set."))
    return out


def suite_sections(measurements: list[Measurement]) -> str:
    if not measurements:
        return "<h2>Measurements</h2>\n<p class=\"muted\">This run recorded no measurements.</p>"
    configs = list(dict.fromkeys(m.config or "-" for m in sorted(measurements, key=measurement_order)))
    colours = plots.colour_map(configs)   # one colour per configuration across the whole report
    by_suite: dict[str, dict[str, list[Measurement]]] = defaultdict(lambda: defaultdict(list))
    for m in measurements:
        by_suite[suite_of(m.metric)][m.metric].append(m)
    parts = []
    for suite in sorted(by_suite):
        metrics = by_suite[suite]
        parts.append(f'<h2 id="suite-{_e(suite)}">Suite: {_e(suite)}</h2>')
        parts.append(measurements_table([m for ms in metrics.values() for m in ms]))
        for metric in sorted(metrics):
            parts.append(f"<h3>{_e(metric)}</h3>")
            parts.extend(metric_charts(metric, metrics[metric], colours))
    return "\n".join(parts)


def render_html(record: RunRecord) -> str:
    """The whole report as one HTML document."""
    title = f"pytest-hpcnet run {record.run_id}"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>{_e(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
        f"<h1>{_e(title)}</h1>",
        provenance_section(record), claims_section(record.verdicts), suite_sections(record.measurements),
        "</body>", "</html>", ""])


def write_html(record: RunRecord, outdir) -> Path:
    """Write ``<outdir>/<run id>.html`` (creating ``outdir``) and return its path."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{record.run_id}.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render_html(record), encoding="utf-8")
    tmp.replace(path)
    return path
