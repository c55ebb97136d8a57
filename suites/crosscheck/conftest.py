"""Fixtures for test_hadoop.py, which drives real Apache Hadoop beside the reference: the runtime (skip
when Java or the jars are missing) and one MiniCluster for the whole session (HDFS + YARN, 2
nodemanagers, 2 datanodes; the process's one, shared with the hadoop target's workloads).
test_crosscheck.py is written against the ``target`` fixture instead."""

from __future__ import annotations

import pytest

from pytest_hpcnet.targets.hadoop.runtime import HadoopUnavailable, find_runtime
from pytest_hpcnet.targets.hadoop.shared import shared_minicluster


@pytest.fixture(scope="session")
def hadoop_runtime():
    try:
        return find_runtime()
    except HadoopUnavailable as e:
        pytest.skip(f"Hadoop unavailable: {e}")


@pytest.fixture(scope="session")
def hadoop(hadoop_runtime, tmp_path_factory):
    """A running MiniCluster: ``.conf_dir`` for clients, ``.rm_web``, ``.default_fs``."""
    with shared_minicluster(hadoop_runtime, tmp_path_factory.mktemp("minicluster"),
                            nodemanagers=2, datanodes=2) as mc:
        yield mc
