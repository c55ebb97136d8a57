"""The separate-daemon deployment's bad inputs, without root or jars (its jobs run in
suites/crosscheck/test_ozone.py): a daemon that cannot start is one line naming it, its node and its
log, and nothing it started outlives ``close()``."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from pytest_hpcnet import cluster
from pytest_hpcnet.targets.hadoop.runtime import HadoopRuntime
from pytest_hpcnet.targets.ozone.daemons import DaemonError
from pytest_hpcnet.targets.ozone.deployment import Deployment, placement

JAVA = shutil.which("java")


def test_storage_takes_the_first_half_of_the_nodes_and_yarn_the_rest():
    assert placement(["a", "b", "c", "d"]) == (["a", "b"], ["c", "d"])
    assert placement(["a", "b", "c"]) == (["a", "b"], ["c"])
    assert placement(["a"]) == (["a"], ["a"])


@pytest.mark.skipif(JAVA is None, reason="no java on PATH")
def test_a_daemon_that_cannot_start_names_itself_and_its_log_and_leaves_no_jvm(tmp_path):
    empty = tmp_path / "no-jars"
    empty.mkdir()
    rt = HadoopRuntime(java=JAVA, jar_dir=empty)          # no classes: the NameNode's format exits 1
    with cluster.open("local:2", tmp_path / "c") as (built, launchers):
        d = Deployment(rt, empty, built, launchers, tmp_path / "dep", start_timeout=60)
        try:
            with pytest.raises(DaemonError) as info:
                d.start()
        finally:
            d.close()
    first = str(info.value).splitlines()[0]
    assert first.startswith("namenode on node0 exited with status 1 (log: ") and first.endswith("namenode.log)")
    assert "ClassNotFoundException" in str(info.value) or "Could not find or load main class" in str(info.value)
    left = subprocess.run(["pgrep", "-f", f"java.*{tmp_path}"], capture_output=True, text=True).stdout
    assert not left.split(), f"JVMs left behind: {left}"


@pytest.mark.skipif(JAVA is None, reason="no java on PATH")
def test_an_ozone_start_that_fails_is_tried_once_more_then_named(tmp_path):
    """A failed Ozone start is stopped and tried once more (kept in describe()); a second failure is
    the one-line error. Ozone's daemons get a log4j configuration, so what they log reaches their log."""
    empty = tmp_path / "no-jars"
    empty.mkdir()
    rt = HadoopRuntime(java=JAVA, jar_dir=empty)          # no classes: SCM's --init exits 1
    with cluster.open("local:2", tmp_path / "c") as (built, launchers):
        d = Deployment(rt, empty, built, launchers, tmp_path / "dep", start_timeout=60)
        try:
            with pytest.raises(DaemonError, match=r"^scm-file-per-block-init on node0 exited with status 1"):
                d.ozone_root("FILE_PER_BLOCK")
            retried = d.describe()["retried"]
            assert len(retried) == 1 and retried[0].startswith("ozone FILE_PER_BLOCK: scm-file-per-block-init on node0")
            assert len(d.daemons) == 1                    # the second attempt's init; the first one's is gone
            assert list(tmp_path.glob("**/scm-file-per-block-init/conf/log4j.properties"))
        finally:
            d.close()
