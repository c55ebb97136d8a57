"""``hpcnet report RUN.json [-o DIR] [-q | -v]``: show a recorded run and write its HTML report.
``hpcnet plot cdf FILE LABEL ... [-o OUT]``: the QJump paper's Figure 1c from ``.bs`` files (``cdf``).

Prints the measurement and verdict tables, compact (``-v``: full, ``-q``: left out), writes ``DIR/<run id>.html``
(``DIR`` defaults to the directory holding the record) and prints the HTML file's path last.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..results import load
from .terminal import fabric_table, measurements_table, verdicts_table


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("report", help="print a run record's tables and write its HTML report")
    p.add_argument("record", type=Path, help="a run record, e.g. .hpcnet/<run>.json")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="DIR",
                   help="directory for <run id>.html (default: the record's directory)")
    level = p.add_mutually_exclusive_group()
    level.add_argument("-q", "--quiet", action="store_true", help="do not print the tables, only the HTML path")
    level.add_argument("-v", "--verbose", action="store_true",
                       help="full tables: every configuration key, each value's distribution, each claim's "
                            "statement and source")
    p.set_defaults(func=_report)

    p = subparsers.add_parser("plot", help="draw figures from raw result files")
    psub = p.add_subparsers(dest="plot_kind", required=True, metavar="KIND")
    cdf = psub.add_parser("cdf", help="CDF of barrier-sync latency from .bs files (QJump Figure 1c)")
    cdf.add_argument("pairs", nargs="+", metavar="FILE LABEL", help="FILE LABEL pairs, optionally then OUT")
    cdf.add_argument("-o", "--output", default=None, help="image to write (default qjump-cdf.png)")
    cdf.set_defaults(func=_plot_cdf)


def _plot_cdf(args) -> int:
    from .cdf import plot_command   # matplotlib loads only when a plot is drawn
    return plot_command(args)


def _report(args) -> int:
    if args.record.exists() and not args.record.is_file():
        raise ConfigError("not a run record (a directory)", str(args.record))
    record = load(args.record)
    out = args.output if args.output is not None else args.record.parent
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{str(out)!r} is not a directory", "-o")
    if not args.quiet:
        prov = record.provenance
        git = prov.get("git", {})
        print(f"run {record.run_id}  host {prov.get('host')}  cluster {prov.get('cluster', {}).get('source')}  "
              f"target {prov.get('target', {}).get('name')}  commit {(git.get('commit') or '-')[:12]}"
              f"{' (dirty)' if git.get('dirty') else ''}")
        tables = "full" if args.verbose else "compact"
        if record.measurements:
            print(measurements_table(record.measurements, tables))
        if record.verdicts:
            print()
            print(verdicts_table(record.verdicts, tables))
            if fabric := fabric_table(record.verdicts):
                print("\nfabric ceilings (native tools beside each RDMA claim):")
                print(fabric)
    from .html import write_html   # matplotlib loads only when a report is drawn
    try:
        path = write_html(record, out)
    except OSError as e:
        raise ConfigError(f"cannot write the HTML report into {str(out)!r}: {e.strerror or e}", "-o") from None
    print(f"wrote {path}")
    return 0
