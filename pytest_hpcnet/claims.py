"""Claims (data in ``claims.toml`` files), their loading, and verdicts on measured samples.

A claim bounds one *quantity* computed from paired samples of a baseline and a candidate config:

- ``ratio``:     candidate / baseline, the median of per-round paired ratios;
- ``reduction``: 1 - candidate / baseline ("job time -34%" is a reduction of 0.34);
- ``absolute``:  the candidate's own median (the baseline is unused and may be omitted).

The confidence interval (CI) is a percentile bootstrap over rounds from 10 rounds up, and the exact
order-statistic interval with its real coverage below that (``measure.median_interval``).

Bounds, tolerance and warn band are all in the quantity's own units (ratio units, reduction
fraction, or the metric's unit for ``absolute``), never relative. The verdict rules are stated once,
above ``evaluate``: the tolerance moves only the fail threshold, the warn band is measured from the
stated bound, and a claim never passes when its whole CI lies beyond its stated bound.

``direction`` says which way is better for the quantity and is required: a ``higher`` claim must have
a ``min`` bound and a ``lower`` claim a ``max`` bound (the bound that guards the bad side), which
catches a claim whose sign was flipped while writing it down.

Every verdict checks its inputs: the samples must be of the claim's metric and configurations
(``ClaimMismatch`` otherwise), and positive unless the claim is a counter (``zero_ok``). A local gate
also gets its *sensitivity*: the smallest injected regression of the candidate (``inject``) that it
fails at; the canary run (``--hpcnet-canary``) injects one and expects every enforced gate to fail.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from .errors import ConfigError
from .measure import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, Direction, Paired, Series, median_interval, ratio_ci

Kind = Literal["ratio", "reduction", "absolute"]
KINDS = ("ratio", "reduction", "absolute")
DIRECTIONS = ("higher", "lower")

VERDICT_MODES = ("enforce", "report")


class ClaimMismatch(ValueError):
    """Samples handed to a claim are not of the metric or configurations the claim names."""


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
    verdicts: str = "enforce"    # "report": a failure is recorded and shown, never fails the test
    why: str | None = None       # why a claim is report-only (required then)
    zero_ok: bool = False        # the candidate may measure 0 (a counter), so a canary adds, not scales
    file: str | None = None      # where the claim was loaded from
    bound_from: str | None = None  # the [[override]] that set its bounds, if one did ("file: reason")
    fabric: str | None = None    # "latency" | "bandwidth": measure the fabric's ceiling beside it (pytest_hpcnet.fabric)
    params: Mapping | None = field(default=None, hash=False)  # which measurements of the metric it judges, e.g. {size = 64}
    # the published run's size, e.g. {rows = 1000000000, nodes = 6}: measured below it, the verdict is
    # reported and not enforced (a 10,000-row rehearsal says how the figures compare, never that the
    # stack falls short of a 100 GB result)
    scale: Mapping | None = field(default=None, hash=False)
    # the published runs themselves, {baseline = [...], candidate = [...]} in the metric's unit, where the
    # source printed each run (seed 002's YARN records): shown in the report beside ours
    published_runs: Mapping | None = field(default=None, hash=False)
    # a local timing gate's bounds per CPU (pytest_hpcnet.hostcpu names it): {"AMD EPYC family 25 model 1"
    # = {source = "..."}, "AMD EPYC family 23 model 1" = {max = 1.62, source = "..."}}; each entry may
    # set min, max, tolerance and warn (else the claim's own), or verdicts = "report" with a why where
    # that CPU's runs cannot hold a 20% gate, and says where its bound came from. On a CPU with no entry
    # the claim is reported, not enforced (``on_host``)
    hosts: Mapping | None = field(default=None, hash=False)

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
        if self.verdicts not in VERDICT_MODES:
            bad(f"verdicts must be 'enforce' or 'report', got {self.verdicts!r}")
        if self.verdicts == "report" and (not isinstance(self.why, str) or not self.why.strip()):
            bad("a report-only claim (verdicts = 'report') must say why it cannot gate (why = '...')")
        if self.fabric is not None and self.fabric not in ("latency", "bandwidth"):
            bad(f"fabric must be 'latency' or 'bandwidth' (which native tools give the ceiling), got {self.fabric!r}")
        if self.fabric is not None and self.kind == "absolute":
            bad("fabric needs a comparison (kind 'ratio' or 'reduction'): the ceiling is the fabric's own ratio")
        if not isinstance(self.zero_ok, bool):
            bad(f"zero_ok must be true or false, got {self.zero_ok!r}")
        if self.zero_ok and self.kind == "absolute":
            bad("zero_ok needs a baseline (kind 'ratio' or 'reduction'): a counter is judged against it")
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
        if self.params is not None:
            if not isinstance(self.params, Mapping) or not self.params \
                    or not all(isinstance(k, str) for k in self.params):
                bad(f"params must be a table of workload parameters, e.g. {{size = 64}}, got {self.params!r}")
            object.__setattr__(self, "params", dict(self.params))
        if self.scale is not None:
            if not isinstance(self.scale, Mapping) or not self.scale \
                    or not all(isinstance(k, str) and _is_number(v) for k, v in self.scale.items()):
                bad(f"scale must be a table of workload parameters and their published sizes, e.g. "
                    f"{{rows = 1000000000, nodes = 6}}, got {self.scale!r}")
            object.__setattr__(self, "scale", dict(self.scale))
        if self.published_runs is not None:
            runs = self.published_runs
            if not isinstance(runs, Mapping) or set(runs) != {"baseline", "candidate"} or not all(
                    isinstance(r, list) and r and all(map(_is_number, r)) for r in runs.values()):
                bad(f"published_runs must be {{baseline = [...], candidate = [...]}}, lists of numbers, got {runs!r}")
            object.__setattr__(self, "published_runs", {k: [float(x) for x in v] for k, v in runs.items()})
        if self.hosts is not None:
            self._check_hosts(bad)

    def _check_hosts(self, bad) -> None:
        if not isinstance(self.hosts, Mapping) or not self.hosts:
            bad(f"hosts must be a table of CPUs and their bounds, e.g. {{\"AMD EPYC family 25 model 1\" = "
                f"{{max = 1.3, source = \"...\"}}}}, got {self.hosts!r}")
        if not self.is_local:
            bad("hosts is for local gates (source = 'local: ...'): a paper's claim has one bound")
        for cpu, entry in self.hosts.items():
            if not isinstance(entry, Mapping) or not isinstance(entry.get("source"), str) \
                    or not entry["source"].strip():
                bad(f"hosts: {cpu!r} needs a table with the source of its bound, got {entry!r}")
            unknown = sorted(set(entry) - _HOST_FIELDS)
            if unknown:
                bad(f"hosts: {cpu!r}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_HOST_FIELDS))}")
        object.__setattr__(self, "hosts", {cpu: dict(entry) for cpu, entry in self.hosts.items()})
        for cpu in self.hosts:
            self.on_host(cpu)             # each host's bounds are checked as the claim's own are

    def on_host(self, cpu: str) -> "Claim":
        """The claim as judged on ``cpu``: with that CPU's bounds, or report-only where none was
        recorded. A claim without ``hosts`` is the same everywhere."""
        from dataclasses import replace
        if self.hosts is None:
            return self
        if self.bound_from is not None:   # a cluster's own [[override]] outranks the recorded hosts
            return replace(self, hosts=None)
        entry = self.hosts.get(cpu)
        if entry is None:
            return replace(self, hosts=None, verdicts="report", why=(
                f"no bound recorded on this CPU ({cpu}); its bounds are per CPU, recorded on "
                f"{'; '.join(self.hosts)} (to add one: run make gates here, then python -m "
                f"pytest_hpcnet.gate_quality --propose on the records)"))
        bounds = {k: v for k, v in entry.items() if k != "source"}
        return replace(self, hosts=None, **bounds, bound_from=f"recorded on {cpu}: {entry['source']}")

    def below_scale(self, params: Mapping | None) -> str | None:
        """What falls short of the claim's ``scale`` in a measurement's ``params`` ("rows 10000 <
        1000000000"), or None at (or above) its scale and for a claim without one."""
        short = [f"{k} {(params or {}).get(k, 'unknown')} < {v}" for k, v in (self.scale or {}).items()
                 if not _is_number((params or {}).get(k)) or (params or {})[k] < v]
        return ", ".join(short) or None

    @property
    def enforced(self) -> bool:
        """A failed verdict fails its test (report-only claims are recorded and shown instead)."""
        return self.verdicts == "enforce"

    @property
    def is_local(self) -> bool:
        """A local claim is this project's own gate on the embedded cluster, not a paper's."""
        return self.source.startswith("local:")

    def stated_bound(self) -> str:
        """The stated bound alone, e.g. '>= 2.18' or '>= 1 and <= 2'."""
        parts = []
        if self.min is not None:
            parts.append(f">= {_fmt(self.min)}")
        if self.max is not None:
            parts.append(f"<= {_fmt(self.max)}")
        return " and ".join(parts)

    def admits(self, value: float) -> bool:
        """Whether one figure (no CI) lies within the stated bound widened by the tolerance."""
        return not ((self.min is not None and value < self.min - self.tolerance)
                    or (self.max is not None and value > self.max + self.tolerance))

    def bound_text(self) -> str:
        """The bound as people read it, e.g. '>= 2.18 (tolerance 0.05)'."""
        extras = []
        if self.tolerance:
            extras.append(f"tolerance {_fmt(self.tolerance)}")
        if self.warn:
            extras.append(f"warn band {_fmt(self.warn)}")
        return self.stated_bound() + (f" ({', '.join(extras)})" if extras else "")

    def configs(self) -> tuple[str, ...]:
        """The configuration names the claim compares (the candidate alone for 'absolute')."""
        return (self.candidate,) if self.baseline is None or self.kind == "absolute" else \
            (self.baseline, self.candidate)


# --- loading -------------------------------------------------------------------------------------

_FIELDS = {f.name for f in fields(Claim)} - {"file", "bound_from"}
_HOST_FIELDS = {"min", "max", "tolerance", "warn", "verdicts", "why", "source"}
# What an [[override]] may change: how a claim is judged on one cluster, never what it measures.
_OVERRIDABLE = {"min", "max", "tolerance", "warn", "verdicts", "why"}
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


def load_claims(paths: Iterable[Path | str], vocabulary: dict | None = None) -> dict[str, Claim]:
    """Claims from TOML files of ``[[claim]]`` tables, by id. Ids must be unique across all files.

    A file may also hold ``[[override]]`` tables: ``id`` of a claim from any file, the bound fields to
    change (``min``, ``max``, ``tolerance``, ``warn``, ``verdicts``, ``why``) and a ``reason``; they apply
    after every claim is loaded, and the claim then says where its bounds came from (``bound_from``).
    This is how a cluster keeps its own bounds for the shipped claims.

    A ``[vocabulary]`` table declares metrics and configuration parts of the user's own tests (see
    ``vocabulary``); given a dict, ``vocabulary`` collects them: {"metrics": [...], "configs": [...]}.
    """
    from .vocabulary import declared
    claims: dict[str, Claim] = {}
    overrides: list[tuple[str, int, dict]] = []
    for path in paths:
        file = str(path)
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"invalid TOML: {e}", file) from None
        except OSError as e:
            raise ConfigError(f"cannot read claims file: {e.strerror or e}", file) from None
        extra = sorted(set(doc) - {"claim", "override", "vocabulary"})
        if extra:
            raise ConfigError(f"unknown top-level key(s) {', '.join(extra)}; "
                              "a claims file holds only [[claim]], [[override]] and [vocabulary] tables", file)
        metrics, configs = declared(doc, file)
        if vocabulary is not None:
            vocabulary.setdefault("metrics", []).extend(metrics)
            vocabulary.setdefault("configs", []).extend(configs)
        tables = doc.get("claim", [])
        if not isinstance(tables, list):
            raise ConfigError("'claim' must be an array of tables ([[claim]])", file)
        for index, table in enumerate(tables):
            claim = _claim_from_table(table, file, index)
            if claim.id in claims:
                raise ConfigError(f"duplicate claim id, already defined in {claims[claim.id].file}",
                                  _where(file, claim.id))
            claims[claim.id] = claim
        more = doc.get("override", [])
        if not isinstance(more, list) or not all(isinstance(t, dict) for t in more):
            raise ConfigError("'override' must be an array of tables ([[override]])", file)
        overrides += [(file, i, t) for i, t in enumerate(more)]
    for file, index, table in overrides:
        _apply_override(claims, file, index, table)
    return claims


