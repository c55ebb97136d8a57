"""MapReduce workloads on the reference engine: generate input once, then time jobs per configuration.

A ``JobTimer`` is what paired measurement calls: each call runs one job (TeraSort or Sort) under one
named configuration into a fresh output dir, checks the job's record count, deletes the output, and
returns the job's wall time in seconds; it keeps every ``JobResult`` so ``measurements()`` can report
the job time and its phase breakdown (sample / map / shuffle / reduce) as ``Measurement``s.

Metrics: ``mapreduce.<job>.job_time`` (s, lower is better) -- the metric the claims name -- and
``mapreduce.<job>.phase.<phase>`` (s) for each phase.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HpcnetError
from ..measure import Measurement, abba, measurement
from ..reference.mapreduce.engine import jobs
from ..reference.mapreduce.engine.config import parse_config
from ..reference.mapreduce.engine.driver import Engine, JobResult

JOBS = ("terasort", "sort")


def metric(job: str, phase: str | None = None) -> str:
    return f"mapreduce.{job}.job_time" if phase is None else f"mapreduce.{job}.phase.{phase}"


@dataclass
class Input:
    job: str
    path: Path
    records: int
    bytes: int
    checksum: str | None = None     # TeraGen's checksum (terasort input)


def prepare_input(engine: Engine, job: str, root: Path, *, rows: int = 200_000, sort_bytes: int = 8 << 20,
                  maps: int | None = None) -> Input:
    """Input for ``job`` under ``root`` (which every node can reach): TeraGen rows for terasort,
    RandomWriter bytes for sort; one file per node unless ``maps`` says otherwise."""
    if job not in JOBS:
        raise HpcnetError(f"unknown mapreduce job {job!r}; choose one of {', '.join(JOBS)}")
    maps = maps or len(engine.workers)
    path = Path(tempfile.mkdtemp(prefix=f"{job}-input-", dir=root)) / "in"
    if job == "terasort":
        r = jobs.teragen(engine, rows, path, maps=maps)
        return Input(job, path, r.records, r.records * 100, r.details["checksum"])
    r = jobs.randomwriter(engine, path, sort_bytes, maps=maps, seed=1)
    return Input(job, path, r.records, r.details["bytes"])


@dataclass
class JobTimer:
    """One configuration's job, callable for paired rounds; returns seconds per call."""

    engine: Engine
    input: Input
    config: str
    reduces: int
    scratch: Path
    maps: int | None = None
    results: list[JobResult] = field(default_factory=list)

    def __post_init__(self):
        self.config = parse_config(self.config, "JobTimer config").name

    def __call__(self) -> float:
        out = Path(tempfile.mkdtemp(prefix="out-", dir=self.scratch)) / "out"
        try:
            if self.input.job == "terasort":
                result = jobs.terasort(self.engine, self.input.path, out, self.reduces, self.config, self.maps)
            else:
                result = jobs.sort(self.engine, self.input.path, out, self.reduces, self.config)
            if result.records != self.input.records:
                raise HpcnetError(f"{self.input.job} under {self.config} wrote {result.records} records, "
                                  f"its input has {self.input.records}")
        finally:
            shutil.rmtree(out.parent, ignore_errors=True)
        self.results.append(result)
        return result.seconds

    def measurements(self, skip: int = 0) -> list[Measurement]:
        """Job time and each phase over the calls after the first ``skip`` (warm-up)."""
        kept = self.results[skip:]
        if not kept:
            raise HpcnetError(f"no {self.input.job} runs under {self.config} to report")
        nodes = tuple(self.engine.workers)
        params = {"records": self.input.records, "bytes": self.input.bytes, "reduces": self.reduces,
                  "maps": kept[0].details.get("maps"), "nodes": len(nodes)}
        out = [measurement(metric(self.input.job), [r.seconds for r in kept], unit="s", direction="lower",
                           config=self.config, nodes=nodes, params=params)]
        for phase in kept[0].phases:
            out.append(measurement(metric(self.input.job, phase), [r.phases[phase] for r in kept], unit="s",
                                   direction="lower", config=self.config, nodes=nodes, params=params))
        return out


def run_configs(engine: Engine, inp: Input, configs: list[str], *, rounds: int = 3, reduces: int | None = None,
                scratch: Path, warmup: int = 1) -> dict[str, JobTimer]:
    """Each config ``warmup + rounds`` times, forward then reversed (A B C, C B A, ...); timers by name."""
    reduces = reduces or len(engine.workers)
    timers = {c: JobTimer(engine, inp, c, reduces, scratch) for c in configs}
    for forward in abba(warmup + rounds):
        for timer in (list(timers.values()) if forward else list(timers.values())[::-1]):
            timer()
    return timers


