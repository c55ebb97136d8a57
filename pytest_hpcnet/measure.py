"""Measurements: paired, interleaved rounds of a baseline and a candidate, and their statistics."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Literal, NamedTuple

import numpy as np

Direction = Literal["lower", "higher"]  # which way is better for the metric


@dataclass
class Measurement:
    """One metric of one workload under one configuration, with every sample it was computed from."""

    metric: str              # dotted name claims refer to, e.g. "rpc.echo.latency"
    value: float             # the headline figure (median of samples unless said otherwise)
    unit: str                # "us", "s", "MB/s", "calls/s", ...
    direction: Direction
    samples: list[float] = field(default_factory=list)
    config: str = ""         # named configuration, e.g. "transport=tcp"
    nodes: tuple[str, ...] = ()
    params: dict = field(default_factory=dict)   # workload parameters, e.g. {"size": 64}
    stats: dict = field(default_factory=dict)    # summary statistics (see ``summarize``)
    test: str | None = None  # pytest node id, filled in by the plugin

    def to_json(self) -> dict:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Measurement":
        d = dict(d)
        d["nodes"] = tuple(d.get("nodes", ()))
        return cls(**d)


# --- statistics ----------------------------------------------------------------------------------
#
# Defaults the plugin uses for a paired comparison. How well each real gate does at its own rounds,
# under the noise of recorded runs, is measured by ``pytest_hpcnet.gate_quality`` (and held to its
# targets by tests/test_gate_quality.py); claims with few rounds get an exact interval instead of the
# bootstrap (see ``median_interval``).
DEFAULT_ROUNDS = 30
DEFAULT_WARMUP = 1
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 2000


def _as_samples(samples: Iterable[float], what: str = "samples") -> np.ndarray:
    """Samples as a 1-d float array; empty, non-numeric or non-finite input is a ValueError."""
    try:
        arr = np.asarray(list(samples), dtype=float)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: not a sequence of numbers ({e})") from None
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a flat sequence of numbers, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{what}: no samples (cannot summarize an empty sequence)")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: contains NaN or infinity")
    return arr


def summarize(samples: Iterable[float]) -> dict:
    """perftest/sockperf-style summary: n, min, median, mean, stdev, p99, p99_9, max.

    ``stdev`` is the sample standard deviation (ddof=1; 0.0 for a single sample). Percentiles use
    numpy's default linear interpolation between order statistics.
    """
    arr = _as_samples(samples)
    p99, p99_9 = np.percentile(arr, [99.0, 99.9])
    return {
        "n": int(arr.size),
        "min": float(arr.min()),
        "median": float(np.median(arr)),
        "mean": float(arr.mean()),
        "stdev": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
        "p99": float(p99),
        "p99_9": float(p99_9),
        "max": float(arr.max()),
    }


def measurement(metric: str, samples: Iterable[float], *, unit: str, direction: Direction,
                config: str, nodes: Iterable[str] = (), params: dict | None = None) -> Measurement:
    """A ``Measurement`` whose value is the median of ``samples`` and whose stats are ``summarize``'s."""
    if direction not in ("lower", "higher"):
        raise ValueError(f"{metric}: direction must be 'lower' or 'higher', got {direction!r}")
    arr = _as_samples(samples, metric)
    stats = summarize(arr)
    return Measurement(metric=metric, value=stats["median"], unit=unit, direction=direction,
                       samples=[float(x) for x in arr], config=config, nodes=tuple(nodes),
                       params=dict(params or {}), stats=stats)


# --- paired, interleaved measurement -------------------------------------------------------------