def _apply_override(claims: dict[str, Claim], file: str, index: int, table: dict) -> None:
    import difflib
    from dataclasses import replace
    where = f"{file}: override #{index + 1}"
    claim_id = table.get("id")
    if not isinstance(claim_id, str) or not claim_id:
        raise ConfigError("needs the id of the claim it overrides", where)
    if claim_id not in claims:
        near = difflib.get_close_matches(claim_id, list(claims), n=1)
        raise ConfigError(f"no claim {claim_id!r} to override" + (f"; did you mean {near[0]!r}?" if near else ""),
                          where)
    claim = claims[claim_id]
    if claim.bound_from is not None:
        raise ConfigError(f"claim {claim_id!r} is already overridden by {claim.bound_from}", where)
    changes = {k: v for k, v in table.items() if k not in ("id", "reason")}
    unknown = sorted(set(changes) - _OVERRIDABLE)
    if unknown:
        raise ConfigError(f"cannot override {', '.join(unknown)} of {claim_id!r}; an override may change "
                          f"{', '.join(sorted(_OVERRIDABLE))}", where)
    reason = table.get("reason")
    try:
        claims[claim_id] = replace(claim, **changes, bound_from=f"{file}" + (f" ({reason})" if reason else ""))
    except ConfigError as e:
        raise ConfigError(f"{e} (after the override)", where) from None


