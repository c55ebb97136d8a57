"""The claims part of the HTML report: a verdict summary, then the judged claims (FAIL, WARN, PASS in
that order), each with its statement, published range, bound, measured value and CI, and a link to its
metric's charts; then the claims that were not judged (n/a, not evaluated) folded into one line per
outcome, opened on a click (``<details>``, no script)."""

from __future__ import annotations

import html

import numpy as np

from .terminal import READING_ORDER, fmt_number, gate_text, reading_order

JUDGED = ("fail", "warn", "pass")
ROW_CLASS = {"pass": "pass", "warn": "warn", "fail": "fail"}


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def claim_anchor(claim_id: str) -> str:
    return f"claim-{claim_id}"


def metric_anchor(metric: str) -> str:
    return f"metric-{metric}"


def counts(verdicts: list[dict]) -> list[tuple[str, int]]:
    return [(o, n) for o in READING_ORDER if (n := sum(v.get("outcome") == o for v in verdicts))]


def summary_line(verdicts: list[dict]) -> str:
    """'1 FAIL · 2 WARN · 13 PASS · 15 N/A' as coloured badges linking to the claims."""
    if not verdicts:
        return '<p class="muted">No claims were checked in this run.</p>'
    badges = [f'<a class="badge {ROW_CLASS.get(o, "na")}" href="#claims-{o.replace(" ", "-").replace("/", "")}">'
              f'{n} {_e(o.upper())}</a>' for o, n in counts(verdicts)]
    return f'<p id="verdict-summary" class="summary">Claims: {" ".join(badges)}</p>'


def _published(v: dict) -> str:
    pub = v.get("published")
    if not pub:
        return "-"
    lo, hi = pub
    text = f"{fmt_number(lo)}" if lo == hi else f"{fmt_number(lo)} .. {fmt_number(hi)}"
    runs = v.get("published_runs")
    if runs:        # the source's own runs: their medians, side by side, as the claim compares them
        text += "<br>" + " vs ".join(f"{side} median {fmt_number(float(np.median(runs[side])))} "
                                     f"(n={len(runs[side])})" for side in ("candidate", "baseline"))
    return text


def _measured(v: dict) -> str:
    if v.get("quantity") is None:
        return "-"
    ci = v.get("ci")
    conf = v.get("confidence")
    text = _e(fmt_number(v["quantity"]))
    if ci:
        level = f"{conf:.0%} " if conf else ""
        rounds = f", n={v['n']}" if v.get("n") else ""
        text += f'<br><span class="muted">{level}[{ci[0]:.4g}, {ci[1]:.4g}]{rounds}</span>'
    return text


def _bound(v: dict) -> str:
    text = _e(v.get("bound", "-"))
    if v.get("bound_from"):
        text += f'<br><span class="muted">override: {_e(v["bound_from"])}</span>'
    return text


def _chart_link(v: dict, metrics: set[str]) -> str:
    metric = v.get("metric")
    if metric and metric in metrics:
        return f'<a href="#{_e(metric_anchor(metric))}">{_e(metric)}</a>'
    return _e(metric) if metric else "-"


def _claim_cell(v: dict) -> str:
    parts = [f'<b id="{_e(claim_anchor(v["claim_id"]))}">{_e(v["claim_id"])}</b>']
    if v.get("statement"):
        parts.append(f'<div class="statement">{_e(v["statement"])}</div>')
    configs = " vs ".join(x for x in (v.get("candidate"), v.get("baseline")) if x)
    if configs:
        parts.append(f'<div class="muted">{_e(v.get("kind") or "")}: {_e(configs)}</div>')
    parts.append(f'<div class="muted">why: {_e(v.get("reason") or "-")}</div>')
    parts.append(f'<div class="source">source: {_e(v.get("source") or "-")}</div>')
    return "".join(parts)


