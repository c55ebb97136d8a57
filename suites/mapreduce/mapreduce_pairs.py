"""Running a claim's baseline and candidate configurations side by side (shared by the suite's tests)."""

from __future__ import annotations

from pathlib import Path

from pytest_hpcnet.claims import Claim
from pytest_hpcnet.measure import Paired, Series
from pytest_hpcnet.workloads import mapreduce as wm

HERE = Path(__file__).resolve().parent
CLAIMS_FILE = HERE / "claims.toml"


def job_of(claim: Claim) -> str:
    """``mapreduce.terasort.phase.shuffle`` -> ``terasort``."""
    return claim.metric.split(".")[1]


def samples(metric: str, timer: wm.JobTimer, warmup: int) -> Series:
    """``metric`` (a job time or one phase) of ``timer``'s paired rounds after its warm-up calls."""
    parts = metric.split(".")
    kept = timer.results[warmup:]
    values = [r.seconds for r in kept] if parts[2] == "job_time" else [r.phases[parts[3]] for r in kept]
    return Series(wm.metric(timer.input.job, *parts[3:]), timer.config, values)


class PairRun:
    """Paired rounds of two configurations of one job; each claim on them gets its own ``Paired`` view,
    and a view asked for more rounds runs them on both timers (the other views see them too)."""

    def __init__(self, engine, measure, inp: wm.Input, baseline: str, candidate: str, scratch: Path, *,
                 reduces: int, maps: int | None = None, rounds: int | None = None, warmup: int = 1):
        self.base = wm.JobTimer(engine, inp, baseline, reduces, scratch, maps)
        self.cand = wm.JobTimer(engine, inp, candidate, reduces, scratch, maps)
        self.warmup = warmup
        self._measure = measure
        self._run = measure.paired((self.base.config, self.base), (self.cand.config, self.cand),
                                   rounds=rounds, warmup=warmup)

    def paired(self, metric: str) -> Paired:
        def current():
            return samples(metric, self.base, self.warmup), samples(metric, self.cand, self.warmup)

        def more(rounds: int):
            self._run.extend(rounds)
            b, c = current()
            return b.samples, c.samples
        b, c = current()
        if b.metric != metric:
            raise ValueError(f"{metric}: the job's timers measure {b.metric}")
        return Paired(b.config, c.config, b.samples, c.samples, metric=b.metric, more=more)

    def record(self) -> None:
        """Job time and phases of both configurations, every round taken (call after the claims)."""
        self._measure.record(*self.base.measurements(skip=self.warmup), *self.cand.measurements(skip=self.warmup))
