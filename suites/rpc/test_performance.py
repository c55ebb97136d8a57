"""RPC performance: echo latency sweep (1 B .. 1 MiB, round-trip) and calls/s with 1..16 client
processes, per transport (tcp, shm) and buffer design (pooled, naive), plus in-process call timing
through pytest-benchmark. The raw socket floor is recorded by test_socket_floor.py in the same run.

Local claims (suites/rpc/claims.toml) are evaluated from buffer counters and from echo round trips of
two configurations taking turns call by call in this process (``test_interleaved_echo_cost``): the
Python designs' regression gates, and the native core's design effects (native faster than Python,
shm faster than tcp, pooled faster than naive at 64 KiB). The cross-process sweep is recorded for
information.
"""

from __future__ import annotations

import pytest

from pytest_hpcnet.measure import measurement
from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.rpc import RpcClient, RpcServer
from pytest_hpcnet.workloads import rpc as wr

from .conftest import skip_unless_same_host

TCP_POOLED = ("tcp", "pooled")
TCP_NAIVE = ("tcp", "naive")
SHM_POOLED = ("shm", "pooled")
NATIVE_TCP = ("tcp", "pooled", "eth", "native")
NATIVE_TCP_NAIVE = ("tcp", "naive", "eth", "native")
NATIVE_SHM = ("shm", "pooled", "eth", "native")
PYTHON_TCP = ("tcp", "pooled", "eth", "python")
FLOOR_TCP = ("tcp", "none", "eth", "floor")   # the native raw-socket ping-pong: no RPC, no buffers
SWEEP = {"iterations": 20, "warmup": 20}
INTERLEAVED_PROCESSES = 3   # each run's rounds from three fresh processes (see wr.interleaved_echo)


@pytest.fixture(scope="module")
def configs(nodes):
    server, client = nodes
    if server.host == client.host and server.launcher == "local":
        return wr.CONFIGS
    return tuple(c for c in wr.CONFIGS if c[0] != "shm")   # shm reaches only this host


@pytest.fixture(scope="module")
def sweep(nodes, launchers, hpcnet, configs):
    """One interleaved latency sweep shared by the tests below (rounds: ``--hpcnet-rounds``)."""
    server, client = nodes
    return wr.latency_sweep(launchers, server, client, configs=configs, rounds=hpcnet.rounds, **SWEEP)


def test_latency_sweep(sweep, measure, configs):
    measure.record(*sweep)
    assert {(m.config, m.params["size"]) for m in sweep} == \
        {(wr.config_name(t, b), size) for t, b in configs for size in wr.SWEEP_SIZES}
    for m in sweep:
        s = m.stats
        assert m.params["round_trip"] is True and m.unit == "us"
        assert 0 < s["min"] <= s["median"] <= s["p99"] <= s["p99_9"] <= s["max"]


INTERLEAVED = [  # (claim, baseline, candidate, payload size)
    ("rpc.local.interleaved.pooled_vs_naive_64", TCP_NAIVE, TCP_POOLED, 64),
    ("rpc.local.interleaved.pooled_vs_naive_65536", TCP_NAIVE, TCP_POOLED, 65536),
    ("rpc.local.interleaved.shm_vs_tcp_64", TCP_POOLED, SHM_POOLED, 64),
    # the native core's design effects (impl=native; skipped, saying why, where the core is not built)
    ("rpc.local.interleaved.native_vs_python_64", PYTHON_TCP, NATIVE_TCP, 64),
    ("rpc.local.interleaved.native_vs_floor_64", FLOOR_TCP, NATIVE_TCP, 64),
    ("rpc.local.interleaved.native.shm_vs_tcp_64", NATIVE_TCP, NATIVE_SHM, 64),
    ("rpc.local.interleaved.native.pooled_vs_naive_65536", NATIVE_TCP_NAIVE, NATIVE_TCP, 65536),
]