# --- verdicts ------------------------------------------------------------------------------------
#
# The rules, for a stated bound B (a claim's ``min``; ``max`` mirrors it), tolerance t and warn band w,
# on the claim's quantity with its median q and confidence interval [lo, hi]:
#
#   fail  the whole CI is beyond B by more than the tolerance (hi < B - t);
#   warn  the whole CI is beyond B, but not by the tolerance (B - t <= hi < B): never a pass;
#   warn  the CI straddles B (lo < B <= hi);
#   warn  the CI is on the right side of B, but q is inside the warn band (q < B + w);
#   pass  otherwise: lo >= B and q >= B + w.
#
# So the tolerance moves only the fail threshold, and the warn band is measured from the stated bound.

Outcome = Literal["pass", "warn", "fail", "n/a", "not evaluated"]

# The regressions a gate's sensitivity is tried at (fractions of the guarded quantity).
SENSITIVITY_STEPS = (0.05, 0.10, 0.15, 0.20, 0.30, 0.50, 1.00)


class Side(Protocol):
    """One side of a comparison: samples of a metric under a named configuration (``measure.Series``,
    ``Measurement``)."""

    metric: str
    config: str
    samples: Sequence[float]


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
    confidence: float | None = None  # the CI's coverage (exact for fewer than 10 rounds)
    n: int = 0                      # paired rounds (or candidate samples for 'absolute')
    enforced: bool = True           # False for a report-only claim (``verdicts = "report"``)
    first_rounds: int = 0           # rounds before adaptive rounds were added
    injected: float = 0.0           # canary: the regression injected into the candidate
    sensitivity: float | None = None  # smallest injected regression this gate fails at (local gates)
    samples: dict | None = None     # {"baseline": [...], "candidate": [...]}: what the verdict judged
    bound_from: str | None = None   # the override that set the bound, when not the shipped claim
    # what the claim says and tracks, so a report can show it beside the verdict and a record read
    # without the claims files (history, asv-import) can orient and describe the quantity
    # (``claim_facts``); empty in records written before these fields existed
    statement: str = ""
    metric: str = ""
    direction: str = ""             # which way is better for the quantity
    baseline: str | None = None
    candidate: str = ""
    min: float | None = None
    max: float | None = None
    published: tuple[float, float] | None = None
    params: dict | None = None
    published_runs: dict | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["ci"] = list(self.ci) if self.ci is not None else None
        d["published"] = list(self.published) if self.published is not None else None
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "Verdict":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        for key in ("ci", "published"):
            if d.get(key) is not None:
                d[key] = tuple(d[key])
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
        extra = f"; injected regression {self.injected:.0%}" if self.injected else ""
        extra += f" (bound from {self.bound_from})" if self.bound_from else ""
        return f"{head} {measured}; bound {self.bound}{extra} -- {self.reason} [source: {self.source}]"


