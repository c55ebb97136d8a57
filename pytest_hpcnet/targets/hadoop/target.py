"""Apache Hadoop as a target: its configurations are named sets of ``-D`` overrides.

Configurations come from ``HPCNET_HADOOP_CONFIGS`` (a TOML file) or the built-in pair below::

    [configs."sort.mb=32"]
    "mapreduce.task.io.sort.mb" = 32
    [configs."rdma"]                       # e.g. a vendor build's IB switch
    "mapreduce.rdma.enabled" = true

A configuration's name is what claims and ``hpcnet crosscheck --config`` refer to. ``-Dk=v`` given
directly as a name (``--config "-Dmapreduce.job.reduces=4"``) is an ad-hoc configuration.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from ...errors import ConfigError
from ...vocabulary import TargetVocabulary, parse_name, vocabulary_of_configurations
from .. import register
from .budget import TEST_S
from .runtime import HadoopUnavailable, find_runtime

# Built-in configurations, each differing from "default" in one real setting: small jobs in the AM's
# JVM or in their own containers (what a job costs in vcore-seconds), and the map-side spill buffer
# that TeraSort's sort path uses.
DEFAULT_CONFIGS = {
    "default": {},
    "uber=off": {"mapreduce.job.ubertask.enable": "false"},
    "sort.mb=16": {"mapreduce.task.io.sort.mb": "16"},
    "sort.mb=64": {"mapreduce.task.io.sort.mb": "64"},
}


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def load_configs(path: str | os.PathLike) -> dict[str, dict]:
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read Hadoop configurations: {e}", str(path)) from None
    configs = doc.get("configs")
    if not isinstance(configs, dict) or not all(isinstance(v, dict) for v in configs.values()):
        raise ConfigError("expected [configs.<name>] tables of Hadoop keys", str(path))
    return {name: {k: _value(v) for k, v in d.items()} for name, d in configs.items()}


def parse_define_name(name: str, where: str) -> dict[str, str]:
    """``-Da=1,-Db=2`` (or ``-D a=1``) as {a: 1, b: 2}."""
    out = {}
    for part in name.split(","):
        part = part.strip()
        if not part.startswith("-D") or "=" not in part:
            raise ConfigError(f"{part!r} is neither a known configuration nor -Dkey=value", where)
        k, v = part[2:].strip().split("=", 1)
        if not k:
            raise ConfigError(f"{part!r}: empty key", where)
        out[k] = v
    return out


@register
class HadoopTarget:
    name = "hadoop"
    # a test that drives it gets this pytest-timeout: it may pay the MiniCluster's start-up (budget)
    test_timeout = TEST_S

    def __init__(self, configs_file: str | None = None, env=os.environ):
        self.configs_file = configs_file or env.get("HPCNET_HADOOP_CONFIGS")
        self._env = env

    def configurations(self) -> dict[str, dict]:
        return load_configs(self.configs_file) if self.configs_file else dict(DEFAULT_CONFIGS)

    def vocabulary(self) -> TargetVocabulary:
        """The parts of its configuration names (``uber=off``: key ``uber``, value ``off``; ``default``: a
        word), each meaning the ``-D`` overrides it stands for."""
        return vocabulary_of_configurations(self.name, self.configurations())

    def defines(self, config: str, where: str = "--config") -> dict[str, str]:
        """The ``-D`` overrides a configuration name stands for: a named configuration, parts of named
        ones joined by commas (``uber=off,sort.mb=64``: both), or ``-Dk=v[,-Dk=v]``."""
        configs = self.configurations()
        if config in configs:
            return dict(configs[config])
        if config.startswith("-D"):
            return parse_define_name(config, where)
        known = f"known: {', '.join(sorted(configs))}, or -Dkey=value"
        out: dict[str, str] = {}
        keys = self.vocabulary().keys
        for key, value in parse_name(config, where):
            part = key if value is None else f"{key}={value}"
            if part not in configs:
                if value is not None and key in keys:
                    raise ConfigError(f"unknown Hadoop configuration {config!r}: {key} {value!r} is not one of "
                                      f"{', '.join(keys[key].values)} ({known})", where)
                raise ConfigError(f"unknown Hadoop configuration {config!r} ({known})", where)
            out.update(configs[part])
        return out

    def sample_configs(self) -> list[str]:
        """What a conformance job runs under: the stack as configured (each job costs a JVM or more)."""
        return ["default"] if "default" in self.configurations() else [""]

    def workloads(self, cluster, launchers, workdir):
        """Hadoop's own programs on a MiniCluster of this host (``cluster`` and ``launchers`` are not
        used: the MiniCluster is Hadoop's)."""
        from .workloads import HadoopWorkloads
        return HadoopWorkloads(self, cluster, launchers, workdir)

    def runtime(self):
        """The Hadoop to drive (HADOOP_HOME or the jar dir); HadoopUnavailable says what is missing."""
        return find_runtime(self._env)

    def describe(self) -> dict:
        d = {"name": self.name, "configurations": sorted(self.configurations())}
        try:
            d.update(self.runtime().describe())
        except HadoopUnavailable as e:
            d["unavailable"] = str(e)
        return d