def _judged_table(verdicts: list[dict], metrics: set[str]) -> str:
    out = ['<table class="claims">',
           '<colgroup><col class="c-verdict"><col class="c-claim"><col class="c-num"><col class="c-bound">'
           '<col class="c-num"><col class="c-gate"><col class="c-chart"></colgroup>',
           "<tr><th>verdict</th><th>claim</th><th>measured (CI)</th><th>bound</th><th>published</th>"
           "<th>gate</th><th>chart</th></tr>"]
    first_of = set()
    for v in verdicts:
        outcome = v.get("outcome", "?")
        anchor = ""
        if outcome not in first_of:
            first_of.add(outcome)
            anchor = f' id="claims-{_e(outcome)}"'
        out.append(f'<tr class="{ROW_CLASS.get(outcome, "na")}" data-outcome="{_e(outcome)}"{anchor}>'
                   f"<td><b>{_e(outcome.upper())}</b></td><td>{_claim_cell(v)}</td>"
                   f'<td class="num">{_measured(v)}</td><td>{_bound(v)}</td><td class="num">{_published(v)}</td>'
                   f"<td>{_e(gate_text(v))}</td><td>{_chart_link(v, metrics)}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def _unjudged_block(outcome: str, verdicts: list[dict]) -> str:
    """One folded line: '15 N/A (hardware absent)', opening to one short row per claim."""
    what = {"n/a": "hardware absent on this cluster", "not evaluated": "this run did not measure them"}
    rows = [f'<tr class="na" data-outcome="{_e(outcome)}"><td id="{_e(claim_anchor(v["claim_id"]))}">'
            f'{_e(v["claim_id"])}</td><td>{_e(v.get("reason") or "-")}</td><td>{_e(v.get("bound", "-"))}</td>'
            f'<td class="num">{_published(v)}</td><td class="source">{_e(v.get("source") or "-")}</td></tr>'
            for v in verdicts]
    anchor = f'claims-{outcome.replace(" ", "-").replace("/", "")}'
    return (f'<details class="unjudged" id="{anchor}"><summary>{len(verdicts)} {_e(outcome.upper())} '
            f'({_e(what.get(outcome, outcome))})</summary>\n<table class="compact">'
            '<colgroup><col class="c-claim"><col><col class="c-bound"><col class="c-num"><col class="c-source">'
            "</colgroup><tr><th>claim</th><th>why</th><th>bound</th><th>published</th><th>source</th></tr>\n"
            + "\n".join(rows) + "</table></details>")


def claims_section(verdicts: list[dict], metrics: set[str]) -> str:
    if not verdicts:
        return '<h2 id="claims">Claims</h2>\n<p class="muted">No claims were checked in this run.</p>'
    ordered = sorted(verdicts, key=reading_order)
    judged = [v for v in ordered if v.get("outcome") in JUDGED]
    parts = ['<h2 id="claims">Claims</h2>']
    if judged:
        parts.append(_judged_table(judged, metrics))
    if fabric := _fabric_block(ordered):
        parts.append(fabric)
    for outcome in READING_ORDER:
        rest = [v for v in ordered if v.get("outcome") == outcome and outcome not in JUDGED]
        if rest:
            parts.append(_unjudged_block(outcome, rest))
    return "\n".join(parts)


def _fabric_block(verdicts: list[dict]) -> str:
    """Per RDMA claim whose run measured the fabric: the paper's claim, what the fabric alone allows
    (perftest vs qperf/sockperf on the same nodes), what the stack reached, and whose a FAIL is."""
    from ..fabric.ceiling import CEILING_HEADERS, ceiling_rows
    rows = ceiling_rows(verdicts)
    if not rows:
        return ""
    head = "".join(f"<th>{_e(h)}</th>" for h in CEILING_HEADERS)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return ('<h3 id="fabric-ceilings">Fabric ceilings</h3>\n<p>The same comparison measured with the '
            "fabric's native tools on the same nodes: what the fabric alone allows, beside what the stack "
            f"reached, and whose a FAIL is.</p>\n<table class=\"claims\"><tr>{head}</tr>{body}</table>")


def toc_claims(verdicts: list[dict]) -> str:
    """The contents entry for the claims: a link per FAIL and WARN, so they are one click away."""
    bad = [v for v in sorted(verdicts, key=reading_order) if v.get("outcome") in ("fail", "warn")]
    if not bad:
        return ""
    return "<ol>" + "".join(f'<li><a href="#{_e(claim_anchor(v["claim_id"]))}">{_e(v["outcome"].upper())} '
                            f'{_e(v["claim_id"])}</a></li>' for v in bad) + "</ol>"
