"""Charts for the HTML report, drawn with matplotlib (Agg) and returned as inline SVG text.

Two kinds, after the way the seed papers present their results:

- ``bar_chart``: one group of bars per parameter set (e.g. payload size), one bar per configuration
  inside each group (HiBD's "RDMA vs IPoIB vs 10GigE" figures). The bar is the median; the error bar
  spans the 25th to 75th percentile of the samples (the interquartile range: where the middle half of
  the samples fell). A measurement with one sample gets no error bar. Bars that span a decade or more
  get a logarithmic y axis, so the small ones stay visible beside a 1 MiB transfer.
- ``cdf_chart``: the empirical CDF of each series' samples (latencies), x in the metric's unit, on a
  log axis when the samples span a decade or more.

Both draw at most ``MAX_SERIES`` series (the report splits more into small multiples), each series with
its own colour, and put the legend outside the plotting area so it never covers data. Every drawn
series carries an SVG id ``series<i>-...`` so a reader (or the browser test) can count them.

SVG keeps the report one self-contained file that needs no network and scales without blurring.
"""

from __future__ import annotations

import io
import itertools
import re
from dataclasses import dataclass

import numpy as np

# Series colours (matplotlib's default cycle, spelled out so every chart of a report agrees on which
# colour a configuration gets).
_CHART_IDS = itertools.count(1)
MAX_SERIES = 8        # more than this in one chart and colours blur together: split into small multiples
LOG_SPAN = 10.0       # data spanning at least this factor get a log axis

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


@dataclass
class Bar:
    group: str               # x-axis group label, e.g. "size=64"
    series: str              # configuration, e.g. "tcp/eth"
    median: float
    p25: float | None = None
    p75: float | None = None


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")   # no display; also keeps a user's interactive backend out of the CLI
    import matplotlib.pyplot as plt
    return plt


def _svg(fig) -> str:
    """The figure as an ``<svg>`` element (no XML prolog or DOCTYPE, so it can sit inside HTML)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    start = text.find("<svg")
    if start < 0:
        raise RuntimeError("matplotlib produced no <svg> element")
    # matplotlib writes a fixed id prefix per figure; make ids unique per chart so several inline SVGs
    # in one page do not resolve each other's clip paths.
    # drop the RDF <metadata> block (creator, date): it is URL-laden noise in a report
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", text[start:], flags=re.S)
    token = f"chart{next(_CHART_IDS)}"
    svg = re.sub(r'id="([^"]+)"', lambda m: f'id="{token}-{m.group(1)}"', svg)
    svg = re.sub(r'url\(#([^)]+)\)', lambda m: f"url(#{token}-{m.group(1)})", svg)
    svg = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{token}-{m.group(1)}"', svg)
    return svg


def colour_map(names) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def _own_colours(series: list[str], colours: dict[str, str] | None) -> dict[str, str]:
    """The report-wide colours when they tell this chart's series apart, else a fresh map for them."""
    if colours and len({colours.get(s) for s in series}) == len(series):
        return colours
    return colour_map(series)


def _check_series(series: list[str], what: str) -> None:
    if len(series) > MAX_SERIES:
        raise ValueError(f"{what}: {len(series)} series in one chart (at most {MAX_SERIES}); split them")


def _legend_outside(ax, fontsize: int) -> None:
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def bar_chart(bars: list[Bar], *, title: str, ylabel: str, colours: dict[str, str] | None = None) -> str:
    """Grouped bars with interquartile error bars; groups and series keep the order they first appear."""
    if not bars:
        raise ValueError("bar_chart needs at least one bar")
    groups = list(dict.fromkeys(b.group for b in bars))
    series = list(dict.fromkeys(b.series for b in bars))
    _check_series(series, title)
    colours = _own_colours(series, colours)
    width = 0.8 / len(series)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(min(9.0, max(3.5, 1.0 + 0.45 * len(groups) * len(series))), 3.0))
    try:
        x = np.arange(len(groups))
        for i, name in enumerate(series):
            mine = {b.group: b for b in bars if b.series == name}
            pos = [x[j] - 0.4 + width * (i + 0.5) for j, g in enumerate(groups) if g in mine]
            heights = [mine[g].median for g in groups if g in mine]
            lower = [mine[g].median - mine[g].p25 if mine[g].p25 is not None else 0.0 for g in groups if g in mine]
            upper = [mine[g].p75 - mine[g].median if mine[g].p75 is not None else 0.0 for g in groups if g in mine]
            drawn = ax.bar(pos, heights, width * 0.95, label=name, color=colours.get(name),
                           yerr=[lower, upper], capsize=3, error_kw={"elinewidth": 1})
            for j, patch in enumerate(drawn.patches):
                patch.set_gid(f"series{i}-bar{j}")
        ax.set_xticks(x, groups, rotation=30 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center")
        positive = [b.median for b in bars if b.median > 0]
        if len(positive) == len(bars) and max(positive) / min(positive) >= LOG_SPAN:
            ax.set_yscale("log")   # e.g. QJump alone vs interference: linear bars would hide the small ones
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        _legend_outside(ax, 8)
        return _svg(fig)
    finally:
        plt.close(fig)


def cdf_chart(series: dict[str, list[float]], *, title: str, xlabel: str,
              colours: dict[str, str] | None = None) -> str:
    """Empirical CDFs, one step line per named series. A log x axis when the data span a decade."""
    series = {k: np.sort(np.asarray(v, dtype=float)) for k, v in series.items() if len(v)}
    if not series:
        raise ValueError("cdf_chart needs at least one non-empty series")
    _check_series(list(series), title)
    colours = _own_colours(list(series), colours)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 2.8))
    try:
        lo = min(float(v[0]) for v in series.values())
        hi = max(float(v[-1]) for v in series.values())
        for i, (name, x) in enumerate(series.items()):
            y = np.arange(1, x.size + 1) / x.size
            ax.step(x, y, where="post", label=name, color=colours.get(name), gid=f"series{i}-line")
        if lo > 0 and hi / lo >= LOG_SPAN:
            ax.set_xscale("log")
        ax.set_ylim(0, 1.0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("CDF")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        _legend_outside(ax, 7)
        return _svg(fig)
    finally:
        plt.close(fig)
