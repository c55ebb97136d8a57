"""How good each local gate's verdicts are, under the noise this project's runs really have.

For every local claim this replays its own verdict procedure (bounds, tolerance, warn band, first
rounds, adaptive rounds up to the run's budget) many times on synthetic runs whose noise is drawn from
recorded runs (the ``samples`` of each claim's verdicts in run records):

- per-round residuals: each recorded round's log quantity minus its run's median, pooled over runs and
  resampled, so heavy tails and outliers come along as they were measured;
- drift between runs: each synthetic run is offset by a recorded run's median minus the typical
  median (the median over runs), plus normal jitter of half their spread (so a few recorded runs
  still give a continuum of levels, at about the spread they showed);
- drift within a run: a linear trend whose slope is one of the recorded runs' least-squares slopes.

It reports, per claim: how often a run with no regression (called A/A, as the candidate performs as
recorded) fails or warns, and how often an injected regression of 10% and 20% (``claims.inject``, the
same injection as the canary) is caught as a fail.

    python -m pytest_hpcnet.gate_quality fixtures/gate-runs/*.json [--trials 400] [--seed 2026]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tabulate import tabulate

from .hostcpu import UNKNOWN
from .claims import Claim, Verdict, evaluate, load_claims, settle
from .measure import Paired, Series

REGRESSIONS = (0.0, 0.10, 0.20)
# What a gate must meet (the README's "Gates and their canary"): at most 1% false fails and 10% warns
# with no regression, and a 20% regression caught (FAIL) in at least 95% of runs.
MAX_AA_FAIL, MAX_AA_WARN, MIN_CAUGHT_20 = 0.01, 0.10, 0.95


@dataclass
class RecordedRun:
    """One claim's verdict samples from one recorded run."""

    baseline: np.ndarray | None
    candidate: np.ndarray
    first_rounds: int
    max_rounds: int
    cpu: str | None = None     # the CPU it ran on (provenance host_cpu; older records lack it)


