"""``hpcnet report RUN.json``: show a recorded run's measurements and verdicts."""

from __future__ import annotations

from pathlib import Path

from ..results import load
from .terminal import measurements_table, verdicts_table


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("report", help="print a run record's measurements and claim verdicts")
    p.add_argument("record", type=Path, help="a run record, e.g. .hpcnet/<run>.json")
    p.set_defaults(func=_report)


def _report(args) -> int:
    if not args.record.is_file():
        print(f"hpcnet report: no such run record: {args.record}")
        return 2
    record = load(args.record)
    prov = record.provenance
    git = prov.get("git", {})
    print(f"run {record.run_id}  host {prov.get('host')}  cluster {prov.get('cluster', {}).get('source')}  "
          f"target {prov.get('target', {}).get('name')}  commit {(git.get('commit') or '-')[:12]}"
          f"{' (dirty)' if git.get('dirty') else ''}")
    if record.measurements:
        print(measurements_table(record.measurements))
    if record.verdicts:
        print()
        print(verdicts_table(record.verdicts))
    return 0