def claim_facts(claim: Claim) -> dict:
    """The claim's own words and names, carried on each of its verdicts for the record and the report."""
    return {"statement": claim.statement, "metric": claim.metric, "direction": claim.direction,
            "baseline": claim.baseline, "candidate": claim.candidate, "min": claim.min, "max": claim.max,
            "published": claim.published, "published_runs": claim.published_runs,
            "params": dict(claim.params) if claim.params else None, "bound_from": claim.bound_from}


def same_config(a: str, b: str) -> bool:
    """Whether two configuration names say the same thing: their comma-separated parts, in any order."""
    def parts(name: str) -> frozenset[str]:
        return frozenset(p.strip() for p in name.split(",") if p.strip())
    return parts(a) == parts(b)


def _checked(claim: Claim, side: Side | None, role: str) -> np.ndarray | None:
    """The side's samples after checking it is what the claim names; ClaimMismatch / ValueError if not."""
    expected = claim.baseline if role == "baseline" else claim.candidate
    if side is None:
        if role == "baseline" and claim.kind != "absolute":
            raise ValueError(f"kind {claim.kind!r} needs baseline samples")
        return None
    if role == "baseline" and claim.kind == "absolute":
        return None
    for attr in ("metric", "config", "samples"):
        if not hasattr(side, attr):
            raise TypeError(f"the {role} must name its metric and configuration (a measure.Series, "
                            f"Paired.sides() or a Measurement), got {type(side).__name__}")
    if side.metric != claim.metric:
        raise ClaimMismatch(f"claim {claim.id!r} is on metric {claim.metric!r}, but the {role} samples "
                            f"measure {side.metric!r}")
    if not same_config(side.config, expected):
        raise ClaimMismatch(f"claim {claim.id!r} names {role} {expected!r}, but the samples are of "
                            f"{side.config!r}")
    arr = np.asarray(list(side.samples), dtype=float)
    if role == "candidate" and claim.zero_ok:
        bad, what = np.flatnonzero(arr < 0), "negative"
    else:
        bad, what = np.flatnonzero(arr <= 0), "zero or negative"
    if bad.size:
        raise ValueError(f"{role} {side.config!r} has a {what} sample in round(s) {bad.tolist()} "
                         f"({claim.metric} cannot be; set zero_ok = true for a counter that can be zero)")
    return arr