@dataclass
class Paired:
    """Samples of a baseline and a candidate taken in the same rounds; index i of each is round i.

    ``metric`` names what the samples measure, so a claim can check it is judging what it states.
    ``more``, when set, runs that many further paired rounds and returns the whole (baseline,
    candidate) sample lists; claims use it to settle a verdict whose interval straddles a bound.
    """

    baseline_name: str
    candidate_name: str
    baseline: list[float]
    candidate: list[float]
    metric: str = ""
    more: Callable[[int], tuple[list[float], list[float]]] | None = field(default=None, compare=False,
                                                                          repr=False)

    def __post_init__(self):
        if len(self.baseline) != len(self.candidate):
            raise ValueError(f"paired samples differ in length: {self.baseline_name} has "
                             f"{len(self.baseline)}, {self.candidate_name} has {len(self.candidate)}")

    @property
    def rounds(self) -> int:
        return len(self.baseline)

    def extend(self, rounds: int) -> None:
        """Take ``rounds`` more paired rounds (needs ``more``)."""
        if self.more is None:
            raise ValueError(f"{self.metric or 'these samples'}: no way to take more rounds")
        base, cand = self.more(rounds)
        self.baseline, self.candidate = list(base), list(cand)
        self.__post_init__()

    def sides(self) -> tuple["Series", "Series"]:
        """The baseline and candidate as named series of the metric (what ``claims.evaluate`` takes)."""
        return (Series(self.metric, self.baseline_name, self.baseline),
                Series(self.metric, self.candidate_name, self.candidate))


class Series(NamedTuple):
    """Samples of one metric under one named configuration: what one side of a claim is judged on."""

    metric: str
    config: str
    samples: list[float]


def _sample(fn: Callable[[], float], name: str, when: str) -> float:
    value = fn()
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} ({when}) returned {value!r}, not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{name} ({when}) returned {x}, not a finite number")
    return x


def abba(rounds: int, start: int = 0) -> list[bool]:
    """For each round from ``start``, whether it runs in forward order: A B, B A, A B, ...

    Sweeps over several configurations use the same rule (forward order, then reversed), so drift in
    the machine's state falls on every configuration equally instead of favouring the first.
    """
    return [r % 2 == 0 for r in range(start, start + rounds)]


def floor_round(baseline: Callable[[], float], candidate: Callable[[], float], turns: int,
                round_index: int) -> tuple[float, float]:
    """One paired round of two timed calls taking turns ``turns`` times (A B, B A, ... as ``abba``
    from ``round_index``): each side's smallest sample, the one nothing interrupted."""
    best = [math.inf, math.inf]
    sides = (baseline, candidate)
    for forward in abba(turns, round_index):
        for i in ((0, 1) if forward else (1, 0)):
            best[i] = min(best[i], sides[i]())
    return best[0], best[1]


