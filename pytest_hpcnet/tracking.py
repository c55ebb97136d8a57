"""A claim's quantity as a number for which lower is better, so that a history tool's "regression" (an
upward step, asv's only notion of one) means the claim got worse.

The forms, for a claim's quantity q (``claims.evaluate``: a ratio is candidate / baseline, a reduction
is 1 - candidate / baseline, an absolute claim's quantity is the candidate's median):

    kind       better   form            tracked value   unit
    ratio      lower    ratio           q               ratio C / B
    ratio      higher   inverse_ratio   1 / q           ratio B / C
    reduction  lower    reduction       q               reduction 1 - C / B
    reduction  higher   ratio           1 - q           ratio C / B
    absolute   lower    value           q               <metric>
    absolute   higher   inverse_value   1 / q           1/<metric>

Each form is monotone in q, so a confidence interval and a bound map through it too (the decreasing
forms swap an interval's ends, and turn a claim's ``min`` into the tracked number's maximum).
``benchmarks/bench_claims.py`` (claims asv measures itself) and ``asv_import`` (claims measured by
pytest runs) both name and orient their numbers here.
"""

from __future__ import annotations

import math
import re

FORMS = ("ratio", "inverse_ratio", "reduction", "value", "inverse_value")


def form_and_unit(kind: str, direction: str, metric: str, baseline: str | None, candidate: str) -> tuple[str, str]:
    """(form, asv unit) of the number tracked for a claim; lower is better for every form."""
    if direction not in ("lower", "higher"):
        raise ValueError(f"direction must be 'lower' or 'higher', got {direction!r}")
    if kind == "absolute":
        return ("value", f"{metric} (lower is better)") if direction == "lower" else \
            ("inverse_value", f"1/{metric} (lower is better)")
    if kind == "ratio" and direction == "higher":
        return "inverse_ratio", f"ratio {baseline} / {candidate} (lower is better)"
    if kind == "reduction" and direction == "lower":
        return "reduction", f"reduction 1 - {candidate} / {baseline} (lower is better)"
    if kind not in ("ratio", "reduction"):
        raise ValueError(f"kind must be ratio, reduction or absolute, got {kind!r}")
    # a ratio that should stay low, or a reduction that should stay high: track candidate/baseline
    return "ratio", f"ratio {candidate} / {baseline} (lower is better)"


def oriented(form: str, kind: str, q: float) -> float:
    """The claim's quantity ``q`` in ``form`` (inf for 1/0)."""
    if form in ("ratio", "reduction", "value"):
        return 1.0 - q if (form == "ratio" and kind == "reduction") else q
    if form in ("inverse_ratio", "inverse_value"):
        return math.inf if q == 0 else 1.0 / q
    raise ValueError(f"unknown form {form!r}")


def oriented_interval(form: str, kind: str, lo: float, hi: float) -> tuple[float, float]:
    a, b = oriented(form, kind, lo), oriented(form, kind, hi)
    return (a, b) if a <= b else (b, a)


def oriented_bound(form: str, kind: str, direction: str, lo: float | None, hi: float | None) -> float | None:
    """The bound on the bad side (a claim's ``min`` when higher is better, else its ``max``) as a maximum
    of the tracked number; None when the claim has none."""
    bound = lo if direction == "higher" else hi
    return None if bound is None else oriented(form, kind, bound)


# --- what a recorded verdict says about its claim --------------------------------------------------

_BOUND = re.compile(r"(>=|<=) (-?[0-9.]+(?:[eE][+-]?[0-9]+)?)")


def verdict_bounds(verdict: dict) -> tuple[float | None, float | None]:
    """(min, max) of the claim a recorded verdict judged: its ``min``/``max`` fields, or for records
    written before the verdict carried them, the numbers in its bound text ('>= 2.18 (tolerance 0.1)')."""
    lo, hi = verdict.get("min"), verdict.get("max")
    if lo is None and hi is None:
        found = dict(_BOUND.findall(str(verdict.get("bound") or "")))
        lo, hi = (float(found[k]) if k in found else None for k in (">=", "<="))
    return lo, hi


def verdict_direction(verdict: dict) -> str | None:
    """Which way is better for the claim's quantity: recorded in the verdict, or for older records read
    from its bound (a lone minimum guards a higher-is-better quantity, a lone maximum a lower one);
    None when a two-sided bound leaves it open."""
    if verdict.get("direction") in ("lower", "higher"):
        return verdict["direction"]
    lo, hi = verdict_bounds(verdict)
    return "higher" if lo is not None and hi is None else "lower" if hi is not None and lo is None else None
