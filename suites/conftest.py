"""Fixtures more than one suite uses."""

import pytest

from pytest_hpcnet.targets.hadoop.runtime import HadoopUnavailable, find_runtime
from pytest_hpcnet.targets.hadoop.shared import shared_minicluster


@pytest.fixture(scope="session")   # session-wide: every suite shares the one MiniCluster
def hadoop_target(target, tmp_path_factory):
    """(runtime, MiniCluster) when the run's target is Hadoop (``--hpcnet-target hadoop``)."""
    if target.name != "hadoop":
        pytest.skip(f"target is {target.name!r}; these run with --hpcnet-target hadoop")
    try:
        rt = find_runtime()
    except HadoopUnavailable as e:
        pytest.skip(f"Hadoop unavailable: {e}")
    with shared_minicluster(rt, tmp_path_factory.mktemp("minicluster")) as mc:
        yield rt, mc


@pytest.fixture
def reference_only(request, target):
    """Tests not marked ``hadoop`` drive the reference implementation directly; under another target
    (``--hpcnet-target hadoop``) they would not test that target, so they say so and skip. The mapreduce
    and dfsio suites use it for every test (their conftests make it autouse)."""
    if target.name != "reference" and request.node.get_closest_marker("hadoop") is None:
        pytest.skip(f"exercises the reference implementation; target is {target.name!r} "
                    f"(its tests are the test_hadoop_* files)")


@pytest.fixture
def needs_one_host(cluster):
    """``needs_one_host(transport, nodes=None)``: skip, naming the nodes and their hosts, when the
    transport cannot connect them (shm between hosts, e.g. on netns:N); the workload would refuse it."""
    from pytest_hpcnet.cluster.model import cross_host_reason

    def check(transport: str, nodes=None) -> None:
        reason = cross_host_reason(transport, nodes or cluster.nodes)
        if reason:
            pytest.skip(f"{reason} (cluster {cluster.source})")
    return check
