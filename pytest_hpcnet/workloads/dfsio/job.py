"""The DFSIO job: one task per file, spread round-robin over the cluster's nodes, run concurrently
through the launchers; then TestDFSIO's statistics over the tasks' reports.

``Test exec time`` is the wall time from launching the first task to the last one finishing (it
includes process start-up, as Hadoop's includes job scheduling); throughput and IO rates use only
the tasks' own I/O times.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...cluster.pool import Launchers
from ...errors import ConfigError, HpcnetError
from .fs import FSYNC_POLICIES, file_name
from .options import DfsioOptions
from .results import DfsioResult, TaskResult

BLOCKSTORE_FSYNC = ("none", "close")    # a datanode syncs whole replicas, not a client's buffers

TASK_MODULE = "pytest_hpcnet.workloads.dfsio.task"


class DfsioError(HpcnetError, RuntimeError):
    """A task failed; the message names the task, its node and its error line."""


@dataclass
class FsTarget:
    """Where the files go. ``root`` for posix: a path, or "local" (each node's own directory:
    ``node_dirs[name]`` if given, else ``<work dir>/dfsio``) or "shared" (the cluster's shared dir).
    ``store`` for the block store: ``BlockStore.spec()``; ``fsync`` asks for its datanodes' policy
    (``close``: each replica is synced before it is acknowledged), and the store's spec says what they
    were started with, which is what a result reports."""

    kind: str
    root: str | None = None
    fsync: str = "none"
    store: dict | None = None
    node_dirs: dict = field(default_factory=dict)

    def spec_for(self, node, cluster) -> dict:
        if self.kind == "blockstore":
            return dict(self.store)
        if self.root == "local":
            root = Path(self.node_dirs.get(node.name) or Path(node.workdir) / "dfsio")
        elif self.root == "shared":
            if cluster.shared is None:
                raise ConfigError(f"cluster {cluster.name} has no shared dir", "--fs posix:shared")
            root = Path(cluster.shared) / "dfsio"
        else:
            root = Path(self.root)
        return {"kind": "posix", "root": str(root), "fsync": self.fsync}

    def describe(self) -> dict:
        if self.kind == "blockstore":
            return {"fs": "blockstore", "transport": self.store["transport"],
                    "replication": self.store["replication"], "block_size": self.store["block_size"],
                    "fsync": "close" if self.store.get("sync_on_close") else "none"}
        return {"fs": f"posix:{self.root}", "fsync": self.fsync}

    @property
    def node_local(self) -> bool:
        return self.kind == "posix" and self.root == "local"


def parse_fs(text: str, fsync: str = "none") -> FsTarget:
    """``posix:/path``, ``posix:local``, ``posix:shared`` or ``blockstore`` (store given later)."""
    if fsync not in FSYNC_POLICIES:
        raise ConfigError(f"unknown fsync policy {fsync!r}; choose one of {', '.join(FSYNC_POLICIES)}",
                          "--fsync")
    if text == "blockstore":
        if fsync not in BLOCKSTORE_FSYNC:
            raise ConfigError(f"{fsync!r} is for posix targets; the block store's datanodes sync a replica "
                              f"when it is closed (close, HDFS's dfs.datanode.synconclose) or leave it to the "
                              f"page cache (none)", "--fsync")
        return FsTarget("blockstore", fsync=fsync)
    kind, _, root = text.partition(":")
    if kind != "posix" or not root:
        raise ConfigError(f"{text!r}: expected posix:/path, posix:local, posix:shared or blockstore", "--fs")
    if root not in ("local", "shared") and not Path(root).is_absolute():
        raise ConfigError(f"{text!r}: the posix directory must be an absolute path", "--fs")
    return FsTarget("posix", root=root, fsync=fsync)


def run_dfsio(opts: DfsioOptions, target: FsTarget, launchers: Launchers, cluster, *, nodes=None,
              verify: bool = False, timeout: float = 600.0, write_res_file: bool = True,
              seed: int | None = None, progress=None) -> DfsioResult | None:
    """Run one TestDFSIO job; returns its result (None for -clean) and appends the block to
    ``opts.res_file`` unless ``write_res_file`` is false. ``progress(1)`` hears of each file done."""
    nodes = list(nodes or cluster.nodes)
    if opts.test_type == "cleanup":
        _clean(target, launchers, cluster, nodes, timeout)
        return None
    if opts.test_type == "write":      # TestDFSIO deletes the data dir before writing
        _clean(target, launchers, cluster, nodes, timeout)
    specs = []
    for i in range(opts.nr_files):
        node = nodes[i % len(nodes)]
        specs.append((node, {"op": opts.test_type, "name": file_name(i), "size": opts.size,
                             "buffer_size": opts.buffer_size, "skip_size": opts.skip_size,
                             "compression": opts.compression, "verify": verify,
                             "seed": None if seed is None else seed + i,
                             "fs": target.spec_for(node, cluster)}))
    t0 = time.perf_counter()
    outputs = _run_tasks(launchers, specs, timeout, progress)
    exec_ms = (time.perf_counter() - t0) * 1000.0
    tasks = [TaskResult(r["name"], int(r["size"]), float(r["time_ms"]), r.get("node", ""))
             for r in outputs]
    config = dict(target.describe())
    if opts.compression:
        config["compression"] = opts.compression
    result = DfsioResult(opts.test_type, tasks, exec_ms, config=config)
    if write_res_file and opts.res_file:
        result.append_to(opts.res_file)
    return result


def _clean(target: FsTarget, launchers, cluster, nodes, timeout) -> None:
    where = nodes if target.node_local else nodes[:1]
    _run_tasks(launchers, [(n, {"op": "clean", "name": "clean", "size": 0, "buffer_size": 1,
                                "fs": target.spec_for(n, cluster)}) for n in where], timeout)


def _run_tasks(launchers, specs, timeout: float, progress=None) -> list[dict]:
    procs = []
    try:
        for node, spec in specs:
            procs.append((spec, launchers.start(node, [sys.executable, "-m", TASK_MODULE, json.dumps(spec)])))
        deadline = time.monotonic() + timeout
        results = []
        for spec, proc in procs:
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise DfsioError(f"task {spec['name']} on {proc.node.name} did not finish in {timeout:g}s") from None
            out, err = proc.output()
            if code != 0:
                line = (err.strip().splitlines() or [f"exit status {code}"])[-1]
                raise DfsioError(f"task {spec['name']} on {proc.node.name} failed: {line}")
            report = json.loads(out.strip().splitlines()[-1])
            report["node"] = proc.node.name      # where we launched it (launchers need not set HPCNET_NODE)
            results.append(report)
            if progress is not None:
                progress(1)
        return results
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
