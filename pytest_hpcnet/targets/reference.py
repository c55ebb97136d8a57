"""The reference implementation shipped with this project, as a target: the MapReduce engine (a worker
per node) for the TeraSort and Sort families and their per-job records (crosscheck), the block store for
TestDFSIO, the Hadoop-compatible RPC echo server and client."""

from __future__ import annotations

import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from ..vocabulary import ConfigKey, TargetVocabulary
from . import JobRecord, Scratch, TargetUnavailable, WorkloadResult, Workloads, register

# The engine configurations a conformance job runs under: both transports, both intermediate dirs,
# both ways of shuffling (verbs has its own suite: it needs an RDMA device).
SAMPLE_CONFIGS = ["transport=tcp,intermediate=local,shuffle=fetch", "transport=shm,intermediate=local,shuffle=fetch",
                  "transport=tcp,intermediate=shared,shuffle=fetch", "transport=shm,intermediate=shared,shuffle=direct"]


# The reference's keys besides the MapReduce engine's own (transport, intermediate, shuffle, net: declared
# with the engine, reference/mapreduce/engine/config.py), and its single-word configuration parts.
KEYS: dict[str, ConfigKey] = {
    "buffers": ConfigKey(("pooled", "naive", "none"), "RPC buffer management: a pool of pre-registered buffers "
                         "sized by message-size locality, or allocate and copy per message (like default Hadoop "
                         "RPC); none for the raw-socket floor, which has no RPC"),
    "impl": ConfigKey(("native", "python", "floor"), "who runs the hot paths: the compiled core or the Python "
                      "reference; floor is the physical floor a native path is gated against (the raw-socket "
                      "ping-pong, the bare CRC32C instruction loop)"),
    "checksum": ConfigKey(("crc32c", "crc32"), "the block store's chunk checksum"),
    "fs": ConfigKey(("posix", "blockstore"), "TestDFSIO's file system: a POSIX directory or the block store"),
    "fsync": ConfigKey(("none", "close", "every-buffer"), "when TestDFSIO's POSIX writer syncs its file"),
    "replication": ConfigKey(None, "block store replicas of each block"),
    "client": ConfigKey(("hadoop", "ours"), "whose RPC client a Hadoop-interoperation measurement used"),
    "server": ConfigKey(("hadoop", "ours"), "whose RPC server a Hadoop-interoperation measurement used"),
}
WORDS: dict[str, str] = {
    "posix": "TestDFSIO on a POSIX directory",
    "blockstore": "TestDFSIO on the reference block store",
    "read": "the block store's read path: a file read back whole into one reused buffer, as a TestDFSIO "
            "map task reads",
    "alone": "QJump experiment: barrier-sync latency with nothing else on the link",
    "interference": "QJump experiment: barrier-sync latency beside bulk TCP flows",
    "qjump": "QJump experiment: the barrier-sync traffic in a priority class",
    "hadoop": "Apache Hadoop's side of a measurement taken beside the reference",
}
# Keys whose every value names a configuration of its own in ``configurations()``.
CONFIGURATION_KEYS = ("transport", "buffers", "net", "intermediate", "shuffle")


@register
class ReferenceTarget:
    name = "reference"

    def vocabulary(self) -> TargetVocabulary:
        """Every key and word the reference's configuration names use, with their values and meaning."""
        from ..reference.mapreduce.engine.config import KEYS as ENGINE_KEYS
        return TargetVocabulary(self.name, {**ENGINE_KEYS, **KEYS}, dict(WORDS))

    def configurations(self) -> dict[str, dict]:
        """One entry per setting a named configuration may name (``transport=shm,buffers=naive``), from
        the vocabulary. Transports are the ones that can run here (``verbs`` only with pyverbs and an
        active RDMA port)."""
        from ..reference.transport import TRANSPORTS
        keys = self.vocabulary().keys
        return {f"{key}={value}": {key: value} for key in CONFIGURATION_KEYS for value in keys[key].values
                if key != "transport" or value in TRANSPORTS}

    def sample_configs(self) -> list[str]:
        return list(SAMPLE_CONFIGS)

    def describe(self) -> dict:
        return {"name": self.name, "version": metadata.version("pytest-hpcnet"),
                "configurations": sorted(self.configurations())}

    def workloads(self, cluster, launchers, workdir) -> "ReferenceWorkloads":
        return ReferenceWorkloads(self, cluster, launchers, workdir)


def _result(r) -> WorkloadResult:
    """An engine ``JobResult`` in the targets' common shape."""
    return WorkloadResult(r.job, r.seconds, r.records, dict(r.details), r)


