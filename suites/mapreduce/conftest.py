"""Fixtures of the mapreduce suite: one engine (a worker per node) for the session -- the reference
target's own, which its conformance jobs run on too -- and a fresh directory on the cluster's shared dir
per test (job input and output must be reachable from every node)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from pytest_hpcnet.reference.mapreduce.engine.driver import Engine


@pytest.fixture(scope="session")
def engine(hpcnet, cluster, launchers):
    """The reference MapReduce engine on the cluster under test; its workers stop at the end."""
    engine = getattr(hpcnet.workloads, "engine", None)   # the reference target's, shared
    if engine is not None:
        yield engine
        return
    with Engine(cluster, launchers) as engine:
        yield engine


@pytest.fixture
def shared_dir(cluster):
    if cluster.shared is None:
        pytest.skip(f"cluster {cluster.source} has no shared dir; MapReduce jobs need one for input/output")
    d = Path(tempfile.mkdtemp(prefix="mapreduce-", dir=cluster.shared))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _reference_only(reference_only):
    """This suite's tests not marked ``hadoop`` skip under another target (see ``reference_only``)."""
