"""Fixtures the dfsio suite shares: a TestDFSIO job runner over a running block store."""

import pytest

from pytest_hpcnet.reference.dfs.store import BlockStore


@pytest.fixture
def blockstore(launchers, cluster, workdirs):
    """A fresh block store over tcp on every node (fresh dirs from ``workdirs``); stopped after."""
    with BlockStore(launchers, cluster, transport="tcp",
                    dirs={name: path / "dfs" for name, path in workdirs.items()}).start() as store:
        yield store


@pytest.fixture(autouse=True)
def _reference_only(request, target):
    """Tests not marked ``hadoop`` drive the reference implementation directly; under another target
    (``--hpcnet-target hadoop``) they would not test that target, so they say so and skip."""
    if target.name != "reference" and request.node.get_closest_marker("hadoop") is None:
        pytest.skip(f"exercises the reference implementation; target is {target.name!r} "
                    f"(its tests are the test_hadoop_* files)")
