"""Running a claim's baseline and candidate configurations side by side (shared by the suite's tests)."""

from __future__ import annotations

from pathlib import Path

from pytest_hpcnet.claims import Claim
from pytest_hpcnet.workloads import mapreduce as wm

HERE = Path(__file__).resolve().parent
CLAIMS_FILE = HERE / "claims.toml"


def job_of(claim: Claim) -> str:
    """``mapreduce.terasort.phase.shuffle`` -> ``terasort``."""
    return claim.metric.split(".")[1]


def samples(claim: Claim, timer: wm.JobTimer, warmup: int) -> list[float]:
    """The claim's metric from each paired round of ``timer`` (after its warm-up calls)."""
    parts = claim.metric.split(".")
    if parts[2] == "job_time":
        return [r.seconds for r in timer.results[warmup:]]
    return [r.phases[parts[3]] for r in timer.results[warmup:]]


def run_pair(engine, measure, inp: wm.Input, baseline: str, candidate: str, scratch: Path, *,
             reduces: int, maps: int | None = None, rounds: int | None = None, warmup: int = 1):
    """Paired rounds of two configurations; records job time + phases of both; returns the timers."""
    base = wm.JobTimer(engine, inp, baseline, reduces, scratch, maps)
    cand = wm.JobTimer(engine, inp, candidate, reduces, scratch, maps)
    measure.paired((base.config, base), (cand.config, cand), rounds=rounds, warmup=warmup)
    measure.record(*base.measurements(skip=warmup), *cand.measurements(skip=warmup))
    return base, cand
