"""The crosscheck report: the runs' per-job records in one table, per configuration the median and
spread (max - min) of elapsedTime and vcoreSeconds, then for each configuration against the first the
median paired ratio (round i of B over round i of A) with a bootstrap confidence interval
(``measure.ratio_ci``) and Welch's t-test on the logarithms of the two samples. A difference is called
significant when both agree: p < 0.05 and the interval excludes 1.

Why a t-test on logs and not the rank test ``hpcnet compare`` uses: crosschecks repeat expensive jobs
2-5 times, and with 3 runs per side a two-sided Mann-Whitney p can never go below 0.1; job times are
close to log-normal, so a t-test on their logs has power at such small n. With 2 rounds the bootstrap
interval is just the two ratios, so the t-test is what keeps two lucky rounds from being a verdict.

The runs are ``workloads.crosscheck.Run``s of any target's records (fields as YARN names them).
"""

from __future__ import annotations

import re
import statistics

import numpy as np
from tabulate import tabulate

from ..measure import ratio_ci

ALPHA = 0.05
METRICS = ("elapsedTime", "vcoreSeconds")

# One verdict line as ``judge`` writes it, for whoever reads the report back (a vendor CI, the tests).
VERDICT = re.compile(
    r"(?P<candidate>.+) vs (?P<baseline>.+): (?P<metric>\w+) \d+% (?:higher|lower), "
    r"(?P<word>SIGNIFICANT|not significant) \(paired ratio (?P<ratio>[\d.]+), "
    r"95% CI \[(?P<lo>[\d.]+), (?P<hi>[\d.]+)\] over (?P<n>\d+) rounds; Welch t-test on logs p=(?P<p>[\d.e+-]+)\)")


def read_verdict(line: str) -> dict | None:
    """A verdict line's fields, numbers as floats, and whether its word agrees with its numbers
    (``consistent``); None for a line that is not a verdict."""
    m = VERDICT.fullmatch(line.strip())
    if m is None:
        return None
    v = {k: m[k] for k in ("candidate", "baseline", "metric")}
    v.update({k: float(m[k]) for k in ("ratio", "lo", "hi", "p")}, n=int(m["n"]), significant=m["word"] == "SIGNIFICANT")
    # The line rounds p and the interval, so a figure on the boundary agrees with either word.
    if v["significant"]:
        v["consistent"] = v["p"] <= ALPHA and (v["lo"] >= 1.0 or v["hi"] <= 1.0)
    else:
        v["consistent"] = v["p"] >= ALPHA or v["lo"] <= 1.0 <= v["hi"]
    return v


def summarize(runs: list, configs: list[str]) -> list[dict]:
    out = []
    for c in configs:
        el = [r.record.elapsedTime for r in runs if r.config == c]
        vc = [r.record.vcoreSeconds for r in runs if r.config == c]
        out.append({"config": c, "runs": len(el), "elapsed_median_ms": statistics.median(el),
                    "elapsed_spread_ms": max(el) - min(el), "vcore_median_s": statistics.median(vc),
                    "vcore_spread_s": max(vc) - min(vc),
                    "succeeded": sum(r.record.finalStatus == "SUCCEEDED" for r in runs if r.config == c)})
    return out


def judge(runs: list, baseline: str, candidate: str, metric: str = "elapsedTime") -> dict:
    """Paired-ratio CI (candidate/baseline, by round) and Welch's t-test on the logs of one metric."""
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
        from scipy import stats     # here, not at the top: a second's import for every `hpcnet` command
        p = float(stats.ttest_ind(np.log(b), np.log(c), equal_var=False).pvalue)
    significant = bool(p < ALPHA and (ci.lo > 1.0 or ci.hi < 1.0))
    direction = "higher" if ci.ratio > 1 else "lower"
    verdict = (f"{candidate} vs {baseline}: {metric} {abs(ci.ratio - 1) * 100:.0f}% {direction}, "
               f"{'SIGNIFICANT' if significant else 'not significant'} (paired ratio {ci.ratio:.3f}, "
               f"95% CI [{ci.lo:.3f}, {ci.hi:.3f}] over {ci.n} rounds; Welch t-test on logs p={p:.3g})")
    return {"metric": metric, "baseline": baseline, "candidate": candidate, "ratio": ci.ratio, "lo": ci.lo,
            "hi": ci.hi, "p": p, "significant": significant, "verdict": verdict}


def render(runs: list, summary: list[dict], verdicts: list[dict]) -> str:
    table = tabulate([[r.config, r.round, r.record.id, r.record.state, r.record.finalStatus,
                       r.record.elapsedTime, r.record.vcoreSeconds,
                       "-" if r.record.memorySeconds is None else r.record.memorySeconds] for r in runs],
                     headers=["config", "round", "id", "state", "finalStatus", "elapsedTime (ms)",
                              "vcoreSeconds", "memorySeconds"])
    per_config = tabulate([[s["config"], s["runs"], s["succeeded"], s["elapsed_median_ms"],
                            s["elapsed_spread_ms"], s["vcore_median_s"], s["vcore_spread_s"]] for s in summary],
                          headers=["config", "runs", "succeeded", "elapsed median (ms)", "elapsed spread (ms)",
                                   "vcoreSeconds median", "vcoreSeconds spread"])
    return "\n\n".join([table, per_config, "\n".join(v["verdict"] for v in verdicts)]) + "\n"


def judge_all(runs, configs: list[str]) -> list[dict]:
    """Every configuration after the first against the first, on both metrics."""
    return [judge(runs, configs[0], c, m) for c in configs[1:] for m in METRICS]


def report(runs, configs: list[str]) -> tuple[str, bool]:
    """The rendered report, and whether every run succeeded."""
    summary = summarize(runs, configs)
    return render(runs, summary, judge_all(runs, configs)), all(s["succeeded"] == s["runs"] for s in summary)
