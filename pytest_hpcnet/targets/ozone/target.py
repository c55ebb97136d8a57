"""Apache Ozone beside HDFS as a target: seed 002's three storage set-ups under one YARN.

Configurations name where a job's input and output live::

    fs=hdfs                          HDFS (NameNode + DataNodes)
    fs=ozone,layout=FILE_PER_BLOCK   Ozone, every chunk of a block in one file
    fs=ozone,layout=FILE_PER_CHUNK   Ozone, one file per chunk

The layout is the datanodes' ``ozone.scm.container.layout`` (Ozone 1.0 named it
``ozone.scm.chunk.layout``, the key seed 002 set). Every job runs on one separate-daemon deployment
(``deployment``) started on the run's cluster; a layout's Ozone daemons start when a configuration first
needs them. The jars come from ``targets/ozone/pom.xml`` (``make ozone-jars``; ``HPCNET_OZONE_JARS``
points elsewhere), Hadoop's from the Hadoop target's jar dir.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ...errors import ConfigError
from ...vocabulary import ConfigKey, TargetVocabulary, parse_name
from .. import register
from ..hadoop.runtime import REPO, HadoopUnavailable, find_runtime

LAYOUTS = ("FILE_PER_BLOCK", "FILE_PER_CHUNK")
CONFIGS = {"fs=hdfs": {"fs": "hdfs"},
           **{f"fs=ozone,layout={layout}": {"fs": "ozone", "layout": layout} for layout in LAYOUTS}}
DEFAULT_JAR_DIR = REPO / ".cache" / "ozone"
# what the daemons and the ofs:// client load
REQUIRED_JARS = ("hdds-server-scm-*.jar", "ozone-manager-*.jar", "ozone-datanode-*.jar",
                 "ozone-filesystem-hadoop3-*.jar")
TEST_S = 1500            # a test may pay HDFS, YARN and two Ozone start-ups on a loaded 2-core box


def find_ozone_jars(env=os.environ) -> Path:
    where = Path(env.get("HPCNET_OZONE_JARS") or DEFAULT_JAR_DIR)
    missing = [p for p in REQUIRED_JARS if not any(where.glob(p))]
    if missing:
        raise HadoopUnavailable(f"Ozone jars missing in {where} ({', '.join(missing)}); fetch them with "
                                "`make ozone-jars`")
    return where.resolve()


@register
class OzoneTarget:
    name = "ozone"
    test_timeout = TEST_S

    def __init__(self, env=os.environ):
        self._env = env

    def configurations(self) -> dict[str, dict]:
        return dict(CONFIGS)

    def vocabulary(self) -> TargetVocabulary:
        return TargetVocabulary(self.name, {
            "fs": ConfigKey(("hdfs", "ozone"), "the file system a job's input and output live on"),
            "layout": ConfigKey(LAYOUTS, "the Ozone datanodes' ozone.scm.container.layout (with fs=ozone)"),
        })

    def settings(self, config: str, where: str = "--config") -> dict[str, str]:
        """``{"fs": ..., "layout": ...}`` of a configuration name; an unknown value or a layout without
        Ozone is refused in one line."""
        if config in ("", "default"):
            return dict(CONFIGS["fs=hdfs"])
        self.vocabulary_check(config, where)
        out = dict(parse_name(config, where))
        if out.get("fs", "hdfs") == "ozone":
            out.setdefault("layout", LAYOUTS[0])
        elif "layout" in out:
            raise ConfigError(f"{config!r}: a layout is Ozone's (fs=ozone), not HDFS's", where)
        out.setdefault("fs", "hdfs")
        return out

    def vocabulary_check(self, config: str, where: str) -> None:
        from ...vocabulary import Vocabulary
        Vocabulary(targets=[self.vocabulary()]).check_config(config, where)

    def defines(self, config: str, where: str = "--config") -> dict[str, str]:
        """No per-job ``-D``: a configuration picks the file system (the job's paths) and the datanodes'
        layout (a daemon's setting)."""
        self.settings(config, where)
        return {}

    def sample_configs(self) -> list[str]:
        return ["fs=hdfs"]

    def runtime(self):
        """Hadoop (its jar dir or HADOOP_HOME) with Ozone's ofs:// client on the job classpath."""
        fs_jar = sorted(self.jar_dir().glob("ozone-filesystem-hadoop3-*.jar"))[-1]
        return dataclasses.replace(find_runtime(self._env), extra_jars=(str(fs_jar),))

    def jar_dir(self) -> Path:
        return find_ozone_jars(self._env)

    def workloads(self, cluster, launchers, workdir):
        from .workloads import OzoneWorkloads
        return OzoneWorkloads(self, cluster, launchers, workdir)

    def describe(self) -> dict:
        d = {"name": self.name, "configurations": sorted(CONFIGS)}
        try:
            d.update(self.runtime().describe(), ozone_jars=str(self.jar_dir()))
        except HadoopUnavailable as e:
            d["unavailable"] = str(e)
        return d