def inject(claim: Claim, baseline: np.ndarray | None, candidate: np.ndarray, regression: float) -> np.ndarray:
    """The candidate's samples made worse by ``regression`` (0.2 = 20%) in the claim's bad direction.

    The quantity's bad side decides: a lower-is-better ratio grows by the factor 1 + regression, a
    higher-is-better one shrinks by it, and a reduction's candidate grows (its job got slower). A claim
    whose candidate may be zero (``zero_ok``: a counter) gets ``regression`` times the baseline added
    instead, since no factor moves a zero.
    """
    if regression == 0:
        return candidate
    candidate_grows = claim.direction == ("higher" if claim.kind == "reduction" else "lower")
    if claim.zero_ok and baseline is not None:
        return candidate + (regression if candidate_grows else -regression) * baseline
    return candidate * (1 + regression) if candidate_grows else candidate / (1 + regression)


def _quantity(claim: Claim, base, cand, confidence, resamples, seed):
    """(point, lo, hi, n, coverage) of the claim's quantity."""
    if claim.kind == "absolute":
        point, lo, hi, coverage = median_interval(cand, confidence=confidence, resamples=resamples, seed=seed)
        return point, lo, hi, len(cand), coverage
    r = ratio_ci(base, cand, confidence=confidence, resamples=resamples, seed=seed)
    if claim.kind == "ratio":
        return r.ratio, r.lo, r.hi, r.n, r.coverage
    return 1.0 - r.ratio, 1.0 - r.hi, 1.0 - r.lo, r.n, r.coverage   # reduction: decreasing in the ratio