@pytest.mark.parametrize("claim_id,baseline,candidate,size", INTERLEAVED, ids=[c[0] for c in INTERLEAVED])
def test_interleaved_echo_cost(claim_id, baseline, candidate, size, hpcnet, measure, claim):
    """The designs' cost side by side in one process, call by call (see ``wr.interleaved_echo``)."""
    if {"native", "floor"} & {wr.config_parts(baseline)[3], wr.config_parts(candidate)[3]} and not native.AVAILABLE:
        claim(claim_id, None, unavailable=native.WHY_NOT)   # n/a, saying why (it skips the test)
    paired = wr.interleaved_echo(baseline, candidate, size, rounds=hpcnet.rounds, processes=INTERLEAVED_PROCESSES)
    try:
        claim(claim_id, paired)
    finally:
        measure.record(*(measurement(wr.INTERLEAVED_METRIC, samples, unit="us", direction="lower", config=name,
                                     nodes=("test-process",),
                                     params={"size": size, "round_trip": True, "per_round": f"min of {wr.INTERLEAVED_CALLS}",
                                             "one_core": True, "processes": INTERLEAVED_PROCESSES,
                                             "timer": "python" if "impl=" not in name else "core"})
                         for name, samples in ((paired.baseline_name, paired.baseline),
                                               (paired.candidate_name, paired.candidate))))


def test_throughput_with_client_processes(nodes, launchers, workdirs, measure, configs):
    server, client = nodes
    results = wr.throughput(launchers, server, client, workdirs[client.name], configs=configs,
                            rounds=2, seconds=0.4)
    measure.record(*results)
    assert {(m.config, m.params["clients"]) for m in results} == \
        {(wr.config_name(t, b), n) for t, b in configs for n in wr.CLIENT_COUNTS}
    assert all(x > 0 for m in results for x in m.samples), "a phase completed no calls"


@pytest.mark.parametrize("counter", ["allocations", "copies"])
def test_pooled_buffers_allocate_and_copy_less_per_call(counter, measure, claim):
    """Counters of both ends (in-process: the server's counters are internals), per call, paired rounds."""
    def per_call(buffers: str):
        with RpcServer(buffers=buffers) as s, RpcClient(s.address, buffers=buffers, timeout=20) as c:
            for _ in range(5):
                c.echo(bytes(1000))
            (conn,) = list(s._conns)

            def total():
                return getattr(c.buffers.stats, counter) + getattr(conn.conn.buffers.stats, counter)
            before = total()
            for _ in range(50):
                c.echo(bytes(1000))
            return (total() - before) / 50
    metric = f"rpc.buffers.{counter}_per_call"
    paired = measure.paired((wr.config_name(*TCP_NAIVE), lambda: per_call("naive")),
                            (wr.config_name(*TCP_POOLED), lambda: per_call("pooled")),
                            rounds=10, warmup=0, metric=metric)
    measure.record(*(measurement(metric, samples, unit="1/call", direction="lower", config=name,
                                 params={"size": 1000})
                     for name, samples in ((paired.baseline_name, paired.baseline),
                                           (paired.candidate_name, paired.candidate))))
    claim(f"rpc.local.pooled_vs_naive.{counter}", paired)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_in_process_call_timing(transport, nodes, serve, benchmark, measure):
    """Client-side echo timing with pytest-benchmark (``--benchmark-save/--benchmark-compare`` work on
    it); its per-round times also go into the run record."""
    if transport == "shm":
        skip_unless_same_host(nodes)
    server = serve(transport)
    payload = bytes(64)
    with RpcClient(server.address, transport=transport, timeout=20) as c:
        benchmark.extra_info.update(transport=transport, size=64, round_trip=True)
        benchmark.pedantic(c.echo, args=(payload,), rounds=400, iterations=1, warmup_rounds=50)
    if benchmark.stats is None:   # --benchmark-disable: the call ran once, nothing was timed
        return
    samples_us = [x * 1e6 for x in benchmark.stats.stats.data]
    measure.record(measurement("rpc.echo.rtt.in_process", samples_us, unit="us", direction="lower",
                               config=wr.config_name(transport, "pooled"),
                               nodes=("test-process", server.proc.node.name),
                               params={"size": 64, "round_trip": True, "timer": "pytest-benchmark"}))
