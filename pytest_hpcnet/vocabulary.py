"""The names a claim may use: metrics the suites measure, and the parts of configuration names.

A misspelled name in a claim would otherwise never meet a measurement and sit silently "not evaluated"
(``rpc.echo.latency`` for ``rpc.echo.rtt``, ``transprot=tcp``). ``check_claim`` refuses an unknown name
with one line and a "did you mean". A user's own test may record metrics and configurations of its own:
a claims file declares them in a ``[vocabulary]`` table (``metrics = [...]``, ``configs = [...]``, the
latter as parts: ``"slow"`` or ``"key=value"``), and the target under test adds the configurations it
names (``Target.configurations()``).

``METRICS`` lists what the workloads and suites record (``tests/test_vocabulary.py`` holds it to the
modules' own constants and to every shipped claim).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from .errors import ConfigError

_DFSIO = ("write", "read", "append", "random_read", "backward_read", "skip_read", "truncate")
_MAPREDUCE = ("terasort", "sort")

METRICS: frozenset[str] = frozenset({
    # rpc (pytest_hpcnet.workloads.rpc, suites/rpc)
    "rpc.echo.rtt", "rpc.echo.rtt.floor", "rpc.echo.rtt.in_process", "rpc.echo.rtt_ratio",
    "rpc.echo.calls_per_second", "rpc.echo.peak_calls_per_second",
    "rpc.buffers.allocations_per_call", "rpc.buffers.copies_per_call",
    "verbs.send.rtt", "socket.pingpong.rtt",
    # the fabric alone, beside RDMA claims (pytest_hpcnet.fabric: perftest, qperf, sockperf)
    "fabric.latency", "fabric.bandwidth",
    # dfsio (pytest_hpcnet.workloads.dfsio.results)
    *(f"dfsio.{kind}.{figure}" for kind in _DFSIO
      for figure in ("throughput", "average_io_rate", "exec_time", "task_rate")),
    # the block store's write path in CPU time (pytest_hpcnet.workloads.dfsio.pipeline_cost)
    "dfsio.write.cpu_ms_per_mb", "dfsio.checksum.cpu_ns_per_kib",
    # mapreduce (pytest_hpcnet.workloads.mapreduce)
    *(f"mapreduce.{job}.job_time" for job in _MAPREDUCE),
    *(f"mapreduce.{job}.phase.{phase}" for job in _MAPREDUCE for phase in ("map", "shuffle", "reduce")),
    # qjump (pytest_hpcnet.workloads.qjump.scenarios)
    "qjump.barrier.p50", "qjump.barrier.p99", "qjump.barrier.p99_9", "qjump.default_level.throughput",
    # crosscheck against Apache Hadoop (suites/crosscheck)
    "terasort.wall", "terasort.yarn_elapsed", "crosscheck.teragen.elapsed", "crosscheck.teragen.vcore_seconds",
})

# Configuration parts "key=value": the values each key may take (None: any whole number).
CONFIG_KEYS: dict[str, tuple[str, ...] | None] = {
    "transport": ("tcp", "shm", "verbs"),
    "buffers": ("pooled", "naive"),
    "net": ("eth", "ib"),
    "intermediate": ("local", "shared"),
    "shuffle": ("fetch", "direct"),
    "impl": ("native", "python"),
    "checksum": ("crc32c", "crc32"),
    "fs": ("posix", "blockstore"),
    "fsync": ("none", "close", "every-buffer"),
    "replication": None,
    "client": ("hadoop", "ours"),
    "server": ("hadoop", "ours"),
}
# Configuration parts that are a single word: file system targets, qjump scenarios, the Hadoop stack.
CONFIG_WORDS: frozenset[str] = frozenset({"posix", "blockstore", "alone", "interference", "qjump", "hadoop"})


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the nearest known name, or ''."""
    near = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


class Vocabulary:
    """The metrics and configuration parts claims may name in this run."""

    def __init__(self, *, metrics: Iterable[str] = (), configs: Iterable[str] = (),
                 target_configs: Iterable[str] = ()):
        self.metrics = set(METRICS) | set(metrics)
        self.keys: dict[str, set[str] | None] = {k: None if v is None else set(v) for k, v in CONFIG_KEYS.items()}
        self.words = set(CONFIG_WORDS)
        for part in [*configs, *(p for c in target_configs for p in c.split(","))]:
            key, eq, value = part.strip().partition("=")
            if not eq:
                self.words.add(key)
            elif self.keys.get(key, set()) is not None:
                self.keys.setdefault(key, set()).add(value)

    def check_metric(self, metric: str, where: str) -> None:
        if metric not in self.metrics:
            raise ConfigError(f"unknown metric {metric!r}{did_you_mean(metric, self.metrics)}; a metric of your "
                              "own tests goes in the file's [vocabulary] metrics = [...]", where)

    def check_config(self, config: str, where: str) -> None:
        for part in (p.strip() for p in config.split(",")):
            if not part:
                raise ConfigError(f"configuration {config!r} has an empty part", where)
            key, eq, value = part.partition("=")
            if not eq:
                if part not in self.words:
                    raise ConfigError(f"unknown configuration part {part!r} in {config!r}"
                                      f"{did_you_mean(part, [*self.words, *self.keys])}; your own goes in the "
                                      "file's [vocabulary] configs = [...]", where)
                continue
            if key not in self.keys:
                raise ConfigError(f"unknown configuration key {key!r} in {config!r}{did_you_mean(key, self.keys)}",
                                  where)
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
        out.append([n.strip() for n in names])
    return out[0], out[1]
