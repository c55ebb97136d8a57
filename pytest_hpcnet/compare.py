"""Compare two run records: every shared metric, its change, and whether the change is real.

Measurements match on (metric, config, params). For each pair the table shows the medians of A and B,
the ratio B/A of the medians and a two-sided Mann-Whitney U test on the two runs' samples (scipy): the
change is *significant* when p < alpha. A *regression* is a significant change that is worse than
``factor`` in the metric's bad direction: B/A > factor for lower-is-better metrics, B/A < 1/factor for
higher-is-better ones.

Claims are compared too: every claim whose verdict differs between the runs is listed (pass -> fail,
n/a -> warn, ...). For CI gates, ``hpcnet compare`` exits 1 on a regression or on a claim that became
FAIL, and 2 when the runs share nothing to compare (no measurement and no claim), so a gate cannot
pass on nothing. ``--json`` prints the whole comparison as one JSON document instead of tables.

Each row is labelled with the parameters that tell it apart from the other rows of its metric and
configuration (``size=64``), not every parameter the run recorded.

Why Mann-Whitney U: samples of latencies and job times are skewed and heavy-tailed, and the two runs are
independent (no paired rounds across runs), so a rank test makes no normality assumption and is not
moved by a few outliers. The factor keeps a tiny but significant change (easy with thousands of
latency samples) from failing CI. With fewer than 2 samples on either side no test is possible; such a
row is shown with significance "n/a" and is never called a regression.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
class ClaimChange:
    """A claim whose verdict differs between the runs (None: not judged in that run)."""

    claim_id: str
    a: str | None
    b: str | None

    @property
    def became_fail(self) -> bool:
        return self.b == "fail" and self.a != "fail"

    def to_json(self) -> dict:
        return {"claim_id": self.claim_id, "a": self.a, "b": self.b, "became_fail": self.became_fail}


@dataclass
class Comparison:
    changes: list[Change]
    only_a: list[Measurement]
    only_b: list[Measurement]
    claims: list[ClaimChange] = field(default_factory=list)   # verdicts that differ
    shared_claims: int = 0                                     # claims judged in both runs

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regression]

    @property
    def new_failures(self) -> list[ClaimChange]:
        return [c for c in self.claims if c.became_fail]

    @property
    def comparable(self) -> bool:
        return bool(self.changes) or self.shared_claims > 0

    def labels(self) -> dict[int, str]:
        """id(measurement or change) -> its distinguishing params, for every row of the comparison."""
        rows = [*self.changes, *self.only_a, *self.only_b]
        return {id(r): distinguishing(r, rows) for r in rows}


def distinguishing(row, rows) -> str:
    """The params of ``row`` whose values differ among the rows of its metric and configuration."""
    group = [r for r in rows if r.metric == row.metric and r.config == row.config]
    keys = sorted({k for r in group for k in r.params})
    varying = [k for k in keys if len({json.dumps(r.params.get(k), sort_keys=True, default=str)
                                       for r in group}) > 1]
    return " ".join(f"{k}={row.params.get(k, '-')}" for k in varying)


def label(row, rows) -> str:
    """``metric[config] k=v``: a row named so that no two rows of a comparison read the same."""
    params = distinguishing(row, rows)
    return f"{row.metric}[{row.config}]" + (f" {params}" if params else "")


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
        # imported here: scipy.stats takes about a second to import, and every `hpcnet` command loads
        # this module to build its parser
        from scipy import stats
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
    va, vb = _verdicts(a), _verdicts(b)
    claims = [ClaimChange(cid, va.get(cid), vb.get(cid)) for cid in sorted(va.keys() | vb.keys())
              if va.get(cid) != vb.get(cid)]
    return Comparison(changes=changes, only_a=[ia[k] for k in sorted(ia.keys() - ib.keys())],
                      only_b=[ib[k] for k in sorted(ib.keys() - ia.keys())], claims=claims,
                      shared_claims=len(va.keys() & vb.keys()))


def _verdicts(record: RunRecord) -> dict[str, str]:
    """claim id -> outcome; a claim judged twice in one run (canary and plain) keeps its worst."""
    rank = ["pass", "n/a", "not evaluated", "warn", "fail"]
    out: dict[str, str] = {}
    for v in record.verdicts:
        cid, outcome = v.get("claim_id"), v.get("outcome")
        if not isinstance(cid, str) or not isinstance(outcome, str):
            continue
        if cid not in out or (rank.index(outcome) if outcome in rank else 0) > \
                (rank.index(out[cid]) if out[cid] in rank else 0):
            out[cid] = outcome
    return out


def table(comparison: Comparison) -> str:
    from tabulate import tabulate
    rows = []
    labels = comparison.labels()
    for c in comparison.changes:
        rows.append([c.metric, c.config or "-", labels[id(c)] or "-",
                     c.unit, c.direction, f"{c.median_a:.4g}", f"{c.median_b:.4g}", f"{c.ratio:.3f}",
                     "-" if c.p_value is None else f"{c.p_value:.2g}", f"{c.n_a}/{c.n_b}", c.verdict])
    return tabulate(rows, headers=["metric", "config", "params (that differ)", "unit", "better", "median A", "median B",
                                   "B/A", "p (MWU)", "n A/B", "change"], tablefmt="simple",
                    disable_numparse=True)


# --- the command ---------------------------------------------------------------------------------

def add_commands(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare two run records; exit 1 on a significant regression "
                              "or a claim that became FAIL, 2 when nothing is comparable",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("run_a", metavar="RUN_A.json", help="the baseline run record (with --against: the run to judge)")
    p.add_argument("run_b", metavar="RUN_B.json", nargs="?", help="the run to judge against it")
    p.add_argument("--against", choices=["previous"], default=None,
                   help="compare the one run given (RUN_A.json, the run to judge) with the last comparable "
                        "run before it: same cluster and target (see hpcnet history)")
    p.add_argument("--dir", type=Path, default=None, metavar="D",
                   help="where --against looks for runs (default: the given record's directory)")
    p.add_argument("--factor", type=float, default=DEFAULT_FACTOR,
                   help=f"a regression must be worse than this ratio of medians (default {DEFAULT_FACTOR})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"significance level of the Mann-Whitney U test (default {DEFAULT_ALPHA})")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON (same exit status)")
    p.set_defaults(func=_compare_command)


def _compare_command(args) -> int:
    from .results import load
    run_a, run_b = Path(args.run_a), args.run_b
    if args.against is not None:
        if run_b is not None:
            raise ConfigError("give one run with --against previous, not two", "--against")
        from .history import resolve_previous
        run_a, run_b = resolve_previous(run_a, args.dir, warn=lambda line: print(f"hpcnet compare: {line}",
                                                                                 file=sys.stderr)), run_a
        print(f"previous comparable run: {run_a}")
    elif run_b is None:
        raise ConfigError("give two run records, or one with --against previous", "compare")
    a, b = load(Path(run_a)), load(Path(run_b))
    result = compare(a, b, factor=args.factor, alpha=args.alpha)
    regressions, failures = result.regressions, result.new_failures
    status = 2 if not result.comparable else 1 if regressions or failures else 0
    if args.json:
        print(json.dumps(to_json(result, a, b, args.factor, args.alpha, status), indent=1, sort_keys=True))
        return status
    print(f"A = {a.run_id}   B = {b.run_id}   factor {args.factor:g}   alpha {args.alpha:g} (Mann-Whitney U, two-sided)")
    if result.changes:
        print(table(result))
    if result.claims:
        from tabulate import tabulate
        print()
        print(tabulate([[c.claim_id, (c.a or "-").upper(), (c.b or "-").upper(), "NEW FAIL" if c.became_fail else ""]
                        for c in result.claims], headers=["claim", "verdict A", "verdict B", ""],
                       tablefmt="simple", disable_numparse=True))
    if result.only_a or result.only_b:
        print(f"not compared: {len(result.only_a)} measurement(s) only in A, {len(result.only_b)} only in B")
    if not result.comparable:
        print(f"hpcnet compare: nothing to compare: the runs share no measurement (metric, config and params) "
              f"and no claim ({len(a.measurements)} measurement(s) in A, {len(b.measurements)} in B)",
              file=sys.stderr)
        return status
    if regressions:
        labels = result.labels()
        print(f"{len(regressions)} significant regression(s) beyond x{args.factor:g}: "
              + ", ".join(f"{c.metric}[{c.config}]" + (f" {labels[id(c)]}" if labels[id(c)] else "")
                          for c in regressions))
    if failures:
        print(f"{len(failures)} claim(s) now FAIL: " + ", ".join(f"{c.claim_id} (was {c.a or 'not judged'})"
                                                                 for c in failures))
    return status


def to_json(result: Comparison, a: RunRecord, b: RunRecord, factor: float, alpha: float, status: int) -> dict:
    """The comparison as ``hpcnet compare --json`` prints it."""
    labels = result.labels()

    def measured(m: Measurement) -> dict:
        return {"metric": m.metric, "config": m.config, "params": m.params, "label": label(m, [m]) +
                (f" {labels[id(m)]}" if labels[id(m)] else "")}
    changes = []
    for c in result.changes:
        d = asdict(c)
        d["verdict"] = c.verdict
        d["label"] = f"{c.metric}[{c.config}]" + (f" {labels[id(c)]}" if labels[id(c)] else "")
        if math.isinf(d["ratio"]):
            d["ratio"] = None
        changes.append(d)
    return {"a": a.run_id, "b": b.run_id, "factor": factor, "alpha": alpha, "exit_status": status,
            "comparable": result.comparable, "changes": changes,
            "regressions": [d["label"] for d, c in zip(changes, result.changes) if c.regression],
            "claims": [c.to_json() for c in result.claims], "shared_claims": result.shared_claims,
            "only_a": [measured(m) for m in result.only_a], "only_b": [measured(m) for m in result.only_b]}
