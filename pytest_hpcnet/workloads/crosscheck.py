"""The crosscheck workload: one job under two or more configurations of a target, repeated, interleaved.

Runs go A B A B ... so drift (a warming page cache, a neighbour's load) hits every configuration alike.
Each run is kept as its target's per-job record (``targets.JobRecord``: YARN's application record on
Hadoop, the engine's own on the reference); ``pytest_hpcnet.report.crosscheck`` judges them.

Written against a ``targets.Workloads`` object (duck-typed: nothing here imports the targets, which
import the workloads): its ``teragen``/``terasort`` take ``config=``, ``job_record(result)`` gives the
record and ``scratch()``/``discard(path)`` place and remove the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

JOBS = ("teragen", "terasort")


@dataclass
class Run:
    config: str
    round: int
    record: object            # targets.JobRecord (or yarn.AppRecord, the same fields)
    wall_s: float


def check_plan(configs: list[str], repeat: int) -> None:
    if len(configs) < 2:
        raise ConfigError("give at least two --config to compare", "--config")
    if len(set(configs)) != len(configs):
        raise ConfigError(f"each configuration once, got {', '.join(configs)}", "--config")
    if repeat < 2:
        raise ConfigError(f"need at least 2 repeats to judge a difference, got {repeat}", "--repeat")


def run_crosscheck(workloads, configs: list[str], repeat: int, job: tuple[str, int], *, maps: int = 2,
                   reduces: int = 2, keep_output: bool = False, progress=None) -> list[Run]:
    """``repeat`` rounds of ``job`` (kind, rows) under every configuration; TeraSort's input is
    generated once, untimed, and every run's output removed after its record is read (unless
    ``keep_output``)."""
    check_plan(configs, repeat)
    kind, rows = job
    if kind not in JOBS:
        raise ConfigError(f"crosscheck runs {' or '.join(JOBS)}, not {kind!r}", "crosscheck job")
    for config in configs:
        workloads.check_config(config)            # a bad name fails before any job runs
    scratch = workloads.scratch()
    indir = scratch.path("input")
    if kind == "terasort":
        workloads.teragen(rows, indir, maps=maps)
    runs = []
    try:
        for r in range(repeat):
            for i, config in enumerate(configs):
                out = scratch.path(f"run-{r}-{i}")
                if kind == "teragen":
                    result = workloads.teragen(rows, out, maps=maps, config=config)
                else:
                    result = workloads.terasort(indir, out, reduces=reduces, config=config)
                runs.append(Run(config, r, workloads.job_record(result), result.seconds))
                if not keep_output:
                    workloads.discard(out)
                if progress:
                    progress(runs[-1])
    finally:
        if not keep_output:
            if kind == "terasort":
                workloads.discard(indir)
            scratch.cleanup()
    return runs