# --- sides from a run's recorded measurements ----------------------------------------------------

class NotMeasured(LookupError):
    """The run recorded no samples a claim can be judged on; the message says what was missing."""


def _config_keys(config: str) -> set[str]:
    return {p.partition("=")[0].strip() for p in config.split(",") if p.strip()}


def per_round(m) -> list[float]:
    """A measurement's samples, one per round: a measurement whose samples are ``params["rounds"]``
    equal slices (a latency sweep records every call of every round) gives each slice's median."""
    samples = [float(x) for x in m.samples]
    rounds = m.params.get("rounds") if isinstance(m.params, Mapping) else None
    if isinstance(rounds, int) and not isinstance(rounds, bool) and 1 < rounds < len(samples) \
            and len(samples) % rounds == 0:
        k = len(samples) // rounds
        return [float(np.median(samples[r * k:(r + 1) * k])) for r in range(rounds)]
    return samples


def _params_text(params: Mapping) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items())) or "no params"


def measured_sides(claim: Claim, measurements: Iterable) -> tuple[Series | None, Series]:
    """``measured_pair``'s measurements as the sides ``evaluate`` takes: one sample per round."""
    base, cand = measured_pair(claim, measurements)
    cand_samples = per_round(cand)
    if base is None:
        return None, Series(claim.metric, cand.config, cand_samples)
    base_samples = per_round(base)
    if len(base_samples) != len(cand_samples):
        raise NotMeasured(f"{claim.baseline!r} has {len(base_samples)} rounds and {claim.candidate!r} "
                          f"{len(cand_samples)}: not paired rounds")
    return Series(claim.metric, base.config, base_samples), Series(claim.metric, cand.config, cand_samples)


def measured_pair(claim: Claim, measurements: Iterable) -> tuple:
    """The (baseline, candidate) ``Measurement``s of ``claim`` from a run's recorded ``Measurement``s.

    Both sides are the claim's metric under its configurations (parts in any order), recorded by the
    same test with the same parameters (parameters that the configurations themselves name, such as
    ``fsync``, may differ), and those of ``claim.params`` when it gives them; the first such pair when
    several tests recorded one. ``NotMeasured`` says why there is nothing to judge: metric or
    configuration not measured, or measured at several parameters without ``params`` to choose.
    (``measured_sides`` turns them into paired rounds, and refuses unequal rounds.)
    """
    of_metric = [m for m in measurements if m.metric == claim.metric]
    if not of_metric:
        raise NotMeasured(f"the run measured no {claim.metric}")
    wanted = claim.params or {}
    chosen = [m for m in of_metric if all(m.params.get(k) == v for k, v in wanted.items())]
    if not chosen:
        seen = sorted({_params_text(m.params) for m in of_metric})
        raise NotMeasured(f"no {claim.metric} with {_params_text(wanted)} (measured with: {'; '.join(seen[:4])})")
    free = set().union(*(_config_keys(c) for c in claim.configs()))

    def key(m) -> tuple:
        return m.test, tuple(sorted((k, repr(v)) for k, v in m.params.items() if k not in free))

    def of(config: str) -> dict:
        found: dict = {}
        for m in chosen:
            if same_config(m.config, config):
                found.setdefault(key(m), m)
        if not found:
            configs = sorted({m.config for m in chosen})
            raise NotMeasured(f"the run measured {claim.metric} under {', '.join(configs)}, not {config!r}")
        return found

    cands = of(claim.candidate)
    if claim.kind == "absolute" or claim.baseline is None:
        groups = [(k, None, m) for k, m in cands.items()]
    else:
        bases = of(claim.baseline)
        groups = [(k, bases[k], cands[k]) for k in cands if k in bases]
        if not groups:
            raise NotMeasured(f"{claim.metric} under {claim.baseline!r} and {claim.candidate!r} was not measured "
                              "side by side (same test, same params)")
    distinct = sorted({_params_text(dict(p)) for (_, p), _, _ in groups})
    if len(distinct) > 1:
        raise NotMeasured(f"{claim.metric} was measured at several params ({'; '.join(distinct[:4])}"
                          f"{'; ...' if len(distinct) > 4 else ''}); give the claim params = {{...}} to choose")
    _, base, cand = groups[0]
    return base, cand