def shares(rounds: int, parts: int) -> list[int]:
    """``rounds`` split as evenly as can be into at most ``parts`` non-empty shares (first ones larger)."""
    return [s for s in (rounds // parts + (i < rounds % parts) for i in range(parts)) if s]


def paired_in_processes(take: Callable[..., list[tuple[float, float]]], args: tuple, *, rounds: int,
                        processes: int, baseline_name: str, candidate_name: str, metric: str) -> Paired:
    """Paired rounds taken in ``processes`` fresh processes, one after the other, in equal shares:
    ``take(start, count, *args)`` runs ``count`` rounds (numbered from ``start``) in a spawned process
    and returns their (baseline, candidate) pairs; it must be importable by name. ``more`` takes
    further rounds the same way.

    Why fresh processes: some costs are a state of the process, kept for its life -- where its memory
    landed, what its heap has grown to -- so rounds from one process are one draw of that state."""
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    base: list[float] = []
    cand: list[float] = []

    def more(n: int) -> tuple[list[float], list[float]]:
        for count in shares(n, processes):
            with context.Pool(1) as pool:
                pairs = pool.apply(take, (len(base), count, *args))
            for b, c in pairs:
                base.append(b)
                cand.append(c)
        return list(base), list(cand)

    more(rounds)
    return Paired(baseline_name, candidate_name, list(base), list(cand), metric=metric, more=more)


@contextlib.contextmanager
def on_one_core() -> Iterator[int | None]:
    """Runs the calling thread, and every thread it starts meanwhile, on one CPU; yields that CPU.

    Why: a round trip between two threads on two CPUs is their work plus two wake-ups, and a wake-up's
    cost depends on the machine's state, not the code: an idle CPU must leave its sleep state (on a
    virtual machine a halted vCPU, 30-40 us here, more than a native call), a loaded one must first be
    given up by a neighbour. So the same two designs measured 0.56 and 0.41 apart on one box, idle and
    loaded. With both ends on one CPU, the CPU is never idle inside a call (one end runs while the
    other waits) and a call is the CPU work of both ends plus their context switches; a neighbour's
    time slice falls on whole calls, which the per-round median passes over. Threads started inside
    keep the CPU after the block; the caller's own affinity is restored. Where the platform cannot
    pin (no ``sched_setaffinity``), it yields None and runs unpinned.
    """
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    allowed = os.sched_getaffinity(0)
    cpu = max(allowed)
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, allowed)


def run_paired(baseline: Callable[[], float], candidate: Callable[[], float], *,
               rounds: int = DEFAULT_ROUNDS, warmup: int = DEFAULT_WARMUP,
               baseline_name: str = "baseline", candidate_name: str = "candidate",
               metric: str = "") -> Paired:
    """Measure two configurations side by side.

    Each side first runs ``warmup`` times (results discarded; caches, JIT, connection set-up), then
    ``rounds`` rounds each take one sample of both sides. Which side goes first alternates per round
    (A B, B A, A B, ...) so a drift in the machine's state (thermal, page cache, a neighbour's load)
    falls on both sides equally instead of always favouring the side that runs first. The result's
    ``more`` continues the same alternation.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 2:
        raise ValueError(f"rounds must be an integer >= 2 (a ratio needs paired rounds), got {rounds!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    for i in range(warmup):
        _sample(baseline, baseline_name, f"warm-up {i}")
        _sample(candidate, candidate_name, f"warm-up {i}")
    base: list[float] = []
    cand: list[float] = []

    def more(n: int) -> tuple[list[float], list[float]]:
        start = len(base)
        for r, forward in zip(range(start, start + n), abba(n, start)):
            if forward:
                base.append(_sample(baseline, baseline_name, f"round {r}"))
                cand.append(_sample(candidate, candidate_name, f"round {r}"))
            else:
                cand.append(_sample(candidate, candidate_name, f"round {r}"))
                base.append(_sample(baseline, baseline_name, f"round {r}"))
        return list(base), list(cand)

    more(rounds)
    return Paired(baseline_name, candidate_name, list(base), list(cand), metric=metric, more=more)


# --- confidence intervals of a median ------------------------------------------------------------
#
# With 10 or more rounds the interval is a percentile bootstrap. Below that the bootstrap's real
# coverage falls far short of its nominal level (the bootstrap of 3 values is just [min, max], which
# covers the median about 75% of the time, not 95%), so few rounds get the exact order-statistic
# interval instead, with the coverage it really has.
MIN_BOOTSTRAP_ROUNDS = 10


class RatioCI(NamedTuple):
    """Median of per-round ratios candidate/baseline and its confidence interval."""

    ratio: float
    lo: float
    hi: float
    n: int
    coverage: float = DEFAULT_CONFIDENCE   # the interval's confidence level (exact below 10 rounds)


def _stats():
    """scipy.stats, imported when first needed: it takes most of a second, and the node programs that
    import this module for its timing helpers (``on_one_core``, ``abba``) never compute an interval."""
    from scipy import stats
    return stats


def _bootstrap_rng_arg() -> str:
    """scipy >= 1.15 names the generator argument ``rng``; older releases call it ``random_state``."""
    return "rng" if "rng" in inspect.signature(_stats().bootstrap).parameters else "random_state"


def order_statistic_ci(samples: Iterable[float], confidence: float = DEFAULT_CONFIDENCE
                       ) -> tuple[float, float, float, float]:
    """(median, lo, hi, coverage): the exact distribution-free interval [x(k), x(n+1-k)] for the median.

    Picks the narrowest such interval whose coverage, 1 - 2 * P(Binomial(n, 1/2) < k), reaches
    ``confidence``; when even [min, max] falls short (n < 6 at 95%), returns [min, max] with the
    coverage it has, so a reader sees the interval is weaker than asked.
    """
    arr = np.sort(_as_samples(samples))
    n = arr.size
    point = float(np.median(arr))
    stats = _stats()
    best = 1
    for k in range(1, n // 2 + 1):
        if 1.0 - 2.0 * stats.binom.cdf(k - 1, n, 0.5) >= confidence:
            best = k
        else:
            break
    coverage = float(1.0 - 2.0 * stats.binom.cdf(best - 1, n, 0.5))
    return point, float(arr[best - 1]), float(arr[n - best]), coverage


def median_interval(samples: Iterable[float], *, confidence: float = DEFAULT_CONFIDENCE,
                    resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> tuple[float, float, float, float]:
    """(median, lo, hi, coverage): bootstrap from ``MIN_BOOTSTRAP_ROUNDS`` samples, exact below."""
    arr = _as_samples(samples)
    if arr.size < 2:
        raise ValueError(f"a confidence interval needs at least 2 samples, got {arr.size}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError(f"resamples must be an integer >= 100, got {resamples!r}")
    if arr.size < MIN_BOOTSTRAP_ROUNDS:
        return order_statistic_ci(arr, confidence)
    point = float(np.median(arr))
    if np.all(arr == arr[0]):
        return point, point, point, confidence     # no spread: every resample has the same median
    res = _stats().bootstrap((arr,), np.median, n_resamples=resamples, confidence_level=confidence,
                          method="percentile", vectorized=True,
                          **{_bootstrap_rng_arg(): np.random.default_rng(seed)})
    ci = res.confidence_interval
    return point, float(ci.low), float(ci.high), confidence


def median_ci(samples: Iterable[float], *, confidence: float = DEFAULT_CONFIDENCE,
              resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """(median, lo, hi): ``median_interval`` without its coverage.

    Uses ``scipy.stats.bootstrap`` (percentile method, vectorised statistic, seeded numpy
    Generator) from ``MIN_BOOTSTRAP_ROUNDS`` samples up. Needs >= 2 samples.
    """
    return median_interval(samples, confidence=confidence, resamples=resamples, seed=seed)[:3]


def paired_ratios(baseline: Iterable[float], candidate: Iterable[float]) -> np.ndarray:
    """candidate_i / baseline_i per round; lengths must match and baselines must be non-zero."""
    b = _as_samples(baseline, "baseline samples")
    c = _as_samples(candidate, "candidate samples")
    if b.size != c.size:
        raise ValueError(f"paired samples differ in length: baseline {b.size}, candidate {c.size}")
    if np.any(b == 0):
        raise ValueError(f"baseline sample is zero in round(s) {np.flatnonzero(b == 0).tolist()}; "
                         "a ratio to it is undefined")
    return c / b


def ratio_ci(baseline: Iterable[float], candidate: Iterable[float], *,
             confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
             seed: int = 0) -> RatioCI:
    """Median paired ratio candidate/baseline with its CI over rounds (``median_interval``).

    Pairing happens before resampling: each round's ratio is one observation, so drift shared by
    both sides of a round cancels, and the bootstrap resamples whole rounds.
    """
    ratios = paired_ratios(baseline, candidate)
    point, lo, hi, coverage = median_interval(ratios, confidence=confidence, resamples=resamples, seed=seed)
    return RatioCI(point, lo, hi, int(ratios.size), coverage)