# --- the reduce-side merge alone, native against Python (issue 17) ------------------------------------

MERGE_METRIC = "mapreduce.terasort.merge.floor"   # per round, each side's cheapest of MERGE_TRIES merges (CPU s)
MERGE_TRIES = 3
# 400k records (40 MB in 16 runs): merges of 100k (2.5 ms native) moved by a sd of 0.09-0.13 (log) per
# round on the 2-core box, merges of 400k (11 ms native, 42 ms numpy) by 0.03 (2026-12-04, 30 rounds)
MERGE_RECORDS = 400_000
MERGE_RUNS = 16
MERGE_PROCESSES = 6


def merge_input(records: int = MERGE_RECORDS, runs: int = MERGE_RUNS, seed: int = 17) -> list:
    """Key-sorted runs of random 100-byte records, as a reduce gets them from its maps."""
    import numpy as np
    from ..reference.mapreduce.records import sort_records
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(records, 100), dtype=np.uint8)
    return [np.ascontiguousarray(sort_records(part)) for part in np.array_split(data, runs)]


def merge_once(impl: str, runs: list):
    """A call that merges ``runs`` once the way ``impl``'s reduce does and returns the merge's cost in
    this thread's CPU seconds: its own work, which the job time buries under fetch and write (the core
    merges in the calling thread, GIL released). CPU time, since on a loaded 2-core box a merge of
    11-42 ms is preempted now and then: wall-clock rounds beside two busy loops scattered by 20-38%
    (log sd), CPU-time ones by 3-10%.

    numpy's ``merge_runs`` concatenates, argsorts and gathers into arrays it allocates, as the Python
    reduce does. The core merges into one output buffer, allocated and touched once here: its reduce
    streams onto a file and allocates nothing per record. (A fresh output buffer per merge, as before
    2026-12-04, timed the page faults of 40 MB, which move with the process's memory state: the ratio
    was 0.38 with them and 0.26 without, and its rounds scattered half again as much.)"""
    import time

    import numpy as np
    from ..reference import native
    from ..reference.mapreduce.engine.worker import merge_runs
    flat = [r.reshape(-1) for r in runs]
    out = np.zeros(sum(r.size for r in flat), dtype=np.uint8) if impl == "native" else None

    def once() -> float:
        t0 = time.thread_time()
        if impl == "native":
            native.core.merge_records_into(flat, out)
        else:
            merge_runs(runs)
        return time.thread_time() - t0
    return once


def merge_timer(impl: str, runs: list):
    """``merge_once``'s call, made MERGE_TRIES times: the cheapest (for paired rounds in one process)."""
    once = merge_once(impl, runs)
    return lambda: min(once() for _ in range(MERGE_TRIES))


def interleaved_merge_cost(*, rounds: int, processes: int = MERGE_PROCESSES, records: int = MERGE_RECORDS):
    """Paired rounds of numpy's merge (baseline ``impl=python``) and the core's (``impl=native``) on the
    same runs: per round, each side's cheapest of MERGE_TRIES merges taken in turns (A B, B A, ...), in
    CPU seconds; the rounds are spread over ``processes`` fresh processes, one after the other.

    Why fresh processes: what numpy's allocations cost depends on the state of the process's heap. The
    same merges measured 0.262-0.266 native/numpy in fresh pytest processes and 0.281 at the end of a
    pytest process that had run the suites' other performance tests first. ``more`` takes further
    rounds in new processes (for the claim's adaptive rounds)."""
    from ..measure import paired_in_processes
    return paired_in_processes(_merge_rounds, (records,), rounds=rounds, processes=processes,
                               baseline_name="impl=python", candidate_name="impl=native", metric=MERGE_METRIC)


def _merge_rounds(start: int, rounds: int, records: int) -> list[tuple[float, float]]:
    """``rounds`` paired rounds in this process (see ``interleaved_merge_cost``), after one warm-up merge
    of each side."""
    from ..measure import floor_round
    runs = merge_input(records)
    numpy_side, native_side = merge_once("python", runs), merge_once("native", runs)
    numpy_side()
    native_side()
    return [floor_round(numpy_side, native_side, MERGE_TRIES, r) for r in range(start, start + rounds)]