def _check_bound(side: str, bound: float, tolerance: float, warn: float, point: float, lo: float,
                 hi: float) -> tuple[str, str]:
    """(outcome, reason) against one stated bound; side is 'min' or 'max'. The rules are above."""
    b = _fmt(bound)
    if side == "min":
        worst, best, beyond, fail_at = hi, lo, lambda x: x < bound, bound - tolerance
        if hi < fail_at:
            return "fail", (f"whole CI below {_fmt(fail_at)} (the minimum {b} less the tolerance)" if tolerance
                            else f"whole CI below the stated minimum {b}")
        where, band_ok = "below", point >= bound + warn
    else:
        worst, best, beyond, fail_at = lo, hi, lambda x: x > bound, bound + tolerance
        if lo > fail_at:
            return "fail", (f"whole CI above {_fmt(fail_at)} (the maximum {b} plus the tolerance)" if tolerance
                            else f"whole CI above the stated maximum {b}")
        where, band_ok = "above", point <= bound - warn
    name = "minimum" if side == "min" else "maximum"
    if beyond(worst):
        return "warn", f"whole CI {where} the stated {name} {b}, within the tolerance"
    if beyond(best):
        return "warn", f"CI straddles the stated {name} {b}"
    if not band_ok:
        return "warn", f"median within the warn band {_fmt(warn)} of the stated {name} {b}"
    return "pass", f"CI {'above' if side == 'min' else 'below'} the stated {name} {b}"


_RANK = {"pass": 0, "warn": 1, "fail": 2}


def evaluate(claim: Claim, baseline: Side | None, candidate: Side, *, inject_regression: float = 0.0,
             confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
             seed: int = 0) -> Verdict:
    """The verdict on ``claim`` for paired sides (index i of each = round i). Pure and seeded.

    Each side must be of the claim's metric and name its configuration (in any order of its parts);
    anything else is a ``ClaimMismatch``, so swapped arguments never give an inverted verdict.
    ``inject_regression`` makes the candidate that much worse first (the canary, see ``inject``).
    """
    try:
        base = _checked(claim, baseline, "baseline")
        cand = _checked(claim, candidate, "candidate")
        cand = inject(claim, base, cand, inject_regression)
        point, lo, hi, n, coverage = _quantity(claim, base, cand, confidence, resamples, seed)
    except ValueError as e:
        raise type(e)(f"claim {claim.id!r}: {e}" if not str(e).startswith("claim ") else str(e)) from None
    checks = []
    if claim.min is not None:
        checks.append(_check_bound("min", claim.min, claim.tolerance, claim.warn, point, lo, hi))
    if claim.max is not None:
        checks.append(_check_bound("max", claim.max, claim.tolerance, claim.warn, point, lo, hi))
    outcome = max((o for o, _ in checks), key=_RANK.__getitem__)
    reason = "; ".join(r for o, r in checks if o == outcome)
    samples = {"baseline": base.tolist() if base is not None else None, "candidate": list(map(float, candidate.samples))}
    return Verdict(claim_id=claim.id, outcome=outcome, quantity=point, ci=(lo, hi),
                   bound=claim.bound_text(), source=claim.source, reason=reason, kind=claim.kind,
                   confidence=coverage, n=n, enforced=claim.enforced, first_rounds=n,
                   injected=inject_regression, samples=samples, **claim_facts(claim))


