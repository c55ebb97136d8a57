"""Compare two run records: every shared metric, its change, and whether the change is real.

Measurements match on (metric, config, params). For each pair the table shows the medians of A and B,
the ratio B/A of the medians and a two-sided Mann-Whitney U test on the two runs' samples (scipy): the
change is *significant* when p < alpha. A *regression* is a significant change that is worse than
``factor`` in the metric's bad direction: B/A > factor for lower-is-better metrics, B/A < 1/factor for
higher-is-better ones. ``hpcnet compare`` exits 1 when any regression is found, for CI gates.

Why Mann-Whitney U: samples of latencies and job times are skewed and heavy-tailed, and the two runs are
independent (no paired rounds across runs), so a rank test makes no normality assumption and is not
moved by a few outliers. The factor keeps a tiny but significant change (easy with thousands of
latency samples) from failing CI. With fewer than 2 samples on either side no test is possible; such a
row is shown with significance "n/a" and is never called a regression.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from scipy import stats

from .errors import ConfigError
from .measure import Measurement
from .results import RunRecord

DEFAULT_FACTOR = 1.10
DEFAULT_ALPHA = 0.05   # lets 4-vs-4 repetition records (p >= 0.029) be judged; the factor guards the rest
MIN_SAMPLES = 2


def key(m: Measurement) -> tuple[str, str, str]:
    return m.metric, m.config, json.dumps(m.params, sort_keys=True, default=str)


@dataclass
class Change:
    metric: str
    config: str
    params: dict
    unit: str
    direction: str
    median_a: float
    median_b: float
    ratio: float          # B / A of the medians (inf when A is 0 and B is not)
    p_value: float | None  # Mann-Whitney U, two-sided; None when either side has < MIN_SAMPLES samples
    significant: bool
    regression: bool
    improvement: bool
    n_a: int
    n_b: int

    @property
    def verdict(self) -> str:
        if self.regression:
            return "REGRESSION"
        if self.improvement:
            return "improved"
        if self.p_value is None:
            return "n/a (too few samples)"
        if self.significant:
            return "changed (within factor)"
        return "same"


@dataclass
class Comparison:
    changes: list[Change]
    only_a: list[Measurement]
    only_b: list[Measurement]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]


def _check(factor: float, alpha: float) -> None:
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1.0):
        raise ConfigError(f"factor must be a number >= 1.0, got {factor!r}", "--factor")
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
        raise ConfigError(f"alpha must be between 0 and 1, got {alpha!r}", "--alpha")


def _ratio(a: float, b: float) -> float:
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


def compare_measurements(a: Measurement, b: Measurement, *, factor: float = DEFAULT_FACTOR,
                         alpha: float = DEFAULT_ALPHA) -> Change:
    _check(factor, alpha)
    ratio = _ratio(a.value, b.value)
    p = None
    if len(a.samples) >= MIN_SAMPLES and len(b.samples) >= MIN_SAMPLES:
        p = float(stats.mannwhitneyu(a.samples, b.samples, alternative="two-sided").pvalue)
        if math.isnan(p):       # every sample identical on both sides: no evidence of a change
            p = 1.0
    significant = p is not None and p < alpha
    direction = b.direction if b.direction == a.direction else a.direction
    worse = ratio > factor if direction == "lower" else ratio < 1.0 / factor
    better = ratio < 1.0 / factor if direction == "lower" else ratio > factor
    return Change(metric=a.metric, config=a.config, params=dict(a.params), unit=a.unit, direction=direction,
                  median_a=a.value, median_b=b.value, ratio=ratio, p_value=p, significant=significant,
                  regression=significant and worse, improvement=significant and better,
                  n_a=len(a.samples), n_b=len(b.samples))


def _index(record: RunRecord, name: str) -> dict:
    out = {}
    for m in record.measurements:
        k = key(m)
        if k in out:
            raise ConfigError(f"two measurements of {m.metric} config {m.config!r} params {k[2]} in one run; "
                              "cannot tell which to compare", name)
        out[k] = m
    return out


def compare(a: RunRecord, b: RunRecord, *, factor: float = DEFAULT_FACTOR, alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Every measurement B shares with A (same metric, config and params), in metric order."""
    _check(factor, alpha)
    ia, ib = _index(a, f"run {a.run_id}"), _index(b, f"run {b.run_id}")
    for k in ia.keys() & ib.keys():
        if ia[k].unit != ib[k].unit:
            raise ConfigError(f"{k[0]} config {k[1]!r}: unit {ia[k].unit!r} in run A but {ib[k].unit!r} in run B",
                              f"runs {a.run_id} / {b.run_id}")
    shared = sorted(ia.keys() & ib.keys())
    changes = [compare_measurements(ia[k], ib[k], factor=factor, alpha=alpha) for k in shared]
    return Comparison(changes=changes, only_a=[ia[k] for k in sorted(ia.keys() - ib.keys())],
                      only_b=[ib[k] for k in sorted(ib.keys() - ia.keys())])


def table(comparison: Comparison) -> str:
    from tabulate import tabulate
    rows = []
    for c in comparison.changes:
        rows.append([c.metric, c.config or "-", " ".join(f"{k}={v}" for k, v in sorted(c.params.items())),
                     c.unit, c.direction, f"{c.median_a:.4g}", f"{c.median_b:.4g}", f"{c.ratio:.3f}",
                     "-" if c.p_value is None else f"{c.p_value:.2g}", f"{c.n_a}/{c.n_b}", c.verdict])
    return tabulate(rows, headers=["metric", "config", "params", "unit", "better", "median A", "median B",
                                   "B/A", "p (MWU)", "n A/B", "change"], tablefmt="simple",
                    disable_numparse=True)


# --- the command ---------------------------------------------------------------------------------

def add_commands(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare two run records; exit 1 on a significant regression")
    p.add_argument("run_a", metavar="RUN_A.json", help="the baseline run record")
    p.add_argument("run_b", metavar="RUN_B.json", help="the run to judge against it")
    p.add_argument("--factor", type=float, default=DEFAULT_FACTOR,
                   help=f"a regression must be worse than this ratio of medians (default {DEFAULT_FACTOR})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"significance level of the Mann-Whitney U test (default {DEFAULT_ALPHA})")
    p.set_defaults(func=_compare_command)


def _compare_command(args) -> int:
    from pathlib import Path
    from .results import load
    a, b = load(Path(args.run_a)), load(Path(args.run_b))
    result = compare(a, b, factor=args.factor, alpha=args.alpha)
    print(f"A = {a.run_id}   B = {b.run_id}   factor {args.factor:g}   alpha {args.alpha:g} (Mann-Whitney U, two-sided)")
    if result.changes:
        print(table(result))
    else:
        print("no shared measurements (match on metric, config and params)")
    if result.only_a or result.only_b:
        print(f"not compared: {len(result.only_a)} measurement(s) only in A, {len(result.only_b)} only in B")
    regressions = result.regressions
    if regressions:
        print(f"{len(regressions)} significant regression(s) beyond x{args.factor:g}: "
              + ", ".join(f"{c.metric}[{c.config}]" for c in regressions))
        return 1
    return 0
