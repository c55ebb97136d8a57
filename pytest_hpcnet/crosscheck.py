"""``hpcnet crosscheck``: the same job on a target under two or more configurations, repeated, judged.

    hpcnet crosscheck --target reference --config transport=tcp --config transport=shm --repeat 3 -- terasort 10M
    hpcnet crosscheck --target hadoop --config default --config uber=off --repeat 3 -- teragen 1G

Thin wiring: the target's ``crosscheck`` workload runs the jobs interleaved (``workloads.crosscheck``)
and ``report.crosscheck`` prints the per-job records, the per-configuration medians and the paired
verdicts. Any target whose workloads offer ``crosscheck`` (a per-job record) can be crosschecked; one
without it is refused, naming what it lacks, before anything starts.

Jobs: ``teragen SIZE`` and ``terasort SIZE`` (input generated once, untimed). SIZE is rows, or bytes
with a k/M/G/T suffix (decimal, as Hadoop's TeraGen docs use: 1G = 10^9 bytes = 10^7 rows).

The reference runs on ``--cluster`` (default ``local:2``). Hadoop runs on a MiniCluster started for
the command and stopped after it, or, with ``--conf-dir`` (a real cluster's HADOOP_CONF_DIR, or a
running MiniCluster's), on that cluster.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path

from .errors import ConfigError
from .report.crosscheck import report
from .workloads.crosscheck import JOBS, Run

_SIZE = re.compile(r"^(\d+)([kKmMgGtT]?)$")
_UNITS = {"": None, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
RECORD = 100


def parse_rows(text: str, where: str = "SIZE") -> int:
    m = _SIZE.match(text.strip())
    if not m:
        raise ConfigError(f"{text!r} is not a row count or a size like 100k, 1G", where)
    n, unit = int(m.group(1)), _UNITS[m.group(2).lower()]
    rows = n if unit is None else n * unit // RECORD
    if rows < 1:
        raise ConfigError(f"{text!r} is less than one 100-byte row", where)
    return rows


def parse_job(argv: list[str]) -> tuple[str, int]:
    if len(argv) != 2 or argv[0] not in JOBS:
        raise ConfigError(f"expected `-- {{{'|'.join(JOBS)}}} SIZE`, got {' '.join(argv) or 'nothing'!r}",
                          "crosscheck job")
    return argv[0], parse_rows(argv[1], f"{argv[0]} SIZE")


def _workloads(target, args, cluster, launchers, root: Path):
    """The target's workloads, refused in one line when they offer no crosscheck; on ``--conf-dir``,
    attached to that running cluster."""
    workloads = target.workloads(cluster, launchers, root / "target")
    if not workloads.offers("crosscheck"):
        raise ConfigError(str(workloads.missing("crosscheck", "it keeps no per-job record")), "--target")
    if args.conf_dir is not None:
        attach = getattr(workloads, "attach", None)
        if attach is None:
            raise ConfigError(f"target {target.name!r} runs on --cluster, not on a running cluster's "
                              "configuration", "--conf-dir")
        attach(args.conf_dir, args.rm_web)
    return workloads


def _print_run(r: Run) -> None:
    print(f"  {r.config} round {r.round}: {r.record.id} {r.record.finalStatus} {r.record.elapsedTime} ms", flush=True)


def crosscheck_command(args: argparse.Namespace) -> int:
    from . import cluster
    from .targets import load_target
    from .workloads.crosscheck import check_plan
    job = parse_job(args.job[1:] if args.job[:1] == ["--"] else args.job)
    target = load_target(args.target, "--target")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="hpcnet-crosscheck-"))
    try:
        with cluster.open(args.cluster, root, where="--cluster") as (built, launchers):
            workloads = _workloads(target, args, built, launchers, root)
            try:
                for c in args.config:
                    workloads.check_config(c)          # bad names fail before any engine or cluster starts
                check_plan(args.config, args.repeat)
                print(f"crosscheck on {target.name}: {job[0]} {job[1]} rows, {len(args.config)} configurations "
                      f"x {args.repeat} rounds", flush=True)
                runs = workloads.crosscheck(args.config, args.repeat, job, keep_output=args.keep_output,
                                            progress=_print_run)
            finally:
                workloads.close()
    finally:
        if not args.workdir:          # ours to remove: the throwaway cluster's files and the job data
            shutil.rmtree(root, ignore_errors=True)
    text, succeeded = report(runs, args.config)
    print(text, end="")
    return 0 if succeeded else 1


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("crosscheck", help="run one job on a target under several configurations, repeated, "
                              "and judge the difference from the per-job records")
    p.add_argument("--target", default="hadoop", help="the stack to run on (default: hadoop)")
    p.add_argument("--config", action="append", required=True,
                   help="a named configuration of the target (Hadoop also takes -Dkey=value[,-Dkey=value]); "
                   "give 2 or more")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cluster", default="local:2", help="the cluster the reference runs on (as --hpcnet-cluster)")
    p.add_argument("--conf-dir", help="Hadoop: client configuration dir of a running cluster "
                   "(default: start a MiniCluster)")
    p.add_argument("--rm-web", help="Hadoop: ResourceManager web address, for REST app records")
    p.add_argument("--workdir", help="where the cluster and the jobs keep their files (default: a temporary dir, "
                   "removed after)")
    p.add_argument("--keep-output", action="store_true",
                   help="leave each run's output in place (default: remove it after the run)")
    p.add_argument("job", nargs=argparse.REMAINDER, help="-- teragen|terasort SIZE")
    p.set_defaults(func=crosscheck_command)
