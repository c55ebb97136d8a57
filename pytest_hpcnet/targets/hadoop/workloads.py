"""Apache Hadoop's workloads for the suites: its own programs (``jobs``) on one MiniCluster per process
(``shared``), started on first use, or on a running cluster given by its client configuration
(``attach``). A job's per-job record is YARN's application record (``yarn``).

Paths: a ``pathlib.Path`` is a local directory (``file://`` to Hadoop, for data a test reads or
changes), a string a path on the MiniCluster's HDFS.
"""

from __future__ import annotations

import itertools
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePath

from .. import Scratch, TargetUnavailable, WorkloadResult, Workloads
from . import jobs, yarn
from .runtime import HadoopUnavailable

_scratch_ids = itertools.count()


def _uri(path) -> str:
    return f"file://{Path(path).absolute()}" if isinstance(path, PurePath) else str(path)


@dataclass(frozen=True)
class RunningCluster:
    """A cluster someone else runs: its client configuration dir and, where it serves one, the
    ResourceManager's web address (for REST application records)."""
    conf_dir: Path
    rm_web: str | None = None


def _result(workload: str, r: jobs.HadoopJobResult, records_counter: str | None = None, **details) -> WorkloadResult:
    records = r.counters.get(records_counter) if records_counter else None
    return WorkloadResult(workload, r.wall_s, records, {**r.details, **details}, r)


class HadoopWorkloads(Workloads):
    offered = frozenset({"teragen", "terasort", "teravalidate", "randomwriter", "sort", "sortvalidate", "dfsio",
                         "rpc_server", "rpc_client", "crosscheck"})

    def __init__(self, target, cluster, launchers, workdir):
        super().__init__(target, cluster, launchers, workdir)
        self._stack = ExitStack()
        self._runtime = None
        self._minicluster = None

    def runtime(self):
        if self._runtime is None:
            try:
                self._runtime = self.target.runtime()
            except HadoopUnavailable as e:
                raise TargetUnavailable(self.name, str(e)) from None
        return self._runtime

    @property
    def minicluster(self):
        """The process's one MiniCluster (HDFS + YARN), shared with every other user in this process."""
        if self._minicluster is None:
            from .shared import shared_minicluster
            rt = self.runtime()
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._minicluster = self._stack.enter_context(
                shared_minicluster(rt, tempfile.mkdtemp(prefix="minicluster-", dir=self.workdir)))
        return self._minicluster

    def attach(self, conf_dir, rm_web: str | None = None) -> None:
        """Run on the cluster whose client configuration is ``conf_dir`` instead of a MiniCluster."""
        self._minicluster = RunningCluster(Path(conf_dir), rm_web)

    def check_config(self, config, where="--config"):
        self.target.defines(config, where)

    def discard(self, path) -> None:
        if isinstance(path, PurePath):
            return super().discard(path)
        jobs.run_program(self.runtime(), "fs", ["-rm", "-r", "-f", "-skipTrash", path],
                         conf_dir=self.minicluster.conf_dir, check=False)

    def close(self) -> None:
        self._minicluster = None
        self._stack.close()

    def scratch(self) -> Scratch:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return Scratch(Path(tempfile.mkdtemp(prefix="job-", dir=self.workdir)), f"/hpcnet/job-{next(_scratch_ids)}")

    def _run(self, fn, *args, config: str = "", **kw):
        rt, mc = self.runtime(), self.minicluster
        defines = self.target.defines(config) if config else None
        return fn(rt, *args, conf_dir=mc.conf_dir, defines=defines, **kw)

    # -- MapReduce -----------------------------------------------------------------------------------
    def teragen(self, rows, outdir, *, maps=1, start_row=0, config=""):
        if start_row:
            raise self.missing("teragen", "from a start row: Hadoop's TeraGen always begins at row 0")
        if rows == 0:
            raise self.missing("teragen", "of 0 rows: the Hadoop runner takes 1 row or more")
        r = self._run(jobs.teragen, rows, _uri(outdir), maps=maps, config=config)
        checksum = r.details.get("checksum")
        return _result("teragen", r, "Map output records",
                       checksum=None if checksum is None else format(checksum, "x"))

    def terasort(self, indir, outdir, *, reduces=1, config="", maps=None):
        return _result("terasort", self._run(jobs.terasort, _uri(indir), _uri(outdir), reduces=reduces,
                                             config=config), "Reduce output records")

    def teravalidate(self, outdir, reportdir):
        return _result("teravalidate", self._run(jobs.teravalidate, _uri(outdir), _uri(reportdir)))

    def randomwriter(self, outdir, total_bytes, *, maps=1):
        if total_bytes == 0:
            raise self.missing("randomwriter", "of 0 bytes: the Hadoop runner takes 1 byte or more")
        return _result("randomwriter", self._run(jobs.randomwriter, _uri(outdir), total_bytes, maps=maps))

    def sort(self, indir, outdir, *, reduces=1, config=""):
        return _result("sort", self._run(jobs.sort, _uri(indir), _uri(outdir), reduces=reduces, config=config),
                       "Reduce output records")

    def job_record(self, result):
        """YARN's application record of the job (REST where the RM serves it, else ``yarn application
        -status``: one more JVM per record); a run must have been one YARN application."""
        app_ids = result.raw.app_ids
        if len(app_ids) != 1:
            raise self.missing("crosscheck", f"expected one YARN application per job, the client printed "
                               f"{app_ids or 'none'} (is mapreduce.framework.name yarn?)")
        mc = self.minicluster
        return yarn.app_records(self.runtime(), app_ids, rm_web=mc.rm_web, conf_dir=mc.conf_dir)[0]

    def sortvalidate(self, indir, outdir):
        r = self._run(jobs.sortvalidate, _uri(indir), _uri(outdir))
        return _result("sortvalidate", r, lines=[jobs.SORT_VALIDATED] if r.details["valid"] else [])

    # -- TestDFSIO -----------------------------------------------------------------------------------
    def dfsio(self, args, *, res_file):
        r = self._run(jobs.dfsio, list(args), res_file=res_file)
        nr = r.details.get("nr_files")
        return WorkloadResult("dfsio", r.wall_s, None if nr is None else int(nr), dict(r.details), r)

    # -- RPC -----------------------------------------------------------------------------------------
    @contextmanager
    def rpc_server(self, *, threads=4):
        from ...sockets import free_port
        with jobs.rpc_benchmark_server(self.runtime(), port=free_port(), threads=threads) as address:
            yield address

    def rpc_client(self, address, *, clients, seconds, msg_size):
        host, port = address
        r = jobs.rpc_benchmark(self.runtime(), clients=clients, seconds=seconds, msg_size=msg_size, port=port,
                               host=host)
        return _result("rpc_client", r)
