"""The Naiad/QJump experiment's three scenarios on any cluster: barrier-sync latency alone, with bulk
interference at the default level, and with interference while the barrier runs at a high level.

One ``run_experiment`` call runs ``repetitions`` interleaved repetitions (alone, interference, priority;
the bulk flows start once per repetition and run through its second and third scenario), so slow drift
of a shared machine hits all three alike. Every barrier run writes one ``.bs`` file per node.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...cluster.nodeprogram import await_ready
from ...cluster.pool import Launchers, finish
from ...cluster.shaping import DEFAULT_LEVEL, check_level, level_bytes
from ...errors import ConfigError
from ...measure import Measurement, Series, abba, summarize
from ...report.bsfile import read_bs
from ...sockets import free_port

SCENARIOS = ("alone", "interference", "qjump")
METRIC = "qjump.barrier"
NAIAD_PORT = 2101  # the port the Naiad experiment used; one per node when every node has its own address
_BARRIER = "pytest_hpcnet.workloads.qjump.barrier"
_BULK = "pytest_hpcnet.workloads.qjump.bulk"


def barrier_ports(nodes, network: str = "eth") -> list[int]:
    """Naiad's port on every node when addresses differ; distinct free ports when nodes share one
    (a local cluster on loopback, where this process shares the nodes' network)."""
    addresses = [n.address(network) for n in nodes]
    if len(set(addresses)) == len(addresses):
        return [NAIAD_PORT] * len(nodes)
    return [free_port(address) for address in addresses]   # never the same one twice


def run_barrier(launchers: Launchers, nodes, outdir: Path, label: str, *, rounds: int, warmup: int = 100,
                level: int | None = None, size: int = 64, network: str = "eth", prefix=(),
                timeout: float = 300) -> list[Path]:
    """One barrier run over ``nodes``; returns each node's ``.bs`` file (``<label>_<rank>.bs``).

    ``prefix`` goes before the app's command, e.g. ``("chrt", "-f", "10")``: real-time scheduling shields
    the barrier processes from other programs' CPU load, which otherwise dominates the tail of the
    "alone" case on a busy 2-core machine. Every scenario of an experiment gets the same prefix."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    ports = barrier_ports(nodes, network)
    peers = ",".join(f"{n.address(network)}:{p}" for n, p in zip(nodes, ports))
    files = [outdir / f"{label}_{rank}.bs" for rank in range(len(nodes))]
    procs = []
    try:
        for rank, node in enumerate(nodes):
            argv = [*prefix, sys.executable, "-m", _BARRIER, "--rank", str(rank), "--peers", peers, "--rounds", str(rounds),
                    "--warmup", str(warmup), "--size", str(size), "--out", str(files[rank])]
            if level is not None:
                argv += ["--priority", str(check_level(level))]
            procs.append(launchers.start(node, argv))
        deadline = time.monotonic() + timeout
        for proc in procs:
            finish(proc, max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            proc.kill()
    return files


@contextmanager
def bulk_flows(launchers: Launchers, nodes, flows: int = 4, network: str = "eth", settle: float = 0.5):
    """``flows`` bulk TCP flows around the ring of nodes (flow k: node k -> node k+1, mod N), at the
    default level, for the duration of the ``with`` block."""
    if flows < 1 or len(nodes) < 2:
        raise ConfigError(f"interference needs >= 1 flow and >= 2 nodes (got {flows} flows, {len(nodes)} nodes)")
    procs = []
    try:
        sinks = {}
        for k in range(flows):
            dst = nodes[(k + 1) % len(nodes)]
            if dst.name not in sinks:
                host = dst.address(network)
                proc = launchers.start(dst, [sys.executable, "-m", _BULK, "sink", "--host", host, "--port", "0"])
                procs.append(proc)
                sinks[dst.name] = await_ready(proc).address
        for k in range(flows):
            host, port = sinks[nodes[(k + 1) % len(nodes)].name]
            proc = launchers.start(nodes[k % len(nodes)],
                                   [sys.executable, "-m", _BULK, "source", "--host", host, "--port", str(port)])
            procs.append(proc)
            await_ready(proc, "sending")
        time.sleep(settle)  # let the flows fill the queues before anything is measured
        for proc in procs:
            if proc.poll() is not None:
                raise ConfigError(f"bulk flow {' '.join(proc.argv)} exited early: {proc.output()[1][-500:]}")
        yield procs
    finally:
        for proc in procs:
            proc.kill()


@dataclass
class Experiment:
    """Per scenario: the ``.bs`` files of every repetition, and rank 0's latencies (ms) per repetition."""

    files: dict[str, list[list[Path]]] = field(default_factory=lambda: {s: [] for s in SCENARIOS})
    latencies_ms: dict[str, list[list[float]]] = field(default_factory=lambda: {s: [] for s in SCENARIOS})
    # Mbit/s the default level (the bulk flows) sent per node while each repetition ran; only on netns
    # nodes, whose egress classes count bytes. Shows whether the interference really filled the link.
    default_level_mbit: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SCENARIOS})

    def percentile_us(self, scenario: str, q: float) -> list[float]:
        """One value per repetition: the q-th percentile of that repetition's latencies, in µs."""
        return [float(np.percentile(np.asarray(r) * 1000.0, q)) for r in self.latencies_ms[scenario]]

    def percentile_series(self, scenario: str, q: float) -> Series:
        """``percentile_us`` as the claims' metric ``qjump.barrier.p<q>`` of configuration ``scenario``."""
        return Series(f"qjump.barrier.p{q:g}", scenario, self.percentile_us(scenario, q))

    def pooled_us(self, scenario: str) -> list[float]:
        return [v * 1000.0 for r in self.latencies_ms[scenario] for v in r]