class ReferenceWorkloads(Workloads):
    offered = frozenset({"teragen", "terasort", "teravalidate", "randomwriter", "sort", "sortvalidate", "dfsio",
                         "rpc_server", "rpc_client", "crosscheck"})

    def __init__(self, target, cluster, launchers, workdir):
        super().__init__(target, cluster, launchers, workdir)
        self._engine = None
        self._store = None

    @property
    def engine(self):
        """The MapReduce engine on the cluster (started on first use; the suites' own tests share it)."""
        if self._engine is None:
            from ..reference.mapreduce.engine.driver import Engine
            self._engine = Engine(self.cluster, self.launchers).start()
        return self._engine

    def blockstore(self):
        """The block store over tcp on every node (started on first use)."""
        if self._store is None:
            from ..reference.dfs.store import BlockStore
            self._store = BlockStore(self.launchers, self.cluster, transport="tcp",
                                     dirs={n.name: Path(n.workdir) / "target-dfs" for n in self.cluster.nodes}
                                     ).start()
        return self._store

    def close(self) -> None:
        engine, store, self._engine, self._store = self._engine, self._store, None, None
        try:
            if engine is not None:
                engine.close()
        finally:
            if store is not None:
                store.stop()

    def scratch(self) -> Scratch:
        """Job data lives on the cluster's shared dir: every node's workers read and write it."""
        if self.cluster.shared is None:
            raise TargetUnavailable(self.name, f"cluster {self.cluster.source} has no shared dir; MapReduce "
                                    "jobs need one for input/output")
        Path(self.cluster.shared).mkdir(parents=True, exist_ok=True)
        return Scratch(Path(tempfile.mkdtemp(prefix="mapreduce-", dir=self.cluster.shared)))

    def check_config(self, config, where="--config"):
        """A MapReduce job's configuration is the engine's (transport, intermediate, shuffle, net)."""
        from ..reference.mapreduce.engine.config import parse_config
        parse_config(config, where)

    def _runnable(self, config: str):
        from ..cluster.model import cross_host_reason
        from ..reference.mapreduce.engine.config import parse_config
        parsed = parse_config(config)
        reason = cross_host_reason(parsed.transport, self.cluster.nodes)
        if reason:
            raise TargetUnavailable(self.name, f"{reason} (cluster {self.cluster.source})")
        return parsed

    # -- MapReduce -----------------------------------------------------------------------------------
    def teragen(self, rows, outdir, *, maps=1, start_row=0, config=""):
        from ..reference.mapreduce.engine import jobs
        # a map-only job: no setting of the engine's reaches it (no shuffle, output to the given dir), so
        # the name is only checked; a crosscheck of teragen across engine configurations is a null test
        self._runnable(config)
        return _result(jobs.teragen(self.engine, rows, outdir, maps=maps, start_row=start_row))

    def terasort(self, indir, outdir, *, reduces=1, config="", maps=None):
        from ..reference.mapreduce.engine import jobs
        parsed = self._runnable(config)
        return _result(jobs.terasort(self.engine, indir, outdir, reduces=reduces, config=parsed, maps=maps))

    def teravalidate(self, outdir, reportdir):
        from ..reference.mapreduce.engine import jobs
        return _result(jobs.teravalidate(self.engine, outdir, reportdir))

    def randomwriter(self, outdir, total_bytes, *, maps=1):
        from ..reference.mapreduce.engine import jobs
        return _result(jobs.randomwriter(self.engine, outdir, total_bytes, maps=maps))

    def sort(self, indir, outdir, *, reduces=1, config=""):
        from ..reference.mapreduce.engine import jobs
        parsed = self._runnable(config)
        return _result(jobs.sort(self.engine, indir, outdir, reduces=reduces, config=parsed))

    def job_record(self, result):
        """The engine's record of a job, in YARN's shape: its id; FINISHED/SUCCEEDED (a job that fails
        raises ``JobFailed`` instead of leaving a record); elapsedTime, the driver's wall time of the job;
        vcoreSeconds, the slot-seconds its task attempts held (``Engine.slot_seconds``: allocation time, as
        YARN counts a 1-vcore container, not CPU time); no memorySeconds (workers have no memory grant)."""
        r = result.raw
        return JobRecord(r.id, "FINISHED", "SUCCEEDED", round(r.seconds * 1000), round(r.slot_seconds, 3), None)

    def sortvalidate(self, indir, outdir):
        from ..reference.mapreduce import sortvalidate
        t0 = time.perf_counter()
        check = sortvalidate.sortvalidate(indir, outdir)
        return WorkloadResult("sortvalidate", time.perf_counter() - t0, check.input_stats.records,
                              {"lines": list(check.lines), "valid": check.ok}, check)

    # -- TestDFSIO -----------------------------------------------------------------------------------
    def dfsio(self, args, *, res_file):
        from ..workloads.dfsio import FsTarget, parse_dfsio_args, run_dfsio
        store = self.blockstore()
        fs = FsTarget("blockstore", store=store.spec(replication=min(3, len(self.cluster.nodes))))
        t0 = time.perf_counter()
        result = run_dfsio(parse_dfsio_args([*args, "-resFile", str(res_file)]), fs, self.launchers, self.cluster)
        seconds = time.perf_counter() - t0
        if result is None:      # -clean
            return WorkloadResult("dfsio", seconds)
        details = {"test_type": result.test_type, "nr_files": float(result.nr_files), "total_mb": result.total_mb,
                   "throughput": result.throughput, "average_io_rate": result.average_io_rate,
                   "io_rate_std": result.io_rate_std, "exec_sec": result.exec_sec}
        return WorkloadResult("dfsio", seconds, result.nr_files, details, result)

    # -- RPC -----------------------------------------------------------------------------------------
    @contextmanager
    def rpc_server(self, *, threads=4):
        from ..reference.rpc.hadoop_bench import bench_server
        with bench_server(handlers=threads) as server:
            yield tuple(server.address)

    def rpc_client(self, address, *, clients, seconds, msg_size):
        from ..reference.rpc.hadoop_bench import calls_per_second
        t0 = time.perf_counter()
        rate = calls_per_second(tuple(address), clients=clients, seconds=seconds, msg_size=msg_size)
        return WorkloadResult("rpc_client", time.perf_counter() - t0, None, {"calls_per_second": rate})
