"""The verbs transport under a bulk user: the block store's replication pipeline over verbs writing
and reading back a file that verifies (three datanodes, every block replicated three times).

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


def test_block_store_pipeline_over_verbs_writes_and_reads_back(three_nodes, tmp_path):
    cluster, launchers = three_nodes
    dirs = {n.name: tmp_path / n.name for n in cluster.nodes}
    block = 256 * KB
    with BlockStore(launchers, cluster, transport="verbs", dirs=dirs).start() as store:
        with store.client(replication=3, block_size=block, packet_size=16 * KB) as client:
            data = os.urandom(3 * block + 12345)
            with client.create("/v/f") as out:
                for i in range(0, len(data), 100_000):
                    out.write(data[i:i + 100_000])
            info = client.meta("get", path="/v/f")
            assert len(info["blocks"]) == 4 and all(len(b["locations"]) == 3 for b in info["blocks"])
            back = client.open("/v/f").read()
            assert hashlib.sha256(back).hexdigest() == hashlib.sha256(data).hexdigest()
            assert client.open("/v/f").pread(block - 10, 20) == data[block - 10:block + 10]
    # every replica of every block is on disk on each of the three datanodes
    replicas = [p for d in dirs.values() for p in (d / "data").glob("blk_*") if not p.name.endswith(".meta")]
    assert len({p.name for p in replicas}) >= 4
