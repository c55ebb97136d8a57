"""QJump (seed 004, Figure 1c): barrier-sync latency alone, under bulk interference, and with the
barrier at a high QJump level - on a netns cluster this suite builds for itself.

The run's default cluster (local:N) has no network to shape, so the suite builds ``netns:4`` with a
200 Mbit/s HTB bottleneck on every node's egress and tears it down afterwards (checked by the last
test). Ten repetitions, interleaved, of 200 rounds per scenario = 2,000 samples per scenario; the claims
pair the scenarios by repetition, so ten repetitions give them ten paired rounds.
Latencies are barrier round times (every process's message reached every other: one round trip's
worth of waiting, not RTT/2), in µs.

Parameters: bytesq=256 timeq=20 p0rate=100, other levels 1x -> level 7 may use 102.4 Mbit/s, about
half the link, as the Naiad run's 5 Gb/s was of its 10 GbE. The barrier processes run under
SCHED_FIFO (``chrt -f 10``) in every scenario so that other programs' CPU load on a shared 2-core
machine does not masquerade as network latency; the bulk flows run at normal priority.

Claims (claims.toml): interference raises p99 >= 10x and p50 >= 20x over alone; at level 7 the p99 stays
within 2x of alone and is >= 90% below the interference case. Interference is plain bulk TCP: the
reference MapReduce shuffle cannot run across a cluster's nodes yet.
"""

import os
import re
import shutil
import subprocess

import pytest

from pytest_hpcnet.cluster import netns
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.workloads.qjump import scenarios
from pytest_hpcnet.report.bsfile import read_bs
from pytest_hpcnet.cluster.shaping import QJumpParams

pytestmark = pytest.mark.netns

NODES = 4
LINK_RATE = "200mbit"
PARAMS = QJumpParams(bytesq=256, timeq=20, rates=(100, 1, 1, 1, 1, 1, 1, 1))
LEVEL = 7
FLOWS = 4
ROUNDS = 200
REPETITIONS = 10
REALTIME = ("chrt", "-f", "10") if shutil.which("chrt") else ()  # util-linux; without it: normal priority


# The root namespace's end of another process's netns cluster (pytest_hpcnet.cluster.netns names it
# hn<pid>c<seq>): another run on the same machine may add or remove those while this one runs.
_CONTROLLER_LINK = re.compile(r"hn(\d+)c\d+")


def _not_another_runs(device: str) -> bool:
    m = _CONTROLLER_LINK.fullmatch(device.split("@")[0])
    return not m or int(m.group(1)) == os.getpid()


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {name for line in out.splitlines() if _not_another_runs(name := line.split(":")[1].strip())}


def _root_qdiscs() -> set[str]:
    out = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=True).stdout
    return {line.strip() for line in out.splitlines()
            if not (m := re.search(r" dev (\S+)", line)) or _not_another_runs(m.group(1))}


class QJumpRun:
    """The suite's own netns cluster and the experiment run on it; ``close()`` is idempotent."""

    def __init__(self, root):
        self.links_before, self.qdiscs_before = _root_links(), _root_qdiscs()
        self.cluster = netns.netns_cluster(NODES, root / "cluster", link_rate=LINK_RATE, qjump=PARAMS)
        self.namespaces = {n.extra["netns"]["namespace"] for n in self.cluster.nodes}
        self.launchers = Launchers(self.cluster, root / "logs")
        self.outdir = root / "bs"
        self.experiment = None

    def run(self):
        self.experiment = scenarios.run_experiment(
            self.launchers, self.cluster.nodes, self.outdir, rounds=ROUNDS, repetitions=REPETITIONS,
            warmup=100, flows=FLOWS, level=LEVEL, prefix=REALTIME)
        return self.experiment

    def close(self):
        try:
            self.launchers.close()  # kills every process, then tears the namespaces down
        finally:
            netns.teardown(self.cluster)


@pytest.fixture(scope="module")
def qjump_run(tmp_path_factory):
    run = QJumpRun(tmp_path_factory.mktemp("qjump"))
    try:
        run.run()
        yield run
    finally:  # also on failure and Ctrl-C (KeyboardInterrupt passes through here)
        run.close()


def test_three_scenarios_are_measured(qjump_run, measure):
    exp = qjump_run.experiment
    ms = scenarios.measurements(exp, qjump_run.cluster.nodes, level=LEVEL, flows=FLOWS, rounds=ROUNDS,
                                link_rate=LINK_RATE, cluster=qjump_run.cluster.source)
    measure.record(*ms)
    for scenario in scenarios.SCENARIOS:
        files = exp.files[scenario]
        assert len(files) == REPETITIONS and all(len(f) == NODES for f in files)
        assert all(len(read_bs(path)) == ROUNDS for rep in files for path in rep)
    by = {(m.config, m.metric.rsplit(".", 1)[1]): m for m in ms}
    for scenario in scenarios.SCENARIOS:
        assert 0 < by[scenario, "p50"].value <= by[scenario, "p99"].value <= by[scenario, "p99_9"].value
    # the bulk flows really ran: the default level carried far more while they did than without them
    busy, quiet = by["interference", "throughput"].value, by["alone", "throughput"].value
    assert busy > 10 * max(quiet, 0.01), f"default level sent {busy:.3g} Mbit/s per node with bulk flows"


def test_interference_raises_the_tail(qjump_run, claim):
    exp = qjump_run.experiment
    claim("qjump.interference.p99", exp.percentile_series("alone", 99), exp.percentile_series("interference", 99))


def test_interference_raises_the_median(qjump_run, claim):
    exp = qjump_run.experiment
    claim("qjump.interference.p50", exp.percentile_series("alone", 50), exp.percentile_series("interference", 50))


def test_priority_restores_the_tail(qjump_run, claim):
    exp = qjump_run.experiment
    claim("qjump.priority.p99", exp.percentile_series("alone", 99), exp.percentile_series("qjump", 99))


def test_priority_cuts_the_interference_tail(qjump_run, claim):
    exp = qjump_run.experiment
    claim("qjump.priority.p99_vs_interference", exp.percentile_series("interference", 99),
          exp.percentile_series("qjump", 99))


def test_teardown_leaves_nothing(qjump_run):
    qjump_run.close()
    qjump_run.close()  # idempotent
    assert not qjump_run.namespaces & set(netns.namespaces())
    leftovers = _root_links() - qjump_run.links_before   # another run's links are not counted
    assert not leftovers, f"interfaces left in the root namespace: {sorted(leftovers)}"
    assert _root_qdiscs() == qjump_run.qdiscs_before
