"""The verbs transport under a bulk user: the block store's replication pipeline over verbs writing
and reading back a file that verifies (three datanodes, every block replicated three times), with
its per-packet work in Python over pyverbs, in the native core over the native verbs end, and mixed
(native and pyverbs ends relaying to each other both ways); and a datanode killed mid-write, which the
pipeline recovers from.

Needs an RDMA device and pyverbs (``hpcnet vm test`` runs these on Soft-RoCE in a QEMU guest).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.reference.dfs.store import BlockStore

pytestmark = [pytest.mark.rdma, pytest.mark.pyverbs]
KB = 1024


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    cluster = local_cluster(3, tmp_path_factory.mktemp("verbs-cluster"))
    with Launchers(cluster, tmp_path_factory.mktemp("verbs-logs")) as launchers:
        yield cluster, launchers


# (client, datanodes node0..node2) per pipeline: who runs the per-packet work at each end. Over verbs,
# impl=native is the native core over the native verbs end, impl=python the Python loop over pyverbs.
PIPELINES = {
    "python": ("python", "python"),
    "native": ("native", "native"),
    # native client -> pyverbs head -> native middle -> pyverbs tail, and the other way round
    "mixed-native-client": ("native", {"node0": "python", "node1": "native", "node2": "python"}),
    "mixed-native-head": ("python", {"node0": "native", "node1": "python", "node2": "native"}),
}


def _native_verbs_or_skip(pipeline: str) -> None:
    if pipeline != "python":
        from pytest_hpcnet.reference.transport.verbs import native as native_verbs
        why = native_verbs.unavailable()
        if why:
            pytest.skip(f"native verbs: {why}")


def _store(three_nodes, tmp_path, pipeline: str) -> tuple[BlockStore, str]:
    cluster, launchers = three_nodes
    writer, datanodes = PIPELINES[pipeline]
    store = BlockStore(launchers, cluster, transport="verbs", impl=datanodes,
                       dirs={n.name: tmp_path / n.name for n in cluster.nodes})
    return store, writer


@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_block_store_pipeline_over_verbs_writes_and_reads_back(three_nodes, tmp_path, pipeline):
    _native_verbs_or_skip(pipeline)
    block = 256 * KB
    store, writer = _store(three_nodes, tmp_path, pipeline)
    with store.start():
        with store.client(replication=3, block_size=block, packet_size=16 * KB, impl=writer) as client:
            assert client.pipeline_impl == writer
            assert getattr(client.transport, "native", False) == (writer == "native")
            data = os.urandom(3 * block + 12345)
            with client.create("/v/f") as out:
                for i in range(0, len(data), 100_000):
                    out.write(data[i:i + 100_000])
            info = client.meta("get", path="/v/f")
            assert len(info["blocks"]) == 4 and all(len(b["locations"]) == 3 for b in info["blocks"])
            back = client.open("/v/f").read()
            assert hashlib.sha256(back).hexdigest() == hashlib.sha256(data).hexdigest()
            assert client.open("/v/f").pread(block - 10, 20) == data[block - 10:block + 10]
            for loc in info["blocks"][0]["locations"]:   # each replica alone, verified
                assert client.read_block(loc, info["blocks"][0], 0, block) == data[:block]
    # every replica of every block is on disk on each of the three datanodes
    replicas = [p for d in store.dirs.values() for p in (d / "data").glob("blk_*") if not p.name.endswith(".meta")]
    assert len({p.name for p in replicas}) >= 4


@pytest.mark.parametrize("pipeline", ["native", "mixed-native-head"])
def test_a_datanode_killed_mid_write_over_verbs_is_recovered_from(three_nodes, tmp_path, pipeline):
    """The middle datanode dies mid-block: its neighbours see the verbs peer gone (the head's
    responder is cut, not left waiting for an ack), the client rebuilds the pipeline from the two
    survivors, and the file reads back whole."""
    _native_verbs_or_skip(pipeline)
    block = 256 * KB
    store, writer = _store(three_nodes, tmp_path, pipeline)
    with store.start():
        with store.client(replication=3, block_size=block, packet_size=16 * KB, impl=writer) as client:
            data = os.urandom(2 * block)
            out, victim = store.write_killing(client, "/v/k", data, block // 2, position=1)
            assert [name for name, _ in out.failures] == [victim]
            blocks = client.meta("get", path="/v/k")["blocks"]
            assert all(victim not in [loc["name"] for loc in b["locations"]] for b in blocks)
            assert client.open("/v/k").read() == data
