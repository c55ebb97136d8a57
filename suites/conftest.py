"""Fixtures more than one suite uses."""

import pytest


def _reference_only_reason(target_name: str) -> str:
    return (f"exercises the reference implementation; target is {target_name!r} "
            "(the tests written against the target fixture run on it)")


@pytest.fixture
def reference_only(request, hpcnet):
    """A test that drives the reference implementation directly (not through the ``target`` fixture's
    workloads, and not marked ``hadoop``) would not test another target (``--hpcnet-target hadoop``), so
    it says so and skips there. The mapreduce, dfsio and rpc suites use it for every test (their
    conftests make it autouse); their tests written against ``target`` run on every target."""
    target = hpcnet.target
    uses_target = "target" in getattr(request.node, "fixturenames", ())
    if target.name != "reference" and not uses_target and request.node.get_closest_marker("hadoop") is None:
        pytest.skip(_reference_only_reason(target.name))


@pytest.fixture(scope="session")
def reference_target_only(hpcnet):
    """``reference_only`` for a session or module fixture that starts reference processes (it is set up
    before a test's function fixtures, so it skips before anything starts)."""
    if hpcnet.target.name != "reference":
        pytest.skip(_reference_only_reason(hpcnet.target.name))


@pytest.fixture
def scratch(target):
    """A fresh place for this test's job data on the target (``targets.Scratch``: ``local(name)``, a
    directory here; ``path(name)``, on the target's own file system); removed after the test."""
    s = target.scratch()
    yield s
    s.cleanup()


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