def recorded_runs(paths: Iterable[Path]) -> dict[str, list[RecordedRun]]:
    """Per claim id, the samples its verdicts judged in each record (canary runs are left out)."""
    out: dict[str, list[RecordedRun]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        max_rounds = data.get("provenance", {}).get("max_rounds")
        cpu = data.get("provenance", {}).get("host_cpu")
        for d in data.get("verdicts", []):
            v = Verdict.from_json(d)
            if not v.samples or v.injected or v.outcome in ("n/a", "not evaluated"):
                continue
            base = v.samples.get("baseline")
            out.setdefault(v.claim_id, []).append(RecordedRun(
                None if base is None else np.asarray(base, float), np.asarray(v.samples["candidate"], float),
                v.first_rounds or v.n, max_rounds or 3 * (v.first_rounds or v.n), cpu))   # the session's rule
    return out


class NoiseModel:
    """Synthetic runs of one claim's paired rounds, with the recorded runs' noise and drift."""

    def __init__(self, claim: Claim, runs: list[RecordedRun]):
        if not runs:
            raise ValueError(f"claim {claim.id!r}: no recorded run to draw noise from")
        self.claim, self.runs = claim, runs
        self.counter = claim.zero_ok          # counters: resample recorded rounds as they were
        if self.counter:
            return
        logs = [np.log(r.candidate / r.baseline) if r.baseline is not None else np.log(r.candidate) for r in runs]
        medians = np.array([np.median(x) for x in logs])
        self.typical = float(np.median(medians))
        self.offsets = medians - self.typical
        self.spread = float(np.std(self.offsets, ddof=1)) if len(runs) > 1 else 0.0
        self.residuals = np.concatenate([x - np.median(x) for x in logs])
        self.slopes = np.array([np.polyfit(np.arange(x.size), x, 1)[0] if x.size > 2 else 0.0 for x in logs])

    def run(self, rng: np.random.Generator, first: int):
        """A function giving the next n rounds of one synthetic run as (baseline, candidate) arrays; the
        within-run trend is centred on the first ``first`` rounds, as the recorded medians are."""
        if self.counter:
            pool = self.runs[rng.integers(len(self.runs))]

            def rounds(start: int, n: int):
                idx = rng.integers(pool.candidate.size, size=n)
                return pool.baseline[idx], pool.candidate[idx]
            return rounds
        level = self.typical + self.offsets[rng.integers(self.offsets.size)] + rng.normal(0, self.spread / 2)
        slope = self.slopes[rng.integers(self.slopes.size)]

        def rounds(start: int, n: int):
            i = np.arange(start, start + n)
            log_q = level + slope * (i - (first - 1) / 2) + rng.choice(self.residuals, size=n)
            return np.ones(n), np.exp(log_q)
        return rounds


def _trial(claim: Claim, model: NoiseModel, regression: float, first: int, budget: int,
           rng: np.random.Generator, resamples: int) -> str:
    draw = model.run(rng, first)
    base, cand = (list(a) for a in draw(0, first))

    def more(n: int):
        b, c = draw(len(base), n)
        base.extend(b)
        cand.extend(c)
        return list(base), list(cand)
    paired = Paired(claim.baseline or "-", claim.candidate, list(base), list(cand), metric=claim.metric, more=more)
    if claim.kind == "absolute":
        return evaluate(claim, None, Series(claim.metric, claim.candidate, cand), inject_regression=regression,
                        resamples=resamples).outcome
    return settle(claim, paired, max_rounds=budget, inject_regression=regression, resamples=resamples).outcome


def per_cpu(claim: Claim, runs: list[RecordedRun], cpus: Iterable[str] | None = None
            ) -> list[tuple[str | None, Claim, list[RecordedRun]]]:
    """(CPU, the claim as judged there, the runs recorded there) for each CPU ``claim.hosts`` records
    a bound for (or each of ``cpus``); (None, claim, runs) for a claim whose bound is the same everywhere."""
    if claim.hosts is None:
        return [(None, claim, runs)]
    return [(cpu, claim.on_host(cpu), [r for r in runs if (r.cpu or UNKNOWN) == cpu])
            for cpu in (claim.hosts if cpus is None else cpus)]


def quality(claim: Claim, runs: list[RecordedRun], *, trials: int = 400, seed: int = 2026,
            resamples: int = 1000) -> dict:
    """Rates of fail and warn per injected regression for one claim, at its recorded rounds and budget."""
    model = NoiseModel(claim, runs)
    first = int(np.median([r.first_rounds for r in runs]))
    budget = int(np.median([r.max_rounds for r in runs]))
    rng = np.random.default_rng(seed)
    out = {"claim_id": claim.id, "enforced": claim.enforced, "rounds": first, "max_rounds": budget,
           "recorded_runs": len(runs)}
    for regression in REGRESSIONS:
        outcomes = [_trial(claim, model, regression, first, budget, rng, resamples) for _ in range(trials)]
        key = f"{regression:.0%}"
        out[key] = {o: outcomes.count(o) / trials for o in ("pass", "warn", "fail")}
    return out


def proposed_bound(claim: Claim, runs: list[RecordedRun]) -> Claim:
    """The claim with its bad-side bound halfway (in log terms) between its typical value in the recorded
    runs and that value 20% worse, no tolerance and no warn band: the bound a 20% gate would need."""
    model = NoiseModel(claim, runs)
    if model.counter:
        return claim
    q0 = float(np.exp(model.typical))                  # typical candidate/baseline (or candidate) ratio
    worse = q0 * 1.1 if claim.direction == ("higher" if claim.kind == "reduction" else "lower") else q0 / 1.1
    bound = 1.0 - worse if claim.kind == "reduction" else worse
    side = "min" if claim.direction == "higher" else "max"
    return replace(claim, **{side: round(bound, 3)}, tolerance=0.0, warn=0.0)


def meets_the_bar(row: dict) -> list[str]:
    """What an enforced gate's figures fall short of (empty when it meets every target)."""
    problems = []
    if row["0%"]["fail"] > MAX_AA_FAIL:
        problems.append(f"A/A false fails {row['0%']['fail']:.1%} > {MAX_AA_FAIL:.0%}")
    if row["0%"]["warn"] > MAX_AA_WARN:
        problems.append(f"A/A warns {row['0%']['warn']:.1%} > {MAX_AA_WARN:.0%}")
    if row["20%"]["fail"] < MIN_CAUGHT_20:
        problems.append(f"20% regression caught {row['20%']['fail']:.1%} < {MIN_CAUGHT_20:.0%}")
    return problems


def table(rows: list[dict]) -> str:
    body = [[r["claim_id"], r.get("cpu") or "any", r.get("bound", ""), "gate" if r["enforced"] else "report-only", r["recorded_runs"],
             f"{r['rounds']}..{r['max_rounds']}", f"{r['0%']['fail']:.1%}", f"{r['0%']['warn']:.1%}",
             f"{r['10%']['fail']:.1%}", f"{r['20%']['fail']:.1%}"] for r in rows]
    return tabulate(body, headers=["claim", "CPU", "bound", "kind", "runs", "rounds", "A/A fail", "A/A warn", "10% caught",
                                   "20% caught"], tablefmt="github", disable_numparse=True)


def keep(records: Iterable[Path], into: Path) -> None:
    """Copies of run records holding only what the noise model reads: provenance and local verdicts."""
    into.mkdir(parents=True, exist_ok=True)
    for path in records:
        data = json.loads(Path(path).read_text())
        verdicts = [v for v in data.get("verdicts", []) if str(v.get("source", "")).startswith("local:")
                    and v.get("samples") and not v.get("injected")]
        if verdicts:
            slim = {"run_id": data.get("run_id"), "provenance": data.get("provenance", {}), "verdicts": verdicts}
            (into / Path(path).name).write_text(json.dumps(slim, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_hpcnet.gate_quality", description=__doc__.split("\n")[0])
    parser.add_argument("records", nargs="+", type=Path, help="run records (JSON) with the claims' verdicts")
    parser.add_argument("--claims", nargs="*", type=Path, default=None,
                        help="claims files (default: suites/*/claims.toml under the current directory)")
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--propose", action="store_true",
                        help="judge each claim with the bound a 20%% gate would need (halfway to 20%% worse "
                             "than its typical value), to see whether this machine can support one")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="also write each record, cut to its provenance and its local claims' verdicts, "
                             "into DIR (how fixtures/gate-runs/ is made)")
    args = parser.parse_args(argv)
    claims = load_claims(args.claims if args.claims is not None else sorted(Path.cwd().glob("suites/*/claims.toml")))
    runs = recorded_runs(args.records)
    if args.keep is not None:
        keep(args.records, args.keep)
    rows, missing = [], []
    for claim in sorted((c for c in claims.values() if c.is_local), key=lambda c: c.id):
        recorded = runs.get(claim.id, [])
        # proposing: a bound for every CPU the records come from, which is how a new host gets one
        cpus = sorted({r.cpu or UNKNOWN for r in recorded}) if args.propose and claim.hosts else None
        for cpu, judged, mine in per_cpu(claim, recorded, cpus):
            where = f" on {cpu}" if cpu else ""
            if len(mine) < 2:
                missing.append(f"{claim.id}{where}: {len(mine)} recorded run(s) in the records given, 2 needed")
                continue
            judged = proposed_bound(judged, mine) if args.propose else judged
            row = quality(judged, mine, trials=args.trials, seed=args.seed)
            row["bound"], row["cpu"] = judged.bound_text(), cpu
            rows.append(row)
    print(table(rows))
    short = {(r["claim_id"], r["cpu"]): meets_the_bar(r) for r in rows if r["enforced"]}
    for (cid, cpu), problems in short.items():
        if problems:
            print(f"{cid}{f' on {cpu}' if cpu else ''}: {'; '.join(problems)}")
    for line in missing:
        print(line)
    return 1 if any(short.values()) or missing else 0


if __name__ == "__main__":
    sys.exit(main())
