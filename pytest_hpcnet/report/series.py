"""One claim across runs as an HTML page (``hpcnet history CLAIM_ID --html FILE``).

The chart puts each run on the x axis in time order (labelled with its date and stack version), the
claim's measured quantity as a point coloured by its verdict, its confidence interval as an error bar,
one line per cluster and target, and the claim's bound(s) as dashed lines, so a drift towards the bound shows before it fails. Below it,
the same table ``hpcnet history CLAIM_ID`` prints. Inline SVG, no scripts, like the run report.
"""

from __future__ import annotations

from pathlib import Path

from .. import tracking
from ..results import write_atomic
from . import plots
from .html import _CSS, _e, _figure, _table

OUTCOME_COLOURS = {"pass": "#2ca02c", "warn": "#e6a700", "fail": "#d62728"}


def _bounds(verdict: dict) -> dict[str, float]:
    lo, hi = tracking.verdict_bounds(verdict)
    return {name: value for name, value in (("min", lo), ("max", hi)) if value is not None}


def series_chart(points, *, title: str) -> str:
    """The claim's quantity per run (points with CI bars, coloured by verdict), one line per cluster and
    target (runs of different clusters are not one series), and the claim's bounds."""
    measured = [(i, p) for i, p in enumerate(points) if isinstance(p.verdict.get("quantity"), (int, float))]
    if not measured:
        raise ValueError("no run measured this claim's quantity")
    groups: dict[str, list] = {}
    for i, p in measured:
        groups.setdefault(f"{p.run.cluster} / {p.run.target}", []).append((i, p))
    colours = plots.colour_map(groups)
    plt = plots._pyplot()
    fig, ax = plt.subplots(figsize=(min(14.0, max(5.0, 1.2 * len(points) + 2.0)), 3.6))
    try:
        for name, members in groups.items():
            xs = [i for i, _ in members]
            ys = [float(p.verdict["quantity"]) for _, p in members]
            ax.plot(xs, ys, color=colours[name], linewidth=1.2, zorder=1, label=name)
            for (i, p), y in zip(members, ys):
                ci = p.verdict.get("ci")
                err = [[y - ci[0]], [ci[1] - y]] if ci else None
                ax.errorbar([i], [y], yerr=err, fmt="o", capsize=3, zorder=2, ecolor=colours[name],
                            markeredgecolor=colours[name],
                            color=OUTCOME_COLOURS.get(p.verdict.get("outcome"), "#7f7f7f"))
        for name, value in _bounds(points[-1].verdict).items():
            ax.axhline(value, linestyle="--", color="#555", linewidth=1)
            ax.annotate(f"{name} {value:g}", (0, value), xytext=(2, 2), textcoords="offset points", fontsize=7)
        labels = [f"{p.run.date[:10]}\n{p.run.target_text}" for p in points]
        ax.set_xticks(range(len(points)), labels, fontsize=7, rotation=30 if len(points) > 8 else 0,
                      ha="right" if len(points) > 8 else "center")
        ax.set_xlim(-0.5, len(points) - 0.5)
        ax.set_ylabel(points[-1].verdict.get("kind") or "value")
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        return plots._svg(fig)
    finally:
        plt.close(fig)


def render_series_html(claim_id: str, points, headers: list[str], rows: list[list[str]]) -> str:
    """``headers``/``rows``: the series as the terminal shows it (history owns that table; the report
    only draws it)."""
    last = points[-1].verdict
    classes = [{"pass": "pass", "warn": "warn", "fail": "fail"}.get(p.verdict.get("outcome"), "na") for p in points]
    chart = _figure(series_chart(points, title=claim_id), "series",
                    f"{claim_id}: the measured {last.get('kind') or 'value'} per run with its confidence "
                    f"interval, coloured by verdict; dashed: the bound {last.get('bound')}.")
    title = f"pytest-hpcnet claim {claim_id} across {len(points)} run(s)"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">', f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>", "</head>", "<body>", f"<h1>{_e(title)}</h1>",
        f"<p>{_e(last.get('statement') or '')}</p>", f"<p class=\"muted\">source: {_e(last.get('source'))}</p>",
        chart, _table(headers, rows, numeric={4}, row_classes=classes), "</body>", "</html>", ""])


def write_series_html(claim_id: str, points, headers: list[str], rows: list[list[str]], path: Path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / f"{claim_id}.html"
    write_atomic(path, render_series_html(claim_id, points, headers, rows))
    return path
