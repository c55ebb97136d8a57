"""``BlockStore``: the metadata service and one datanode per cluster node, started through launchers.

    with BlockStore(launchers, cluster, transport="shm", dirs=workdirs).start() as store:
        client = store.client(replication=2, block_size=4 << 20)

``spec()`` is a JSON-able description tasks on other nodes use to build their own ``DfsClient``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ...cluster.model import cross_host_reason
from ...cluster.nodeprogram import await_ready
from ...errors import ConfigError
from ..transport import TRANSPORTS
from . import checksums
from .client import DEFAULT_BLOCK_SIZE, DfsClient
from .native import resolve_impl


class BlockStore:
    def __init__(self, launchers, cluster, *, transport: str = "tcp", dirs: dict | None = None,
                 network: str = "eth", nodes=None, impl: str | dict | None = None,
                 sync_on_close: bool = False):
        if transport not in TRANSPORTS:
            raise ConfigError(f"unknown transport {transport!r}; choose one of {sorted(TRANSPORTS)}",
                              "blockstore transport")
        self.launchers, self.cluster, self.transport = launchers, cluster, transport
        self.network = network
        self.sync_on_close = bool(sync_on_close)   # HDFS's dfs.datanode.synconclose, on every datanode
        self.nodes = tuple(nodes or cluster.nodes)
        reason = cross_host_reason(transport, self.nodes)
        if reason:   # datanodes pipeline to each other: every pair must be reachable
            raise ConfigError(f"{reason} (cluster {cluster.name!r})", "blockstore transport")
        # who runs each datanode's packet pipeline: one impl for all, or a node name -> impl map
        # (a mixed pipeline: native and Python stages interoperate)
        impls = impl if isinstance(impl, dict) else {n.name: impl for n in self.nodes}
        self.impls = {n.name: resolve_impl(impls.get(n.name), transport) for n in self.nodes}
        self.dirs = {n.name: Path(dirs[n.name]) if dirs else Path(n.workdir) / "dfs" for n in self.nodes}
        self.meta = None
        self.datanodes: dict[str, object] = {}
        self.meta_address: tuple[str, int] | None = None

    def start(self, timeout: float = 30.0) -> "BlockStore":
        head = self.nodes[0]
        try:
            self.meta = self.launchers.start(head, [
                sys.executable, "-m", "pytest_hpcnet.reference.dfs.metaservice",
                "--dir", str(self.dirs[head.name] / "meta"), "--host", head.address(self.network)])
            self.meta_address = await_ready(self.meta, timeout=timeout).address
            for node in self.nodes:
                self.start_datanode(node, wait=False)
            for name, proc in self.datanodes.items():
                await_ready(proc, timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_datanode(self, node, wait: bool = True, timeout: float = 30.0):
        host, port = self.meta_address
        proc = self.launchers.start(node, [
            sys.executable, "-m", "pytest_hpcnet.reference.dfs.datanode",
            "--dir", str(self.dirs[node.name] / "data"), "--name", node.name,
            "--transport", self.transport, "--meta", f"{host}:{port}",
            "--host", node.address(self.network), "--impl", self.impls[node.name]]
            + (["--sync-on-close"] if self.sync_on_close else []))
        self.datanodes[node.name] = proc
        if wait:
            await_ready(proc, timeout=timeout)
        return proc

    def kill_datanode(self, name: str) -> None:
        self.datanodes[name].kill()

    def write_killing(self, client, path: str, data, at: int, position: int = 1):
        """Write ``data`` to ``path`` through ``client``, killing the datanode at ``position`` of the
        pipeline once ``at`` bytes are written (the fault the suites inject: the pipeline must recover
        from it). Returns the closed output stream (its ``failures``) and the killed datanode's name."""
        out = client.create(path)
        out.write(data[:at])
        victim = out.pipeline.targets[position]["name"]
        self.kill_datanode(victim)
        out.write(data[at:])
        out.close()
        return out, victim

    def spec(self, *, replication: int = 3, block_size: int = DEFAULT_BLOCK_SIZE,
             checksum: str = checksums.PREFERRED) -> dict:
        return {"kind": "blockstore", "meta": list(self.meta_address), "transport": self.transport,
                "replication": replication, "block_size": block_size, "checksum": checksum,
                "impls": dict(self.impls), "sync_on_close": self.sync_on_close}

    def client(self, **options) -> DfsClient:
        return DfsClient(self.meta_address, self.transport, **options)

    def logs(self) -> str:
        """stderr of every process so far (datanodes log dropped connections there)."""
        procs = ([("metaservice", self.meta)] if self.meta else []) + list(self.datanodes.items())
        return "\n".join(f"--- {name}\n{p.output()[1]}" for name, p in procs)

    def stop(self) -> None:
        for proc in self.datanodes.values():
            proc.kill()
        if self.meta is not None:
            self.meta.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def client_from_spec(spec: dict, node: str | None = None) -> DfsClient:
    return DfsClient(tuple(spec["meta"]), spec["transport"], replication=int(spec["replication"]),
                     block_size=int(spec["block_size"]), node=node,
                     checksum=spec.get("checksum", checksums.DEFAULT))
