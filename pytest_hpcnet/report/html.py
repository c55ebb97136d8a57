"""The per-run HTML report: one self-contained file drawn from a run record.

Layout, top to bottom: the run in one line, the verdict summary and a table of contents; the claims
(FAIL and WARN first, each with its statement, published range, bound, measured value and CI, linked to
its metric's charts; n/a and not-evaluated claims folded into one line each); one section per suite (the
first dotted part of a metric name) with, per metric, a bar chart (configurations side by side per
parameter set, median with interquartile error bars), for latency metrics the CDF of the samples as small
multiples (one chart per parameter set), and the measurement table folded under the charts; last, the
full provenance. No chart has more than ``plots.MAX_SERIES`` series. Charts are inline SVG and the page
has no scripts and no external links, so it opens from disk or a CI artifact with no network.

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
from .html_claims import claims_section, metric_anchor, summary_line, toc_claims
from .terminal import config_text, distinguishing, fmt_number, measurement_order, param_sort_value

# Units whose samples are latencies worth a CDF (the report draws one per metric).
LATENCY_UNITS = {"ns", "us", "µs", "ms"}
# A CDF of fewer samples than this says nothing a table does not (e.g. one p99 per repetition).
MIN_CDF_SAMPLES = 10

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 2em; }
h3 { font-size: 1.0em; margin-top: 1.5em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; width: 100%; table-layout: fixed; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
table.provenance { width: auto; max-width: 100%; }
col.c-verdict { width: 5em; } col.c-claim { width: 38%; } col.c-num { width: 9em; } col.c-bound { width: 12em; }
col.c-gate { width: 7em; } col.c-chart { width: 12em; } col.c-source { width: 25%; }
.statement { margin: 2px 0; } .source { color: #777; font-size: 0.9em; }
table.compact td { padding: 1px 6px; font-size: 0.95em; }
details.unjudged { margin: 0.4em 0; } details.unjudged summary { cursor: pointer; background: #eee; padding: 2px 6px; }
details.table summary { cursor: pointer; color: #555; font-size: 0.9em; }
p.summary .badge { display: inline-block; padding: 1px 8px; margin-right: 4px; border-radius: 3px;
                   color: #222; text-decoration: none; font-weight: bold; }
nav#contents { background: #f7f7f7; border: 1px solid #ddd; padding: 0.3em 1em; font-size: 0.9em; }
nav#contents ol { margin: 0.2em 0; } nav#contents > ol { columns: 2; } nav#contents h2 { border: 0; margin: 0.3em 0; font-size: 1em; }
section.metric { margin-top: 1.2em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; }
.pass { background: #d8f5d8; } .warn { background: #fff1c2; } .fail { background: #f9d0d0; }
.na { background: #eee; color: #666; }
figure.chart { display: inline-block; margin: 0.5em 1em 0.5em 0; vertical-align: top; }
figure.chart svg { max-width: 100%; height: auto; }
figcaption { font-size: 0.8em; color: #555; max-width: 32em; }
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
    return '<h2 id="provenance">Provenance</h2>\n' + _table(None, rows).replace("<table>", '<table class="provenance">', 1)


def run_line(record: RunRecord) -> str:
    """Where and what, in one line at the top; the full provenance is at the end."""
    prov = record.provenance or {}
    git = prov.get("git") or {}
    cluster = prov.get("cluster") or {}
    facts = [("time", prov.get("time")), ("host", prov.get("host")),
             ("cluster", cluster.get("source")), ("target", (prov.get("target") or {}).get("name")),
             ("commit", (git.get("commit") or "")[:12] + (" (local changes)" if git.get("dirty") else ""))]
    return '<p class="muted">' + " · ".join(f"{k} {_e(v)}" for k, v in facts if v) + "</p>"


# --- measurements --------------------------------------------------------------------------------

def measurements_table(measurements: list[Measurement]) -> str:
    rows = []
    for m in sorted(measurements, key=measurement_order):
        s = m.stats or {}
        rows.append([m.config or "-", _params_text(m.params), fmt_number(m.value), fmt_number(s.get("median")),
                     fmt_number(s.get("min")), fmt_number(s.get("mean")), fmt_number(s.get("stdev")), fmt_number(s.get("p99")),
                     fmt_number(s.get("p99_9")), fmt_number(s.get("max")), s.get("n", len(m.samples)), m.test or ""])
    unit = measurements[0].unit if measurements else ""
    return _table(["config", "params", f"value ({unit})", "median", "min", "mean", "stdev", "p99",
                   "p99.9", "max", "n", "test"], rows, numeric=set(range(2, 11)))


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


def _bars(measurements: list[Measurement], keys: list[str], metric: str, label) -> list[plots.Bar]:
    bars = []
    for m in sorted(measurements, key=lambda m: tuple(param_sort_value(m.params.get(k)) for k in keys)):
        group = _params_text(m.params, keys) or metric.rsplit(".", 1)[-1]
        p25 = p75 = None
        if len(m.samples) >= 2:
            q25, q75 = np.percentile(m.samples, [25, 75])
            # the headline value may be a pooled statistic rather than the samples' median: keep the
            # bar's whisker ends on their side of it
            p25, p75 = min(float(q25), m.value), max(float(q75), m.value)
        bars.append(plots.Bar(group=group, series=label(m), median=m.value, p25=p25, p75=p75))
    return bars


def _figure(svg: str, kind: str, caption: str) -> str:
    return f'<figure class="chart" data-kind="{kind}">\n{svg}\n<figcaption>{_e(caption)}</figcaption></figure>'


def chunks(items: list, size: int = plots.MAX_SERIES) -> list[list]:
    """``items`` in consecutive runs of at most ``size``, as even as possible (9 -> 5 + 4, not 8 + 1)."""
    if not items:
        return []
    n = -(-len(items) // size)
    per = -(-len(items) // n)
    return [items[i:i + per] for i in range(0, len(items), per)]


def metric_charts(metric: str, measurements: list[Measurement], colours: dict[str, str]) -> list[str]:
    """A bar chart per run of at most MAX_SERIES configurations and, for a latency metric, a CDF per
    parameter set (small multiples: one chart per payload size, its configurations as the series)."""
    unit = measurements[0].unit
    direction = measurements[0].direction
    keys = group_keys(measurements)
    configs = list(dict.fromkeys(m.config or "-" for m in sorted(measurements, key=measurement_order)))
    # legends name only the configuration keys that differ between the series; the caption says the rest
    differing, _ = distinguishing(measurements)

    def label(m):
        return config_text(m, differing) if len(configs) > 1 else (m.config or "-")
    labels = {label(m): colours.get(m.config or "-") for m in measurements}
    shared = sorted({p for m in measurements for p in (m.config or "-").split(",")}
                    - {p for m in measurements for p in config_text(m, differing).split(", ")})
    common = f" Every series also has {', '.join(shared)}." if shared and len(configs) > 1 else ""
    out = []
    runs = chunks(configs)
    for i, run in enumerate(runs):
        mine = [m for m in measurements if (m.config or "-") in run]
        title = metric + (f" ({i + 1}/{len(runs)})" if len(runs) > 1 else "")
        out.append(_figure(plots.bar_chart(_bars(mine, keys, metric, label), title=title,
                                           ylabel=f"{unit} ({direction} is better)", colours=labels),
                           "bar", f"{title}: median per configuration; error bars span the 25th-75th "
                                  f"percentile of the samples.{common}"))
    if unit in LATENCY_UNITS:
        panels: dict[str, dict[str, list[float]]] = defaultdict(dict)
        for m in sorted(measurements, key=measurement_order):
            if len(m.samples) >= MIN_CDF_SAMPLES:
                panels[_params_text(m.params, keys)][label(m)] = m.samples
        ordered = sorted(panels, key=lambda p: [param_sort_value(v) for v in _panel_values(measurements, keys, p)])
        for panel in ordered:
            names = list(panels[panel])
            for j, part in enumerate(chunks(names)):
                title = " ".join(x for x in (metric, panel) if x) + (f" ({j + 1})" if len(names) > plots.MAX_SERIES else "")
                out.append(_figure(plots.cdf_chart({n: panels[panel][n] for n in part}, title=title, xlabel=unit,
                                                   colours=labels),
                                   "cdf", f"{title}: empirical CDF of every sample, per configuration.{common}"))
    return out


def _panel_values(measurements: list[Measurement], keys: list[str], panel: str) -> list:
    for m in measurements:
        if _params_text(m.params, keys) == panel:
            return [m.params.get(k) for k in keys]
    return []


def suite_sections(measurements: list[Measurement]) -> str:
    if not measurements:
        return "<h2 id=\"measurements\">Measurements</h2>\n<p class=\"muted\">This run recorded no measurements.</p>"
    configs = list(dict.fromkeys(m.config or "-" for m in sorted(measurements, key=measurement_order)))
    colours = plots.colour_map(configs)   # one colour per configuration across the report, where it can
    parts = []
    for suite, metrics in by_suite(measurements).items():
        parts.append(f'<h2 id="suite-{_e(suite)}">Suite: {_e(suite)}</h2>')
        for metric in sorted(metrics):
            ms = metrics[metric]
            parts.append(f'<section class="metric" id="{_e(metric_anchor(metric))}"><h3>{_e(metric)}</h3>')
            parts.extend(metric_charts(metric, ms, colours))
            parts.append(f'<details class="table"><summary>table of the {len(ms)} measurement(s)</summary>'
                         f"{measurements_table(ms)}</details></section>")
    return "\n".join(parts)


def by_suite(measurements: list[Measurement]) -> dict[str, dict[str, list[Measurement]]]:
    out: dict[str, dict[str, list[Measurement]]] = defaultdict(lambda: defaultdict(list))
    for m in measurements:
        out[suite_of(m.metric)][m.metric].append(m)
    return {suite: dict(out[suite]) for suite in sorted(out)}


def contents(record: RunRecord) -> str:
    """The table of contents: claims (with a link per FAIL and WARN), each suite and its metrics, provenance."""
    items = ['<li><a href="#claims">Claims</a>' + toc_claims(record.verdicts) + "</li>"]
    for suite, metrics in by_suite(record.measurements).items():
        sub = "".join(f'<li><a href="#{_e(metric_anchor(m))}">{_e(m)}</a></li>' for m in sorted(metrics))
        items.append(f'<li><a href="#suite-{_e(suite)}">Suite: {_e(suite)}</a><ol>{sub}</ol></li>')
    if not record.measurements:
        items.append('<li><a href="#measurements">Measurements</a></li>')
    items.append('<li><a href="#provenance">Provenance</a></li>')
    return f'<nav id="contents"><h2>Contents</h2><ol>{"".join(items)}</ol></nav>'


def render_html(record: RunRecord) -> str:
    """The whole report as one HTML document."""
    title = f"pytest-hpcnet run {record.run_id}"
    metrics = {m.metric for m in record.measurements}
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f"<title>{_e(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
        f"<h1>{_e(title)}</h1>", run_line(record), summary_line(record.verdicts), contents(record),
        claims_section(record.verdicts, metrics), suite_sections(record.measurements), provenance_section(record),
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
