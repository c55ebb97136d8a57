"""A worker killed in the middle of a job: the job re-runs its tasks elsewhere and its output validates
with TeraGen's checksum -- or, with no retries left, fails with a clear error and leaves nothing behind."""

from __future__ import annotations

import pytest

from pytest_hpcnet.reference.mapreduce import teravalidate as tv
from pytest_hpcnet.reference.mapreduce.engine import jobs
from pytest_hpcnet.reference.mapreduce.engine.config import parse_config
from pytest_hpcnet.reference.mapreduce.engine.driver import Engine, JobFailed


@pytest.fixture
def two_plus_nodes(cluster):
    if len(cluster.nodes) < 2:
        pytest.skip(f"killing a worker needs at least 2 nodes; {cluster.source} has {len(cluster.nodes)}")
    return cluster


def kill_on(engine, event_name, kind=None):
    killed = []

    def hook(event, **info):
        if event == event_name and (kind is None or info.get("kind") == kind) and not killed:
            killed.append(info["node"])
            engine.worker_process(info["node"]).kill()
    engine.on_event = hook
    return killed


@pytest.mark.parametrize("when,kind,config", [
    ("map_done", None, "transport=tcp,intermediate=local"),
    ("dispatch", "reduce", "transport=shm,intermediate=local"),
    ("dispatch", "reduce", "transport=tcp,intermediate=shared,shuffle=direct"),
], ids=["after-a-map-local-output", "holding-a-reduce-shm", "holding-a-reduce-shared-direct"])
def test_job_survives_a_killed_worker(two_plus_nodes, launchers, shared_dir, when, kind, config, needs_one_host):
    needs_one_host(parse_config(config).transport)
    with Engine(two_plus_nodes, launchers) as engine:      # its own workers: this test kills one
        gen = jobs.teragen(engine, 60_000, shared_dir / "in", maps=3)
        killed = kill_on(engine, when, kind)
        result = jobs.terasort(engine, shared_dir / "in", shared_dir / "out", reduces=3, config=config, maps=6)
    assert killed and result.lost_workers == killed
    assert tv.teravalidate(shared_dir / "out") == [f"checksum\t{gen.details['checksum']}"]


def test_job_without_retries_fails_cleanly(two_plus_nodes, launchers, shared_dir):
    with Engine(two_plus_nodes, launchers, max_attempts=1) as engine:
        jobs.teragen(engine, 60_000, shared_dir / "in", maps=3)
        killed = kill_on(engine, "map_done")
        with pytest.raises(JobFailed, match=r"failed 1 time\(s\), the limit; last error: .*was lost"):
            jobs.terasort(engine, shared_dir / "in", shared_dir / "out", reduces=3, maps=6)
    assert killed
    assert sorted(p.name for p in shared_dir.iterdir()) == ["in"], "output or temporary output left behind"
