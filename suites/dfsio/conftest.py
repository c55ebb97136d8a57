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
def _reference_only(reference_only):
    """This suite's tests not marked ``hadoop`` skip under another target (see ``reference_only``)."""
