"""``hpcnet teragen|terasort|teravalidate|randomwriter|sort|sortvalidate``: the data tools by hand, with
Hadoop's argument order. They run in this process, or with ``--cluster SPEC`` (``local:N`` or an
inventory TOML) as jobs of the reference engine: a worker per node, started and stopped by the command
(``--config`` picks the engine configuration of terasort and sort, e.g. ``transport=shm``).

Exit status: 0 on success, 1 when a validation finds problems, 2 for bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ... import progress
from ...errors import ConfigError, HpcnetError

_HUMAN_ROWS = {"k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}   # Hadoop TeraGen's suffixes
_HUMAN_BYTES = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_count(text: str, suffixes: dict[str, int], where: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]?)\s*", text)
    if not m or (m.group(2) and m.group(2).lower() not in suffixes):
        raise ConfigError(f"{text!r} is not a whole number (optionally with a suffix "
                          f"{'/'.join(suffixes)})", where)
    return int(m.group(1)) * (suffixes[m.group(2).lower()] if m.group(2) else 1)


def parse_positive(text: str, where: str) -> int:
    value = parse_count(text, {}, where)
    if value < 1:
        raise ConfigError(f"must be at least 1, got {value}", where)
    return value


def _os_errors_as_hpcnet(func):
    """A missing or unreadable file is bad input too: one line, not a traceback."""
    @functools.wraps(func)
    def wrapper(args):
        try:
            return func(args)
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            raise HpcnetError(f"{where}{e.strerror or e}") from e
    return wrapper


@contextlib.contextmanager
def _engine(spec: str):
    """An engine on the cluster ``spec`` for one command; every worker is stopped afterwards."""
    from ...cluster import load_cluster
    from ...cluster.pool import Launchers
    from .engine.driver import Engine
    tmp = Path(tempfile.mkdtemp(prefix="hpcnet-cluster-"))
    try:
        cluster = load_cluster(spec, root=tmp / "cluster", where="--cluster")
        with Launchers(cluster, tmp / "logs") as launchers, Engine(cluster, launchers) as engine:
            yield engine
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _phases(result) -> str:
    return ", ".join(f"{k} {v:.2f} s" for k, v in result.phases.items())


@_os_errors_as_hpcnet
def cmd_teragen(args) -> int:
    from .teragen import teragen
    rows = parse_count(args.rows, _HUMAN_ROWS, "teragen ROWS")
    maps = parse_positive(args.maps, "--maps")
    start = parse_count(args.start, {}, "--start")
    t0 = time.perf_counter()
    if args.cluster:
        from .engine import jobs
        with _engine(args.cluster) as engine, \
                progress.bar(maps, desc="teragen", unit="map", show=args.progress) as advance:
            engine.on_event = progress.task_events(advance)
            checksum = jobs.teragen(engine, rows, args.outdir, maps=maps, start_row=start).details["checksum"]
    else:
        with progress.bar(rows, desc="teragen", unit="row", unit_scale=True, show=args.progress) as advance:
            checksum = teragen(rows, args.outdir, maps=maps, start_row=start, progress=advance).checksum_hex
    dt = time.perf_counter() - t0
    rate = f", {rows / dt:,.0f} rows/s" if dt > 0 and rows else ""
    print(f"teragen: {rows} rows ({rows * 100 / 1e6:.1f} MB) in {maps} files under {args.outdir} "
          f"in {dt:.2f} s{rate}; checksum {checksum}")
    return 0


@_os_errors_as_hpcnet
def cmd_terasort(args) -> int:
    from .terasort import terasort
    reduces = parse_positive(args.reduces, "--reduces")
    t0 = time.perf_counter()
    if args.cluster:
        from .engine import jobs
        with _engine(args.cluster) as engine, \
                progress.bar(None, desc="terasort tasks", unit="task", show=args.progress) as advance:
            engine.on_event = progress.task_events(advance)
            result = jobs.terasort(engine, args.indir, args.outdir, reduces=reduces, config=args.config)
        phases = f"{result.config}: {_phases(result)}"
    else:
        _no_config(args)
        from .records import input_files
        total = 2 * sum(f.stat().st_size for f in input_files(args.indir, "terasort INDIR"))
        with progress.bar(total or None, desc="terasort (map, then reduce)", unit="B", unit_scale=True,
                          show=args.progress) as advance:
            result = terasort(args.indir, args.outdir, reduces=reduces, progress=advance)
        phases = ", ".join(f"{k} {v:.2f} s" for k, v in result.phase_seconds.items())
    dt = time.perf_counter() - t0
    print(f"terasort: {result.records} records into {reduces} files under {args.outdir} in {dt:.2f} s "
          f"({phases})")
    return 0


@_os_errors_as_hpcnet
def cmd_teravalidate(args) -> int:
    from .teravalidate import is_valid_report, teravalidate
    if args.cluster:
        from .engine import jobs
        with _engine(args.cluster) as engine:
            lines = jobs.teravalidate(engine, args.outdir, args.reportdir).details["lines"]
    else:
        lines = teravalidate(args.outdir, args.reportdir)
    for line in lines:
        print(line)
    if not lines:
        print("teravalidate: no records in the input; the report is empty", file=sys.stderr)
        return 0
    return 0 if is_valid_report(lines) else 1


@_os_errors_as_hpcnet
def cmd_randomwriter(args) -> int:
    from .randomwriter import randomwriter
    total = parse_count(args.bytes, _HUMAN_BYTES, "--bytes")
    maps = parse_positive(args.maps, "--maps")
    seed = parse_count(args.seed, {}, "--seed")
    if args.cluster:
        from .engine import jobs
        with _engine(args.cluster) as engine:
            job = jobs.randomwriter(engine, args.outdir, total, maps=maps, seed=seed)
        records, nbytes = job.records, job.details["bytes"]
    else:
        result = randomwriter(args.outdir, total, maps=maps, seed=seed)
        records, nbytes = result.records, result.bytes
    print(f"randomwriter: {records} records, {nbytes} key+value bytes in {maps} files "
          f"under {args.outdir}")
    return 0


@_os_errors_as_hpcnet
def cmd_sort(args) -> int:
    from .sort import sort
    reduces = parse_positive(args.reduces, "--reduces")
    if args.cluster:
        from .engine import jobs
        with _engine(args.cluster) as engine:
            job = jobs.sort(engine, args.indir, args.outdir, reduces=reduces, config=args.config)
        print(f"sort: {job.records} records into {reduces} files under {args.outdir} in {job.seconds:.2f} s "
              f"({job.config}: {_phases(job)})")
        return 0
    _no_config(args)
    result = sort(args.indir, args.outdir, reduces=reduces)
    print(f"sort: {result.records} records into {reduces} files under {args.outdir}")
    return 0


@_os_errors_as_hpcnet
def cmd_sortvalidate(args) -> int:
    from .sortvalidate import sortvalidate
    result = sortvalidate(args.indir, args.outdir)
    for line in result.lines:
        print(line)
    return 0 if result.ok else 1


def _no_config(args) -> None:
    if args.config:
        raise ConfigError("an engine configuration needs --cluster (without it the job runs in this process)",
                          "--config")


def add_commands(subparsers) -> None:
    def add(name, func, help_text, engine_config=False, cluster=True):
        p = subparsers.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        if not cluster:     # sortvalidate: a single-process check only
            return p
        p.add_argument("--cluster", default=None, metavar="SPEC",
                       help="run as an engine job on this cluster: local:N or an inventory TOML "
                            "(default: in this process)")
        if engine_config:
            p.add_argument("--config", default="", metavar="CFG",
                           help="engine configuration with --cluster, e.g. transport=shm,intermediate=shared,"
                                "shuffle=direct (default transport=tcp,intermediate=local,shuffle=fetch)")
        return p

    p = add("teragen", cmd_teragen, "Generate TeraSort input, byte-identical to Hadoop's TeraGen.")
    progress.add_flags(p)
    p.add_argument("rows", metavar="ROWS", help="number of 100-byte rows; suffix k/m/b/t = 10^3/6/9/12")
    p.add_argument("outdir", metavar="OUTDIR", help="output directory (must not exist)")
    p.add_argument("--maps", default="1", metavar="M", help="number of map tasks / output files (default 1)")
    p.add_argument("--start", default="0", metavar="N", help="first row number (gensort -b; default 0)")

    p = add("terasort", cmd_terasort, "Sort TeraGen data with the sampled total-order partitioner.", True)
    progress.add_flags(p)
    p.add_argument("indir", metavar="INDIR")
    p.add_argument("outdir", metavar="OUTDIR", help="output directory (must not exist)")
    p.add_argument("--reduces", default="1", metavar="R", help="number of reduce tasks / output files")

    p = add("teravalidate", cmd_teravalidate, "Check TeraSort output; print and write the report.")
    p.add_argument("outdir", metavar="OUTDIR", help="the directory to validate")
    p.add_argument("reportdir", metavar="REPORTDIR", help="where to write part-r-00000 (must not exist)")

    p = add("randomwriter", cmd_randomwriter, "Write seeded random binary key/value records.")
    p.add_argument("outdir", metavar="OUTDIR", help="output directory (must not exist)")
    p.add_argument("--bytes", default="64m", metavar="B",
                   help="total key+value bytes; suffix k/m/g/t = KiB/MiB/GiB/TiB (default 64m)")
    p.add_argument("--maps", default="1", metavar="M", help="number of map tasks / output files")
    p.add_argument("--seed", default="0", metavar="S", help="random seed (default 0)")

    p = add("sort", cmd_sort, "Sort randomwriter data (hash-partitioned, each output file sorted).", True)
    p.add_argument("indir", metavar="INDIR")
    p.add_argument("outdir", metavar="OUTDIR", help="output directory (must not exist)")
    p.add_argument("--reduces", default="1", metavar="R", help="number of reduce tasks / output files")

    p = add("sortvalidate", cmd_sortvalidate, "Check that sort output holds exactly the input, sorted.",
            cluster=False)
    p.add_argument("indir", metavar="INDIR", help="the sort's input")
    p.add_argument("outdir", metavar="OUTDIR", help="the sort's output")


def build_parser() -> argparse.ArgumentParser:
    """A parser with only these commands (for tests and ``python -m``)."""
    parser = argparse.ArgumentParser(prog="hpcnet")
    add_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser
