"""Claims (data in ``claims.toml`` files), their loading, and verdicts on measured samples.

A claim bounds one *quantity* computed from paired samples of a baseline and a candidate config:

- ``ratio``:     candidate / baseline, the median of per-round paired ratios;
- ``reduction``: 1 - candidate / baseline ("job time -34%" is a reduction of 0.34);
- ``absolute``:  the candidate's own median (the baseline is unused and may be omitted).

The confidence interval (CI) is a percentile bootstrap over rounds (``measure.ratio_ci`` /
``measure.median_ci``).

Bounds, tolerance and warn band are all in the quantity's own units (ratio units, reduction
fraction, or the metric's unit for ``absolute``), never relative. The tolerance loosens each bound:
the effective bounds are ``min - tolerance`` and ``max + tolerance``. The verdict:

- ``fail`` only when the whole CI is on the wrong side of an effective bound;
- ``warn`` when the CI straddles an effective bound (never a silent pass), or when the CI is entirely
  on the right side but the point estimate is within ``warn`` of the effective bound;
- ``pass`` otherwise; ``n/a`` when the hardware the claim's markers name is absent.

``direction`` says which way is better for the quantity and is required: a ``higher`` claim must have
a ``min`` bound and a ``lower`` claim a ``max`` bound (the bound that guards the bad side), which
catches a claim whose sign was flipped while writing it down.

Regression gates ("the candidate is not slower than the baseline") are written as ``kind = "ratio"``,
``direction = "lower"``, ``max = 1.0`` with ``tolerance = GATE_TOLERANCE`` and ``warn = GATE_WARN``.
With ``measure.DEFAULT_ROUNDS`` rounds and 10% multiplicative noise per sample, such a gate fails
<= 1% of A/A comparisons and catches >= 95% of true 20% slowdowns (see
``tests/test_claims.py::test_regression_gate_quality``).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

from .errors import ConfigError
from .measure import (DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, Direction, median_ci, ratio_ci)

Kind = Literal["ratio", "reduction", "absolute"]
Outcome = Literal["pass", "warn", "fail", "n/a"]
KINDS = ("ratio", "reduction", "absolute")
DIRECTIONS = ("higher", "lower")

# A regression gate fails only if the whole CI is above 1.04, and warns when the CI straddles 1.04 or the
# median ratio is above 1.02 (a small slowdown measured precisely is worth a look, an A/A is not).
GATE_TOLERANCE = 0.04
GATE_WARN = 0.02


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _where(file: str | None, claim_id: str | None, index: int | None = None) -> str:
    who = f"claim {claim_id!r}" if claim_id else f"claim #{index + 1} (no id)" if index is not None \
        else "claim"
    return f"{file}: {who}" if file else who


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One expected bound on a measured quantity. Construction validates; errors are ConfigError."""

    id: str
    statement: str
    metric: str
    candidate: str               # config name, e.g. "transport=shm"
    kind: Kind
    direction: Direction         # which way is better for the claim's quantity
    source: str                  # "seed 003, abstract" or "local: measured <date> by <command>"
    baseline: str | None = None  # config name; unused for kind "absolute"
    min: float | None = None
    max: float | None = None
    tolerance: float = 0.0       # loosens each bound, in the quantity's units
    warn: float = 0.0            # warn band width inside the effective bound, quantity's units
    markers: tuple[str, ...] = ()
    published: tuple[float, float] | None = None  # the range as the paper printed it, information only
    file: str | None = None      # where the claim was loaded from

    def __post_init__(self):
        where = _where(self.file, self.id if isinstance(self.id, str) else None)

        def bad(msg: str):
            raise ConfigError(msg, where)

        for name in ("id", "statement", "metric", "candidate", "source"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                bad(f"{name} must be a non-empty string, got {value!r}")
        if self.kind not in KINDS:
            bad(f"kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.direction not in DIRECTIONS:
            bad(f"direction must be 'higher' or 'lower'; got {self.direction!r}")
        if self.baseline is None:
            if self.kind != "absolute":
                bad(f"baseline is required for kind {self.kind!r} (only 'absolute' claims omit it)")
        elif not isinstance(self.baseline, str) or not self.baseline.strip():
            bad(f"baseline must be a non-empty string, got {self.baseline!r}")
        for name in ("min", "max"):
            value = getattr(self, name)
            if value is not None and not _is_number(value):
                bad(f"{name} must be a finite number, got {value!r}")
        if self.min is None and self.max is None:
            bad("needs at least one bound (min and/or max)")
        if self.min is not None and self.max is not None and self.min > self.max:
            bad(f"min ({self.min}) is greater than max ({self.max})")
        if self.direction == "higher" and self.min is None:
            bad("direction 'higher' needs a min bound (the bound that guards the bad side)")
        if self.direction == "lower" and self.max is None:
            bad("direction 'lower' needs a max bound (the bound that guards the bad side)")
        for name in ("tolerance", "warn"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0:
                bad(f"{name} must be a number >= 0, got {value!r}")
        markers = self.markers
        if isinstance(markers, str) or not isinstance(markers, (list, tuple)) \
                or not all(isinstance(m, str) and m for m in markers):
            bad(f"markers must be a list of feature names, got {markers!r}")
        object.__setattr__(self, "markers", tuple(markers))
        if self.published is not None:
            pub = self.published
            if not isinstance(pub, (list, tuple)) or len(pub) != 2 or not all(map(_is_number, pub)) \
                    or pub[0] > pub[1]:
                bad(f"published must be a [lo, hi] pair of numbers with lo <= hi, got {pub!r}")
            object.__setattr__(self, "published", (float(pub[0]), float(pub[1])))
        for name in ("min", "max", "tolerance", "warn"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, float(value))

    @property
    def is_local(self) -> bool:
        """A local claim is this project's own gate on the embedded cluster, not a paper's."""
        return self.source.startswith("local:")

    def bound_text(self) -> str:
        """The bound as people read it, e.g. '>= 2.18 (tolerance 0.05)'."""
        parts = []
        if self.min is not None:
            parts.append(f">= {_fmt(self.min)}")
        if self.max is not None:
            parts.append(f"<= {_fmt(self.max)}")
        extras = []
        if self.tolerance:
            extras.append(f"tolerance {_fmt(self.tolerance)}")
        if self.warn:
            extras.append(f"warn band {_fmt(self.warn)}")
        return " and ".join(parts) + (f" ({', '.join(extras)})" if extras else "")


# --- loading -------------------------------------------------------------------------------------

_FIELDS = {f.name for f in fields(Claim)} - {"file"}
_REQUIRED = {"id", "statement", "metric", "candidate", "kind", "direction", "source"}


def _claim_from_table(table, file: str, index: int) -> Claim:
    if not isinstance(table, dict):
        raise ConfigError(f"each [[claim]] must be a table, got {table!r}", _where(file, None, index))
    claim_id = table.get("id") if isinstance(table.get("id"), str) else None
    where = _where(file, claim_id, index)
    unknown = sorted(set(table) - _FIELDS)
    if unknown:
        raise ConfigError(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_FIELDS))}",
                          where)
    missing = sorted(_REQUIRED - set(table))
    if missing:
        raise ConfigError(f"missing required field(s) {', '.join(missing)}", where)
    return Claim(**table, file=file)


def load_claims(paths: Iterable[Path | str]) -> dict[str, Claim]:
    """Claims from TOML files of ``[[claim]]`` tables, by id. Ids must be unique across all files."""
    claims: dict[str, Claim] = {}
    for path in paths:
        file = str(path)
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"invalid TOML: {e}", file) from None
        except OSError as e:
            raise ConfigError(f"cannot read claims file: {e.strerror or e}", file) from None
        extra = sorted(set(doc) - {"claim"})
        if extra:
            raise ConfigError(f"unknown top-level key(s) {', '.join(extra)}; "
                              "a claims file holds only [[claim]] tables", file)
        tables = doc.get("claim", [])
        if not isinstance(tables, list):
            raise ConfigError("'claim' must be an array of tables ([[claim]])", file)
        for index, table in enumerate(tables):
            claim = _claim_from_table(table, file, index)
            if claim.id in claims:
                raise ConfigError(f"duplicate claim id, already defined in {claims[claim.id].file}",
                                  _where(file, claim.id))
            claims[claim.id] = claim
    return claims


# --- verdicts ------------------------------------------------------------------------------------

@dataclass
class Verdict:
    """The outcome of checking one claim, with everything a reader needs to judge it."""

    claim_id: str
    outcome: Outcome
    quantity: float | None          # measured point estimate
    ci: tuple[float, float] | None  # (lo, hi) of the point estimate
    bound: str                      # Claim.bound_text()
    source: str
    reason: str
    kind: str = ""
    confidence: float | None = None
    n: int = 0                      # paired rounds (or candidate samples for 'absolute')

    def to_json(self) -> dict:
        d = asdict(self)
        d["ci"] = list(self.ci) if self.ci is not None else None
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "Verdict":
        d = dict(d)
        if d.get("ci") is not None:
            d["ci"] = tuple(d["ci"])
        return cls(**d)

    def message(self) -> str:
        """One line: outcome, measured value with CI, bound, reason and source."""
        head = f"{self.outcome.upper()} {self.claim_id}:"
        if self.quantity is None:
            measured = "not measured"
        else:
            measured = f"{self.kind or 'value'} {_fmt(self.quantity)}"
            if self.ci is not None:
                level = f"{self.confidence:.0%} " if self.confidence is not None else ""
                measured += f" ({level}CI {_fmt(self.ci[0])}..{_fmt(self.ci[1])}, n={self.n})"
        return f"{head} {measured}; bound {self.bound} -- {self.reason} [source: {self.source}]"


def _quantity(claim: Claim, baseline_samples, candidate_samples, confidence, resamples, seed):
    """(point, lo, hi, n) of the claim's quantity."""
    if claim.kind == "absolute":
        samples = list(candidate_samples)
        point, lo, hi = median_ci(samples, confidence=confidence, resamples=resamples, seed=seed)
        return point, lo, hi, len(samples)
    if baseline_samples is None:
        raise ValueError(f"kind {claim.kind!r} needs baseline samples")
    r = ratio_ci(baseline_samples, candidate_samples, confidence=confidence, resamples=resamples,
                 seed=seed)
    if claim.kind == "ratio":
        return r.ratio, r.lo, r.hi, r.n
    return 1.0 - r.ratio, 1.0 - r.hi, 1.0 - r.lo, r.n   # reduction: decreasing in the ratio


def _check_bound(side: str, effective: float, point: float, lo: float, hi: float, warn: float):
    """(outcome, reason) against one effective bound; side is 'min' or 'max'."""
    eff = _fmt(effective)
    if side == "min":
        if hi < effective:
            return "fail", f"whole CI below the effective minimum {eff}"
        if lo < effective:
            return "warn", f"CI straddles the effective minimum {eff}"
        if point < effective + warn:
            return "warn", f"point estimate within the warn band above the effective minimum {eff}"
        return "pass", f"CI above the effective minimum {eff}"
    if lo > effective:
        return "fail", f"whole CI above the effective maximum {eff}"
    if hi > effective:
        return "warn", f"CI straddles the effective maximum {eff}"
    if point > effective - warn:
        return "warn", f"point estimate within the warn band below the effective maximum {eff}"
    return "pass", f"CI below the effective maximum {eff}"


_RANK = {"pass": 0, "warn": 1, "fail": 2}


def evaluate(claim: Claim, baseline_samples: Sequence[float] | None, candidate_samples: Sequence[float],
             *, confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
             seed: int = 0) -> Verdict:
    """The verdict on ``claim`` for paired samples (index i of each = round i). Pure and seeded."""
    try:
        point, lo, hi, n = _quantity(claim, baseline_samples, candidate_samples, confidence,
                                     resamples, seed)
    except ValueError as e:
        raise ValueError(f"claim {claim.id!r}: {e}") from None
    checks = []
    if claim.min is not None:
        checks.append(_check_bound("min", claim.min - claim.tolerance, point, lo, hi, claim.warn))
    if claim.max is not None:
        checks.append(_check_bound("max", claim.max + claim.tolerance, point, lo, hi, claim.warn))
    outcome = max((o for o, _ in checks), key=_RANK.__getitem__)
    reason = "; ".join(r for o, r in checks if o == outcome)
    return Verdict(claim_id=claim.id, outcome=outcome, quantity=point, ci=(lo, hi),
                   bound=claim.bound_text(), source=claim.source, reason=reason, kind=claim.kind,
                   confidence=confidence, n=n)


def not_applicable(claim: Claim, missing: Mapping[str, Sequence[str]]) -> Verdict:
    """An 'n/a' verdict: ``missing`` maps each absent feature to the nodes that lack it."""
    if missing:
        parts = [f"{feature} missing on {', '.join(nodes) if nodes else 'the cluster'}"
                 for feature, nodes in sorted(missing.items())]
        reason = "hardware absent: " + "; ".join(parts)
    else:
        reason = "not applicable on this cluster"
    return Verdict(claim_id=claim.id, outcome="n/a", quantity=None, ci=None, bound=claim.bound_text(),
                   source=claim.source, reason=reason, kind=claim.kind)
