"""The names a claim may use: metrics the suites measure, and the parts of configuration names.

A misspelled name in a claim would otherwise never meet a measurement and sit silently "not evaluated"
(``rpc.echo.latency`` for ``rpc.echo.rtt``, ``transprot=tcp``). ``check_claim`` refuses an unknown name
with one line and a "did you mean". A user's own test may record metrics and configurations of its own:
a claims file declares them in a ``[vocabulary]`` table (``metrics = [...]``, ``configs = [...]``, the
latter as parts: ``"slow"`` or ``"key=value"``). Configuration keys, their values and their meaning are
owned by the targets: each declares its ``TargetVocabulary`` (``Target.vocabulary()``), and a run knows
the reference's (the shipped suites' claims use its names) and its own target's. ``parse_name`` is the
one parser of configuration names.

``METRICS`` lists what the workloads and suites record (``tests/test_vocabulary.py`` holds it to the
modules' own constants and to every shipped claim).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .errors import ConfigError

_DFSIO = ("write", "read", "append", "random_read", "backward_read", "skip_read", "truncate")
_MAPREDUCE = ("terasort", "sort")

METRICS: frozenset[str] = frozenset({
    # rpc (pytest_hpcnet.workloads.rpc, suites/rpc)
    "rpc.echo.rtt", "rpc.echo.rtt.floor", "rpc.echo.rtt.in_process", "rpc.echo.rtt_ratio",
    "rpc.echo.calls_per_second", "rpc.echo.peak_calls_per_second",
    "rpc.buffers.allocations_per_call", "rpc.buffers.copies_per_call",
    "verbs.send.rtt", "socket.pingpong.rtt", "verbs.pingpong.rtt",
    # the fabric alone, beside RDMA claims (pytest_hpcnet.fabric: perftest, qperf, sockperf)
    "fabric.latency", "fabric.bandwidth",
    # dfsio (pytest_hpcnet.workloads.dfsio.results)
    *(f"dfsio.{kind}.{figure}" for kind in _DFSIO
      for figure in ("throughput", "average_io_rate", "exec_time", "task_rate")),
    # the block store's write and read paths in CPU time (pytest_hpcnet.workloads.dfsio.pipeline_cost),
    # and a read's client in a process of its own (pytest_hpcnet.reference.dfs.timed_read)
    "dfsio.write.cpu_ms_per_mb", "dfsio.checksum.cpu_ns_per_kib", "dfsio.read.cpu_ms_per_mb",
    "dfsio.read.client_cpu_ms_per_mb", "dfsio.read.client_faults_per_mb",
    # mapreduce (pytest_hpcnet.workloads.mapreduce)
    *(f"mapreduce.{job}.job_time" for job in _MAPREDUCE),
    *(f"mapreduce.{job}.phase.{phase}" for job in _MAPREDUCE for phase in ("map", "shuffle", "reduce")),
    "mapreduce.terasort.merge.floor",
    # qjump (pytest_hpcnet.workloads.qjump.scenarios)
    "qjump.barrier.p50", "qjump.barrier.p99", "qjump.barrier.p99_9", "qjump.default_level.throughput",
    # suites/crosscheck: Hadoop beside the reference, and the crosscheck workload's per-job records
    "terasort.wall", "terasort.yarn_elapsed",
    *(f"crosscheck.{job}.{figure}" for job in ("teragen", "terasort") for figure in ("elapsed", "vcore_seconds")),
})

@dataclass(frozen=True)
class ConfigKey:
    """A key of configuration names (``transport`` in ``transport=shm``): its values and what it sets."""
    values: tuple[str, ...] | None          # None: any whole number
    meaning: str


@dataclass(frozen=True)
class TargetVocabulary:
    """What a target's configuration names are made of: ``key=value`` parts and single words, each
    with its meaning (``Target.vocabulary()``; the target is their one owner)."""
    target: str
    keys: Mapping[str, ConfigKey] = field(default_factory=dict)
    words: Mapping[str, str] = field(default_factory=dict)


def parse_name(name: str, where: str) -> list[tuple[str, str | None]]:
    """A configuration name's parts in order, ``(key, value)`` or ``(word, None)``:
    ``"transport=shm,posix"`` -> ``[("transport", "shm"), ("posix", None)]``; ``""`` -> ``[]``. The one
    parser of configuration names (claims, ``--config``, the reference engine, the Hadoop target)."""
    if not isinstance(name, str):
        raise ConfigError(f"expected a configuration name like 'transport=tcp,net=ib', got {name!r}", where)
    if not name.strip():
        return []
    parts = []
    for raw in name.split(","):
        part = raw.strip()
        if not part:
            raise ConfigError(f"configuration {name!r} has an empty part", where)
        key, eq, value = (x.strip() for x in part.partition("="))
        if eq and (not key or not value):
            raise ConfigError(f"{part!r} in {name!r} is not key=value", where)
        parts.append((key, value if eq else None))
    return parts


def vocabulary_of_configurations(target: str, configurations: Mapping[str, Mapping]) -> TargetVocabulary:
    """The vocabulary a target's named configurations imply, for a target that declares none: each
    name's ``key=value`` parts and words, meaning the settings the name stands for."""
    keys: dict[str, tuple[list[str], list[str]]] = {}
    words: dict[str, str] = {}
    for name, settings in configurations.items():
        meaning = (f"{target} configuration {name!r}: " +
                   (", ".join(f"{k}={v}" for k, v in dict(settings or {}).items()) or "no overrides"))
        for key, value in parse_name(name, f"target {target!r}: configuration {name!r}"):
            if value is None:
                words[key] = meaning
            else:
                values, meanings = keys.setdefault(key, ([], []))
                values.append(value)
                meanings.append(meaning)
    return TargetVocabulary(target, {k: ConfigKey(tuple(v), "; ".join(m)) for k, (v, m) in keys.items()}, words)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the nearest known name, or ''."""
    near = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


class Vocabulary:
    """The metrics and configuration parts claims may name in this run: the targets' vocabularies
    (``targets``: the reference's, whose names the shipped suites use, and the run's target's) and what
    claims files declare in ``[vocabulary]``."""

    def __init__(self, *, metrics: Iterable[str] = (), configs: Iterable[str] = (),
                 targets: Iterable[TargetVocabulary] = ()):
        self.metrics = set(METRICS) | set(metrics)
        self.keys: dict[str, set[str] | None] = {}
        self.words: set[str] = set()
        for vocab in targets:
            self.words.add(vocab.target)       # measurements of several targets name theirs first
            for key, spec in vocab.keys.items():
                if spec.values is None or self.keys.get(key, set()) is None:
                    self.keys[key] = None
                else:
                    self.keys.setdefault(key, set()).update(spec.values)
            self.words.update(vocab.words)
        for part in configs:
            for key, value in parse_name(part, "[vocabulary] configs"):
                if value is None:
                    self.words.add(key)
                elif self.keys.get(key, set()) is not None:
                    self.keys.setdefault(key, set()).add(value)

    def check_metric(self, metric: str, where: str) -> None:
        if metric not in self.metrics:
            raise ConfigError(f"unknown metric {metric!r}{did_you_mean(metric, self.metrics)}; a metric of your "
                              "own tests goes in the file's [vocabulary] metrics = [...]", where)

    def check_config(self, config: str, where: str) -> None:
        if isinstance(config, str) and not config.strip():
            raise ConfigError(f"configuration {config!r} has an empty part", where)
        for key, value in parse_name(config, where):
            if value is None:
                part = key
                if part not in self.words:
                    raise ConfigError(f"unknown configuration part {part!r} in {config!r}"
                                      f"{did_you_mean(part, [*self.words, *self.keys])}; your own goes in the "
                                      "file's [vocabulary] configs = [...]", where)
                continue
            if key not in self.keys:
                raise ConfigError(f"unknown configuration key {key!r} in {config!r}{did_you_mean(key, self.keys)} "
                                  f"(known keys: {', '.join(sorted(self.keys))})", where)
            values = self.keys[key]
            if values is None:
                if not value.isdigit():
                    raise ConfigError(f"{key} must be a whole number, got {value!r} in {config!r}", where)
            elif value not in values:
                raise ConfigError(f"unknown {key} {value!r} in {config!r}{did_you_mean(value, values)} "
                                  f"(known: {', '.join(sorted(values))})", where)

    def check_claim(self, claim) -> None:
        """ConfigError (one line, with a suggestion) for the first unknown name a claim uses."""
        from .hardware import check_feature_names
        where = f"{claim.file}: claim {claim.id!r}" if claim.file else f"claim {claim.id!r}"
        self.check_metric(claim.metric, where)
        for config in claim.configs():
            self.check_config(config, where)
        check_feature_names(claim.markers, f"{where}: markers")


def declared(doc: Mapping, file: str) -> tuple[list[str], list[str]]:
    """The (metrics, configs) a claims file's ``[vocabulary]`` table declares."""
    table = doc.get("vocabulary", {})
    if not isinstance(table, Mapping):
        raise ConfigError("'vocabulary' must be a table ([vocabulary])", file)
    extra = sorted(set(table) - {"metrics", "configs"})
    if extra:
        raise ConfigError(f"unknown key(s) {', '.join(extra)} in [vocabulary]; it holds metrics and configs",
                          file)
    out = []
    for key in ("metrics", "configs"):
        names = table.get(key, [])
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
            raise ConfigError(f"[vocabulary] {key} must be a list of names, got {names!r}", file)
        if key == "configs":
            for n in names:
                parse_name(n, f"{file}: [vocabulary] configs")
        out.append([n.strip() for n in names])
    return out[0], out[1]
