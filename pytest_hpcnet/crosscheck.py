"""``hpcnet crosscheck``: the same Hadoop job under two or more configurations, repeated, judged.

    hpcnet crosscheck --target hadoop --config default --config uber=off --repeat 3 -- teragen 1G

Runs are interleaved (A B A B ...) so drift hits every configuration alike. Each run's YARN
application record (id, state, finalStatus, elapsedTime, vcoreSeconds, memorySeconds) goes in one
table; per configuration the median and spread (max - min) of elapsedTime and vcoreSeconds; then for
each configuration against the first: the median paired ratio (round i of B over round i of A) with a
bootstrap confidence interval (``measure.ratio_ci``), and Welch's t-test on the logarithms of the two
samples. The difference is called significant when both agree: p < 0.05 and the interval excludes 1.

Why a t-test on logs and not the rank test ``hpcnet compare`` uses: crosschecks repeat expensive jobs
2-5 times, and with 3 runs per side a two-sided Mann-Whitney p can never go below 0.1; job times are
close to log-normal, so a t-test on their logs has power at such small n. With 2 rounds the bootstrap
interval is just the two ratios, so the t-test is what keeps two lucky rounds from being a verdict.

Jobs: ``teragen SIZE`` and ``terasort SIZE`` (input generated once, untimed). SIZE is rows, or bytes
with a k/M/G/T suffix (decimal, as Hadoop's TeraGen docs use: 1G = 10^9 bytes = 10^7 rows).

Without ``--conf-dir`` a MiniCluster is started for the command and stopped after it; with it (a
real cluster's HADOOP_CONF_DIR, or a running MiniCluster's) the jobs go there.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats
from tabulate import tabulate

from .errors import ConfigError
from .measure import ratio_ci

JOBS = ("teragen", "terasort")
_SIZE = re.compile(r"^(\d+)([kKmMgGtT]?)$")
_UNITS = {"": None, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
RECORD = 100
ALPHA = 0.05


@dataclass
class Run:
    config: str
    round: int
    record: object            # yarn.AppRecord
    wall_s: float


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


def run_crosscheck(rt, target, configs: list[str], repeat: int, job: tuple[str, int], *, conf_dir,
                   rm_web: str | None = None, base: str = "/hpcnet-crosscheck", maps: int = 2,
                   reduces: int = 2, keep_output: bool = False, progress=None) -> list[Run]:
    from .targets.hadoop import jobs, yarn
    if len(configs) < 2:
        raise ConfigError("give at least two --config to compare", "--config")
    if repeat < 2:
        raise ConfigError(f"need at least 2 repeats to judge a difference, got {repeat}", "--repeat")
    defines = {c: target.defines(c) for c in configs}
    kind, rows = job
    indir = f"{base}/input"
    if kind == "terasort":
        jobs.teragen(rt, rows, indir, maps=maps, conf_dir=conf_dir)
    runs = []
    for r in range(repeat):
        for i, config in enumerate(configs):
            out = f"{base}/run-{r}-{i}"
            if kind == "teragen":
                res = jobs.teragen(rt, rows, out, maps=maps, conf_dir=conf_dir, defines=defines[config])
            else:
                res = jobs.terasort(rt, indir, out, reduces=reduces, conf_dir=conf_dir,
                                    defines=defines[config])
            if len(res.app_ids) != 1:
                raise ConfigError(f"expected one YARN application per run, the client printed "
                                  f"{res.app_ids or 'none'} (is mapreduce.framework.name yarn?)", config)
            record = yarn.app_records(rt, res.app_ids, rm_web=rm_web, conf_dir=conf_dir)[0]
            runs.append(Run(config, r, record, res.wall_s))
            if not keep_output:
                jobs.run_program(rt, "fs", ["-rm", "-r", "-f", "-skipTrash", out], conf_dir=conf_dir, check=False)
            if progress:
                progress(runs[-1])
    return runs


def summarize(runs: list[Run], configs: list[str]) -> list[dict]:
    out = []
    for c in configs:
        el = [r.record.elapsedTime for r in runs if r.config == c]
        vc = [r.record.vcoreSeconds for r in runs if r.config == c]
        out.append({"config": c, "runs": len(el), "elapsed_median_ms": statistics.median(el),
                    "elapsed_spread_ms": max(el) - min(el), "vcore_median_s": statistics.median(vc),
                    "vcore_spread_s": max(vc) - min(vc),
                    "succeeded": sum(r.record.finalStatus == "SUCCEEDED" for r in runs if r.config == c)})
    return out


def judge(runs: list[Run], baseline: str, candidate: str, metric: str = "elapsedTime") -> dict:
    """Paired-ratio CI (candidate/baseline, by round) and Mann-Whitney p of one metric."""
    def samples(c):
        return [float(getattr(r.record, metric)) for r in sorted(runs, key=lambda r: r.round) if r.config == c]
    b, c = samples(baseline), samples(candidate)
    if min(b + c) <= 0:
        return {"metric": metric, "baseline": baseline, "candidate": candidate, "significant": False,
                "ratio": float("nan"), "lo": float("nan"), "hi": float("nan"), "p": float("nan"),
                "verdict": f"{metric}: baseline has a zero sample, no ratio"}
    ci = ratio_ci(b, c)
    if np.ptp(np.log(b)) == 0 and np.ptp(np.log(c)) == 0:
        p = 0.0 if b[0] != c[0] else 1.0        # no spread at all: the t statistic is undefined
    else:
        p = float(stats.ttest_ind(np.log(b), np.log(c), equal_var=False).pvalue)
    significant = bool(p < ALPHA and (ci.lo > 1.0 or ci.hi < 1.0))
    direction = "higher" if ci.ratio > 1 else "lower"
    verdict = (f"{candidate} vs {baseline}: {metric} {abs(ci.ratio - 1) * 100:.0f}% {direction}, "
               f"{'SIGNIFICANT' if significant else 'not significant'} (paired ratio {ci.ratio:.3f}, "
               f"95% CI [{ci.lo:.3f}, {ci.hi:.3f}] over {ci.n} rounds; Welch t-test on logs p={p:.3g})")
    return {"metric": metric, "baseline": baseline, "candidate": candidate, "ratio": ci.ratio, "lo": ci.lo,
            "hi": ci.hi, "p": p, "significant": significant, "verdict": verdict}


def render(runs: list[Run], summary: list[dict], verdicts: list[dict]) -> str:
    table = tabulate([[r.config, r.round, r.record.id, r.record.state, r.record.finalStatus,
                       r.record.elapsedTime, r.record.vcoreSeconds, r.record.memorySeconds] for r in runs],
                     headers=["config", "round", "id", "state", "finalStatus", "elapsedTime (ms)",
                              "vcoreSeconds", "memorySeconds"])
    per_config = tabulate([[s["config"], s["runs"], s["succeeded"], s["elapsed_median_ms"],
                            s["elapsed_spread_ms"], s["vcore_median_s"], s["vcore_spread_s"]] for s in summary],
                          headers=["config", "runs", "succeeded", "elapsed median (ms)", "elapsed spread (ms)",
                                   "vcoreSeconds median", "vcoreSeconds spread"])
    return "\n\n".join([table, per_config, "\n".join(v["verdict"] for v in verdicts)]) + "\n"


def crosscheck_command(args: argparse.Namespace) -> int:
    from .targets import load_target
    job = parse_job(args.job[1:] if args.job[:1] == ["--"] else args.job)
    target = load_target(args.target, "--target")
    if not hasattr(target, "runtime"):
        raise ConfigError(f"target {args.target!r} runs no external jobs; crosscheck drives Hadoop", "--target")
    for c in args.config:
        target.defines(c)                      # bad names fail before any cluster starts
    rt = target.runtime()
    mc = None
    try:
        conf_dir, rm_web = args.conf_dir, args.rm_web
        if conf_dir is None:
            from .targets.hadoop.minicluster import MiniCluster
            workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hpcnet-crosscheck-"))
            print(f"starting a MiniCluster in {workdir} ...", flush=True)
            mc = MiniCluster(rt, workdir, nodemanagers=args.nodemanagers, datanodes=args.nodemanagers).start()
            conf_dir, rm_web = mc.conf_dir, mc.rm_web
        runs = run_crosscheck(rt, target, args.config, args.repeat, job, conf_dir=conf_dir, rm_web=rm_web,
                              keep_output=args.keep_output,
                              progress=lambda r: print(f"  {r.config} round {r.round}: {r.record.id} "
                                                       f"{r.record.finalStatus} {r.record.elapsedTime} ms",
                                                       flush=True))
    finally:
        if mc is not None:
            mc.stop()
            if not args.workdir:          # ours to remove: HDFS blocks and logs of a throwaway cluster
                shutil.rmtree(mc.workdir, ignore_errors=True)
    summary = summarize(runs, args.config)
    verdicts = [judge(runs, args.config[0], c, m) for c in args.config[1:] for m in ("elapsedTime", "vcoreSeconds")]
    print(render(runs, summary, verdicts), end="")
    return 0 if all(s["succeeded"] == s["runs"] for s in summary) else 1


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("crosscheck", help="run one Hadoop job under several configurations, repeated, "
                              "and judge the difference from YARN's application records")
    p.add_argument("--target", default="hadoop")
    p.add_argument("--config", action="append", required=True,
                   help="a named configuration of the target, or -Dkey=value[,-Dkey=value]; give 2 or more")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--conf-dir", help="client configuration dir of a running cluster (default: start a MiniCluster)")
    p.add_argument("--rm-web", help="ResourceManager web address, for REST app records")
    p.add_argument("--workdir", help="where the MiniCluster keeps its files")
    p.add_argument("--nodemanagers", type=int, default=2)
    p.add_argument("--keep-output", action="store_true",
                   help="leave each run's output in place (default: remove it after the run)")
    p.add_argument("job", nargs=argparse.REMAINDER, help="-- teragen|terasort SIZE")
    p.set_defaults(func=crosscheck_command)
