"""The Ozone target's workloads: Hadoop's TeraGen, TeraSort and TeraValidate as MapReduce jobs on the
separate-daemon deployment, with each job's paths on its configuration's file system.

A path the scratch hands out (``/hpcnet/job-N/run-0-1``) is placed on the configuration's root when a
job runs (``hdfs://<namenode>/...`` or ``ofs://<om>/hpcnet/jobs/...``); a full URI is used as it is, so
a test can hand TeraValidate an ``ofs://`` path (``root(config)``). Jobs are submitted from the
controller with the deployment's client configuration, as on a real cluster, and their records come
from the ResourceManager's REST API.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..hadoop.workloads import HadoopWorkloads, RunningCluster


class OzoneWorkloads(HadoopWorkloads):
    offered = frozenset({"teragen", "terasort", "teravalidate", "crosscheck"})

    def __init__(self, target, cluster, launchers, workdir):
        super().__init__(target, cluster, launchers, workdir)
        self.deployment = None
        self._placed: dict[str, str] = {}       # a scratch path -> the URI a job wrote it at

    @property
    def minicluster(self):
        """The deployment's client face (conf dir, RM web address), HDFS and YARN started on first use."""
        if self._minicluster is None:
            from .deployment import Deployment
            rt = self.runtime()         # TargetUnavailable without Java, Hadoop's jars or Ozone's
            self.workdir.mkdir(parents=True, exist_ok=True)
            deployment = Deployment(rt, self.target.jar_dir(), self.cluster, self.launchers, self.workdir / "deployment")
            self._stack.callback(deployment.close)
            self.deployment = deployment.start()
            self._minicluster = RunningCluster(deployment.conf_dir, deployment.rm_web)
        return self._minicluster

    def attach(self, conf_dir, rm_web=None):
        raise ConfigError("the ozone target starts its own daemons on --cluster (a layout is a datanode's "
                          "setting); crosscheck a running cluster with --target hadoop", "--conf-dir")

    def check_config(self, config, where="--config"):
        self.target.settings(config, where)

    def root(self, config: str = "") -> str:
        """The URI a configuration's jobs read and write under (its Ozone daemons started on first use)."""
        settings = self.target.settings(config)
        self.minicluster                # noqa: B018 (starts HDFS and YARN)
        if settings["fs"] == "hdfs":
            return self.deployment.conf["fs.defaultFS"]
        return self.deployment.ozone_root(settings["layout"])

    def _on(self, path, config: str = "") -> str:
        if isinstance(path, str) and path.startswith("/"):
            return self._placed.setdefault(path, self.root(config).rstrip("/") + path)
        return path if isinstance(path, str) else f"file://{Path(path).absolute()}"

    def discard(self, path):
        super().discard(self._placed.pop(path, path) if isinstance(path, str) else path)

    def teragen(self, rows, outdir, *, maps=1, start_row=0, config=""):
        return super().teragen(rows, self._on(outdir, config), maps=maps, start_row=start_row, config=config)

    def terasort(self, indir, outdir, *, reduces=1, config="", maps=None):
        return super().terasort(self._on(indir, config), self._on(outdir, config), reduces=reduces,
                                config=config, maps=maps)

    def teravalidate(self, outdir, reportdir):
        return super().teravalidate(self._on(outdir), self._on(reportdir))

    def describe(self):
        d = super().describe()
        if self.deployment is not None:
            d["deployment"] = self.deployment.describe()
        return d
