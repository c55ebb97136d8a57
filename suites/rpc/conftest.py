"""Fixtures of the rpc suite: a server node and a client node, and the reference's echo servers started
on the server node through the cluster's launchers (``pytest_hpcnet.workloads.rpc``). ``server`` is shared by a
module's tests per transport (a server start costs ~1 s on a busy 2-core box, and the conformance
tests check that the server keeps serving after whatever they did to it); ``serve`` starts fresh ones
that are killed after the test."""

from __future__ import annotations

import pytest

from pytest_hpcnet.workloads import rpc as wr

# verbs carries the markers of what it needs, so the conformance tests run over it where an RDMA device
# is (real RDMA, or the Soft-RoCE guest's `pytest -m rdma suites`) and skip, naming it, elsewhere
TRANSPORTS = ["tcp", "shm", pytest.param("verbs", marks=[pytest.mark.rdma, pytest.mark.pyverbs])]


@pytest.fixture(autouse=True)
def _reference_only(reference_only):
    """This suite's tests not written against ``target`` skip under another target (``reference_only``)."""


@pytest.fixture(scope="session")
def nodes(cluster, reference_target_only):
    """(server node, client node): two different nodes of the cluster under test, for the reference's
    servers (under another target, the tests that start them skip before any starts)."""
    if len(cluster.nodes) < 2:
        pytest.skip(f"needs two nodes, cluster {cluster.source} has {len(cluster.nodes)}")
    return cluster.nodes[1], cluster.nodes[0]


def skip_unless_same_host(nodes) -> None:
    """shm reaches only a server on this host (and network namespace): skip with the reason elsewhere."""
    server, client = nodes
    if server.host != client.host or server.launcher != "local":
        pytest.skip(f"shm needs the server on this host; node {server.name} is on {server.host} "
                    f"via {server.launcher}")


def skip_unless_native_speaks(transport: str, pair) -> None:
    """Skip, with the core's one-line reason, where an impl of ``pair`` is native and the core is not
    built or (over verbs) cannot speak verbs here."""
    if "native" not in pair:
        return
    from pytest_hpcnet.reference import native
    if not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    if transport == "verbs":
        from pytest_hpcnet.reference.rpc.native import native_verbs_unavailable
        why = native_verbs_unavailable()
        if why:
            pytest.skip(f"native verbs: {why}")


class _Starter:
    """Starts servers of implementation ``impls[0]``; each ``Served`` gets ``client_impl = impls[1]``,
    the implementation the tests' clients of it use."""

    def __init__(self, launchers, node, impls: tuple[str, str] = ("python", "python")):
        self.launchers, self.node, self.started = launchers, node, []
        self.impls = impls

    def __call__(self, transport: str, buffers: str = "pooled", **options) -> wr.Served:
        options.setdefault("impl", self.impls[0])
        s = wr.start_server(self.launchers, self.node, transport=transport, buffers=buffers, **options)
        s.client_impl = self.impls[1]
        self.started.append(s)
        return s

    def stop(self) -> None:
        for s in self.started:
            s.proc.kill()


@pytest.fixture
def serve(nodes, launchers):
    """``serve(transport, buffers="pooled", **options) -> Served`` on the server node."""
    starter = _Starter(launchers, nodes[0])
    yield starter
    starter.stop()


@pytest.fixture(scope="module", params=TRANSPORTS)
def transport(request, nodes):
    if request.param == "shm":
        skip_unless_same_host(nodes)
    return request.param


@pytest.fixture(scope="module")
def server(nodes, launchers, transport):
    """An echo server (echo, ping, sleepEcho, fail) over ``transport`` on the server node."""
    starter = _Starter(launchers, nodes[0])
    yield starter(transport)
    starter.stop()