def default_level_bytes(launchers: Launchers, nodes) -> int | None:
    """Bytes sent so far in the default level's class, summed over the nodes; None off netns."""
    return level_bytes(launchers, nodes, DEFAULT_LEVEL)


def run_experiment(launchers: Launchers, nodes, outdir: Path, *, rounds: int = 500, repetitions: int = 4,
                   warmup: int = 100, flows: int = 4, level: int = 7, size: int = 64,
                   network: str = "eth", prefix=()) -> Experiment:
    check_level(level)
    if repetitions < 1 or rounds < 1:
        raise ConfigError(f"need >= 1 repetition and round (got {repetitions}, {rounds})")
    exp = Experiment()
    outdir = Path(outdir)

    def one(scenario: str, rep: int, run_level):
        before, t0 = default_level_bytes(launchers, nodes), time.monotonic()
        files = run_barrier(launchers, nodes, outdir, f"{scenario}_{rep}", rounds=rounds, warmup=warmup,
                            level=run_level, size=size, network=network, prefix=prefix)
        after, t1 = default_level_bytes(launchers, nodes), time.monotonic()
        exp.files[scenario].append(files)
        exp.latencies_ms[scenario].append(read_bs(files[0]))
        if before is not None and after is not None:
            exp.default_level_mbit[scenario].append((after - before) * 8 / (t1 - t0) / 1e6 / len(nodes))

    # ABBA across repetitions: alone before the bulk flows, then after them; the two scenarios that
    # share the flows swap order too, so drift in the machine falls on every scenario alike
    for rep, forward in enumerate(abba(repetitions)):
        if forward:
            one("alone", rep, None)
        with bulk_flows(launchers, nodes, flows, network):
            for scenario in (("interference", "qjump") if forward else ("qjump", "interference")):
                one(scenario, rep, level if scenario == "qjump" else None)
        if not forward:
            one("alone", rep, None)
    return exp


STATS = {"p50": 50.0, "p99": 99.0, "p99_9": 99.9}


def measurements(exp: Experiment, nodes, *, level: int, flows: int, rounds: int, link_rate: str | None,
                 cluster: str) -> list[Measurement]:
    """Per scenario, one Measurement per statistic in STATS (metric ``qjump.barrier.<stat>``, µs): the
    value is the statistic over all repetitions' latencies pooled, the samples are its value in each
    repetition (what claims pair up), and ``stats`` summarizes the pooled latencies."""
    out = []
    for scenario in SCENARIOS:
        pooled = summarize(exp.pooled_us(scenario))
        params = {"scenario": scenario, "flows": flows if scenario != "alone" else 0,
                  "level": level if scenario == "qjump" else 0, "rounds": rounds,
                  "repetitions": len(exp.latencies_ms[scenario]), "link_rate": link_rate or "-",
                  "cluster": cluster, "round_trip": True}
        for stat, q in STATS.items():
            value = float(np.percentile(exp.pooled_us(scenario), q))
            out.append(Measurement(metric=f"{METRIC}.{stat}", value=value, unit="us", direction="lower",
                                   samples=exp.percentile_us(scenario, q), config=scenario,
                                   nodes=tuple(n.name for n in nodes), params=dict(params), stats=pooled))
        if exp.default_level_mbit[scenario]:
            mbit = exp.default_level_mbit[scenario]
            out.append(Measurement(metric="qjump.default_level.throughput", value=float(np.median(mbit)),
                                   unit="Mbit/s", direction="higher", samples=list(mbit), config=scenario,
                                   nodes=tuple(n.name for n in nodes), params=dict(params),
                                   stats=summarize(mbit)))
    return out