def undecided(claim: Claim, verdict: Verdict) -> bool:
    """Whether the verdict's CI contains a bound or a fail threshold (more rounds could settle it)."""
    if verdict.ci is None:
        return False
    lo, hi = verdict.ci
    edges = []
    if claim.min is not None:
        edges += [claim.min, claim.min - claim.tolerance]
    if claim.max is not None:
        edges += [claim.max, claim.max + claim.tolerance]
    return any(lo < e <= hi for e in edges)


def sensitivity(claim: Claim, baseline: Side | None, candidate: Side, **kwargs) -> float | None:
    """The smallest regression in ``SENSITIVITY_STEPS`` that makes this claim fail on these samples.

    None when even the largest does not, or when the claim already fails without one.
    """
    for step in SENSITIVITY_STEPS:
        if evaluate(claim, baseline, candidate, inject_regression=step, **kwargs).outcome == "fail":
            return step
    return None


def as_paired(claim: Claim, baseline: Paired | Side, candidate: Side | None = None) -> Paired:
    """A ``Paired`` as given, or made of two sides of one metric (``ClaimMismatch`` if they differ)."""
    if isinstance(baseline, Paired):
        return baseline
    if candidate is None or not all(hasattr(x, a) for x in (baseline, candidate)
                                    for a in ("metric", "config", "samples")):
        raise TypeError(f"claim {claim.id!r}: give a Paired, or a baseline and a candidate that name their "
                        "metric and configuration (measure.Series or Measurement)")
    if baseline.metric != candidate.metric:
        raise ClaimMismatch(f"claim {claim.id!r}: the baseline samples measure {baseline.metric!r}, the "
                            f"candidate samples {candidate.metric!r}")
    return Paired(baseline.config, candidate.config, list(baseline.samples), list(candidate.samples),
                  metric=baseline.metric)


def settle(claim: Claim, paired: Paired, *, max_rounds: int, inject_regression: float = 0.0,
           **kwargs) -> Verdict:
    """Evaluate, and while the CI straddles a bound, take more paired rounds up to ``max_rounds``.

    Rounds are added in steps of the first round count (the same ABBA alternation continues); a
    verdict still undecided at the budget stays a warn. Without ``paired.more`` it is one evaluation.
    """
    first = paired.rounds
    verdict = evaluate(claim, *paired.sides(), inject_regression=inject_regression, **kwargs)
    while paired.more is not None and paired.rounds < max_rounds and verdict.outcome == "warn" \
            and undecided(claim, verdict):
        paired.extend(min(first, max_rounds - paired.rounds))
        verdict = evaluate(claim, *paired.sides(), inject_regression=inject_regression, **kwargs)
    verdict.first_rounds = first
    return verdict


def not_applicable(claim: Claim, missing: Mapping[str, Sequence[str]]) -> Verdict:
    """An 'n/a' verdict: ``missing`` maps each absent feature to the nodes that lack it."""
    if missing:
        parts = [f"{feature} missing on {', '.join(nodes) if nodes else 'the cluster'}"
                 for feature, nodes in sorted(missing.items())]
        reason = "hardware absent: " + "; ".join(parts)
    else:
        reason = "not applicable on this cluster"
    return Verdict(claim_id=claim.id, outcome="n/a", quantity=None, ci=None, bound=claim.bound_text(),
                   source=claim.source, reason=reason, kind=claim.kind, enforced=claim.enforced,
                   **claim_facts(claim))


def not_evaluated(claim: Claim, reason: str) -> Verdict:
    """A claim of a suite that ran, which no test evaluated (its test was skipped or deselected)."""
    return Verdict(claim_id=claim.id, outcome="not evaluated", quantity=None, ci=None,
                   bound=claim.bound_text(), source=claim.source, reason=reason, kind=claim.kind,
                   enforced=claim.enforced, **claim_facts(claim))
