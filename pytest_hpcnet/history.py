"""Past runs from a directory of run records: ``hpcnet history`` and ``compare --against previous``.

``hpcnet history [--dir D]`` lists the runs (date, cluster, target, project commit, verdict counts),
oldest first; ``hpcnet history CLAIM_ID`` shows one claim across them (value, CI, verdict, bound), and
``--html FILE`` draws that series on a page with the same table. A file in the directory that is not a
run record is named in one line on stderr and left out; the other runs are still shown.

Comparable runs are those of the same cluster (named as ``hpcnet asv-import`` names its machine: the
inventory's name, a ``local:N`` cluster with its host) and the same target (stack name); the previous
comparable run of a record is the newest such run older than it.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .asv_import import machine_name
from .errors import ConfigError
from .results import RunRecord, load

OUTCOMES = ("pass", "warn", "fail", "n/a", "not evaluated")


@dataclass
class PastRun:
    path: Path
    record: RunRecord
    when: datetime | None

    @property
    def prov(self) -> dict:
        return self.record.provenance

    @property
    def cluster(self) -> str:
        return machine_name(self.prov)

    @property
    def target(self) -> str:
        return str((self.prov.get("target") or {}).get("name") or "-")

    @property
    def target_text(self) -> str:
        t = self.prov.get("target") or {}
        return f"{t.get('name', '-')} {t.get('version', '')}".strip()

    @property
    def commit(self) -> str:
        git = self.prov.get("git") or {}
        return ((git.get("commit") or "-")[:12]) + (" (dirty)" if git.get("dirty") else "")

    @property
    def date(self) -> str:
        return self.when.strftime("%Y-%m-%d %H:%M:%S") if self.when else "-"

    def comparable(self, other: "PastRun") -> bool:
        return (self.cluster, self.target) == (other.cluster, other.target)

    def counts(self) -> str:
        c = Counter(v.get("outcome") for v in self.record.verdicts if not v.get("injected"))
        return ", ".join(f"{c[o]} {o}" for o in OUTCOMES if c[o]) or "no claims"


def _when(record: RunRecord) -> datetime | None:
    try:
        when = datetime.fromisoformat(record.provenance.get("time"))
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _order(run: PastRun):
    return (run.when or datetime.min.replace(tzinfo=timezone.utc), run.record.run_id)


def past_run(path: Path) -> PastRun:
    record = load(path)
    return PastRun(path=Path(path), record=record, when=_when(record))


def load_runs(directory: Path, warn=None) -> list[PastRun]:
    """Every run record in ``directory``, oldest first. A file that is not one is reported through
    ``warn`` (one line each) and left out."""
    directory = Path(directory)
    if not directory.exists():
        raise ConfigError("no such directory", str(directory))
    if not directory.is_dir():
        raise ConfigError("not a directory", str(directory))
    runs = []
    for path in sorted(directory.glob("*.json")):
        try:
            runs.append(past_run(path))
        except ConfigError as e:
            if warn:
                warn(f"skipped {e}")
    return sorted(runs, key=_order)


def previous(runs: list[PastRun], this: PastRun) -> PastRun | None:
    """The newest run older than ``this`` of the same cluster and target (None when there is none)."""
    older = [r for r in runs if r.comparable(this) and r.record.run_id != this.record.run_id
             and r.path.resolve() != this.path.resolve() and _order(r) < _order(this)]
    return older[-1] if older else None


def resolve_previous(run: Path, directory: Path | None, warn=None) -> Path:
    """The record that ``hpcnet compare RUN --against previous`` compares ``run`` with."""
    this = past_run(run)
    directory = Path(directory) if directory is not None else this.path.parent
    found = previous(load_runs(directory, warn), this)
    if found is None:
        raise ConfigError(f"no earlier run of cluster {this.cluster} and target {this.target} in {directory}",
                          "--against previous")
    return found.path


def runs_table(runs: list[PastRun]) -> str:
    from tabulate import tabulate
    rows = [[r.date, r.cluster, r.target_text, r.commit, r.counts(), r.record.run_id] for r in runs]
    return tabulate(rows, headers=["date (UTC)", "cluster", "target", "commit", "verdicts", "run"],
                    tablefmt="simple", disable_numparse=True)


@dataclass
class Point:
    run: PastRun
    verdict: dict


def claim_series(runs: list[PastRun], claim_id: str) -> list[Point]:
    """One point per run that judged ``claim_id`` (its first verdict that is not a canary's)."""
    points = []
    for run in runs:
        for v in run.record.verdicts:
            if v.get("claim_id") == claim_id and not v.get("injected"):
                points.append(Point(run, v))
                break
    if not points:
        known = sorted({v.get("claim_id") for r in runs for v in r.record.verdicts if v.get("claim_id")})
        hint = f" (claims in these runs: {', '.join(known[:8])}{', ...' if len(known) > 8 else ''})" if known \
            else " (these runs judged no claims)"
        raise ConfigError(f"no run judged claim {claim_id!r}{hint}", "CLAIM_ID")
    return points


def _num(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def series_rows(points: list[Point]) -> list[list[str]]:
    rows = []
    for p in points:
        v, ci = p.verdict, p.verdict.get("ci")
        rows.append([p.run.date, p.run.cluster, p.run.target_text, p.run.commit, _num(v.get("quantity")),
                     f"[{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "-", str(v.get("outcome", "-")).upper(),
                     str(v.get("bound", "-"))])
    return rows


SERIES_HEADERS = ["date (UTC)", "cluster", "target", "commit", "value", "CI", "verdict", "bound"]


def series_table(points: list[Point]) -> str:
    from tabulate import tabulate
    return tabulate(series_rows(points), headers=SERIES_HEADERS, tablefmt="simple", disable_numparse=True)


# --- the command ---------------------------------------------------------------------------------

def add_commands(subparsers) -> None:
    p = subparsers.add_parser("history", help="list past runs, or one claim across them",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("claim", nargs="?", metavar="CLAIM_ID", help="show this claim across the runs")
    p.add_argument("--dir", type=Path, default=Path(".hpcnet"), metavar="D",
                   help="directory of run records (default .hpcnet)")
    p.add_argument("--cluster", default=None, help="only runs of this cluster (as the list names it)")
    p.add_argument("--target", default=None, help="only runs of this target (stack name)")
    p.add_argument("--html", type=Path, default=None, metavar="FILE",
                   help="with CLAIM_ID: also write the series as an HTML page with a chart")
    p.set_defaults(func=_history_command)


def _warn(line: str) -> None:
    print(f"hpcnet history: {line}", file=sys.stderr)


def _history_command(args) -> int:
    if args.html is not None and args.claim is None:
        raise ConfigError("--html draws one claim's series: give CLAIM_ID", "--html")
    runs = [r for r in load_runs(args.dir, _warn)
            if (args.cluster is None or r.cluster == args.cluster) and (args.target is None or r.target == args.target)]
    if args.claim is None:
        if not runs:
            print(f"no run records in {args.dir}")
            return 0
        print(runs_table(runs))
        return 0
    points = claim_series(runs, args.claim)
    print(f"claim {args.claim}: {points[-1].verdict.get('statement') or ''}".rstrip(": "))
    print(series_table(points))
    if args.html is not None:
        from .report.series import write_series_html
        print(f"wrote {write_series_html(args.claim, points, SERIES_HEADERS, series_rows(points), args.html)}")
    return 0
