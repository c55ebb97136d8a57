"""Shared helpers for the asv benchmarks: clusters, claims, small-scale workloads, lower-is-better ratios.

A *workload* here is a function decorated with ``@workload`` that runs one of the suites' workload
functions at a small scale and returns its ``Measurement``s. The decorator turns it into an asv
``setup_cache``: asv runs it once per benchmark run (in its own process), stores what it returned, and
hands that to every benchmark that names it. A workload that cannot run on this machine raises
``Unavailable``; the benchmarks that need it are then skipped with that reason instead of failing.

asv flags an *upward* step in a tracked value as a regression. ``lower_is_better`` therefore turns
each claim's quantity into a number for which lower is better: a "higher is better" ratio is tracked
as its inverse, a reduction as the remaining fraction 1 - reduction = candidate/baseline.
"""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from asv_runner.benchmarks.mark import SkipNotImplemented

from pytest_hpcnet import tracking
from pytest_hpcnet.claims import Claim, load_claims
from pytest_hpcnet.measure import Measurement, measurement, ratio_ci
from pytest_hpcnet.sockets import recv_exact

REPO = Path(__file__).resolve().parents[1]


class Unavailable(Exception):
    """This machine cannot run the workload (missing privilege, tool or hardware); the reason says which."""


def suite_claims() -> dict[str, Claim]:
    """Every claim in ``suites/*/claims.toml``, by id."""
    return load_claims(sorted(REPO.glob("suites/*/claims.toml")))


# --- workloads as asv setup_cache functions ---------------------------------------------------------

def workload(fn):
    """Make ``fn() -> list[Measurement]`` an asv ``setup_cache``: it returns plain data asv can pickle,
    ``{"measurements": [...]}`` or ``{"unavailable": reason}``.

    ``functools.wraps`` matters: asv keys a setup cache by the module and source line of the function,
    which it reads through ``__wrapped__``, so every decorated workload gets its own cache."""
    @functools.wraps(fn)
    def setup_cache():
        try:
            return {"measurements": [m.to_json() for m in fn()]}
        except Unavailable as e:
            return {"unavailable": str(e)}
    setup_cache.timeout = getattr(fn, "timeout", 600)
    return setup_cache


def measurements_of(cache: dict) -> list[Measurement]:
    """The measurements a workload's cache holds; asv's SkipNotImplemented if it could not run."""
    if "unavailable" in cache:
        raise SkipNotImplemented(cache["unavailable"])
    return [Measurement.from_json(m) for m in cache["measurements"]]


def samples_for(measurements: list[Measurement], metric: str, config: str) -> list[float]:
    found = [m for m in measurements if m.metric == metric and m.config == config]
    if len(found) != 1:
        have = sorted({(m.metric, m.config) for m in measurements})
        raise ValueError(f"expected one measurement of {metric} [{config}], found {len(found)}; have {have}")
    return found[0].samples


# --- claims as lower-is-better numbers ----------------------------------------------------------------

def lower_is_better_form(claim: Claim) -> tuple[str, str]:
    """(name suffix, asv unit) of the number tracked for ``claim``; lower is better for every form
    (``pytest_hpcnet.tracking``, which ``hpcnet asv-import`` uses for the claims runs measured)."""
    return tracking.form_and_unit(claim.kind, claim.direction, claim.metric, claim.baseline, claim.candidate)


def lower_is_better(claim: Claim, measurements: list[Measurement]) -> float:
    """The claim's quantity from paired samples, oriented so that lower is better (see the form)."""
    form, _ = lower_is_better_form(claim)
    cand = samples_for(measurements, claim.metric, claim.candidate)
    if claim.kind == "absolute":
        value = float(np.median(cand))
        return value if form == "value" else 1.0 / value
    ratio = ratio_ci(samples_for(measurements, claim.metric, claim.baseline), cand).ratio  # cand / base
    return {"ratio": ratio, "inverse_ratio": 1.0 / ratio, "reduction": 1.0 - ratio}[form]


def benchmark_name(claim: Claim) -> str:
    """``track_<claim id>__<form>_lower_is_better`` with the id's dots and dashes as underscores."""
    ident = "".join(c if c.isalnum() else "_" for c in claim.id).lower()
    return f"track_{ident}__{lower_is_better_form(claim)[0]}_lower_is_better"


# --- clusters -----------------------------------------------------------------------------------------

@contextmanager
def local_launchers(n: int):
    """(cluster, launchers) for ``local:n`` in a temporary directory; every process is killed after."""
    from pytest_hpcnet import cluster as clusters

    with tempfile.TemporaryDirectory(prefix="hpcnet-asv-") as tmp, clusters.open(f"local:{n}", Path(tmp)) as opened:
        yield opened


# --- small-scale workloads ----------------------------------------------------------------------------

RPC_SIZE = 64
RPC_ROUNDS = 7          # interleaved rounds; each path's sample in a round is the median of RPC_CALLS calls
RPC_CALLS = 200
RPC_WARMUP = 100


def _floor_pinger(host: str, port: int):
    import socket
    import struct

    sock = socket.create_connection((host, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    message = struct.pack(">I", RPC_SIZE) + bytes(RPC_SIZE)
    reply = memoryview(bytearray(4 + RPC_SIZE))

    def once():
        sock.sendall(message)
        recv_exact(sock, reply)
    return once, sock.close


def _rpc_pinger(host: str, port: int, transport: str):
    from pytest_hpcnet.reference.rpc.client import RpcClient

    client = RpcClient((host, port), transport=transport, timeout=30)
    payload = bytes(RPC_SIZE)
    return (lambda: client.echo(payload)), client.close


@workload
def rpc_small() -> list[Measurement]:
    """Round-trip time of a 64-byte echo: raw TCP socket floor vs reference RPC over tcp and over shm.

    Servers run in their own processes on a local:1 node; the clients run here. The three paths are
    measured in interleaved rounds (floor, tcp, shm, floor, ...) so drift hits all alike; a round's
    sample is the median of ``RPC_CALLS`` calls, in µs. Metric ``rpc.echo.rtt``, configs
    ``socket-floor``, ``transport=tcp``, ``transport=shm``."""
    from pytest_hpcnet.cluster.nodeprogram import await_ready

    with local_launchers(1) as (cluster, launchers):
        node = cluster.nodes[0]
        host = node.address("eth")
        floor = launchers.start(node, [sys.executable, "-m", "pytest_hpcnet.workloads.socket_floor", "serve",
                                       "--host", host, "--port", "0"])
        ports = {"socket-floor": await_ready(floor).port}
        for transport in ("tcp", "shm"):
            srv = launchers.start(node, [sys.executable, "-m", "pytest_hpcnet.reference.rpc.cli", "serve",
                                         "--host", host, "--port", "0", "--transport", transport,
                                         "--impl", "python"])
            ports[f"transport={transport}"] = await_ready(srv).port
        pingers = {"socket-floor": _floor_pinger(host, ports["socket-floor"])}
        for transport in ("tcp", "shm"):
            pingers[f"transport={transport}"] = _rpc_pinger(host, ports[f"transport={transport}"], transport)
        try:
            for once, _ in pingers.values():
                for _ in range(RPC_WARMUP):
                    once()
            samples: dict[str, list[float]] = {name: [] for name in pingers}
            for _ in range(RPC_ROUNDS):
                for name, (once, _) in pingers.items():
                    times = []
                    for _ in range(RPC_CALLS):
                        t0 = time.perf_counter_ns()
                        once()
                        times.append((time.perf_counter_ns() - t0) / 1000.0)
                    samples[name].append(float(np.median(times)))
        finally:
            for _, close in pingers.values():
                close()
    return [measurement("rpc.echo.rtt", s, unit="us", direction="lower", config=name, nodes=(node.name,),
                        params={"size": RPC_SIZE, "calls_per_round": RPC_CALLS, "round_trip": True})
            for name, s in samples.items()]


# The QJump suite's set-up (suites/qjump/test_qjump.py) at a smaller scale: fewer rounds and repetitions.
QJUMP_NODES = 4
QJUMP_LINK_RATE = "200mbit"
QJUMP_LEVEL = 7
QJUMP_FLOWS = 4
QJUMP_ROUNDS = 150
QJUMP_REPETITIONS = 3
QJUMP_WARMUP = 50


@workload
def qjump_small() -> list[Measurement]:
    """Barrier-sync latency alone / under bulk interference / at QJump level 7 on a netns:4 cluster."""
    from pytest_hpcnet import cluster as clusters
    from pytest_hpcnet.cluster import netns
    from pytest_hpcnet.cluster.shaping import QJumpParams
    from pytest_hpcnet.workloads.qjump import scenarios

    if not netns.available():
        raise Unavailable(f"netns cluster: {netns.NEEDS_ROOT}")
    params = QJumpParams(bytesq=256, timeq=20, rates=(100, 1, 1, 1, 1, 1, 1, 1))
    prefix = ("chrt", "-f", "10") if shutil.which("chrt") else ()
    with tempfile.TemporaryDirectory(prefix="hpcnet-asv-qjump-") as tmp:
        built = netns.netns_cluster(QJUMP_NODES, Path(tmp) / "cluster", link_rate=QJUMP_LINK_RATE, qjump=params)
        with clusters.open(built, Path(tmp)) as (cluster, launchers):
            exp = scenarios.run_experiment(launchers, cluster.nodes, Path(tmp) / "bs", rounds=QJUMP_ROUNDS,
                                           repetitions=QJUMP_REPETITIONS, warmup=QJUMP_WARMUP,
                                           flows=QJUMP_FLOWS, level=QJUMP_LEVEL, prefix=prefix)
            return scenarios.measurements(exp, cluster.nodes, level=QJUMP_LEVEL, flows=QJUMP_FLOWS,
                                          rounds=QJUMP_ROUNDS, link_rate=QJUMP_LINK_RATE,
                                          cluster=cluster.source)


# The MapReduce suite's local claims at a smaller scale: every configuration a local mapreduce claim names,
# per job, in round-robin rounds on a local:4 engine (the suite's claims were set at 300k rows).
MAPREDUCE_NODES = 4
MAPREDUCE_TERASORT_ROWS = 100_000
MAPREDUCE_SORT_BYTES = 4 << 20
MAPREDUCE_ROUNDS = 3


def claimed_configs(prefix: str) -> dict[str, list[str]]:
    """Per job (``mapreduce.<job>.*``), the baseline and candidate configs of its local claims on what a
    whole job measures (its time and phases), in order: a claim on one step alone (the reduce's merge,
    ``mapreduce.terasort.merge.floor``) compares data paths the job workload does not name."""
    out: dict[str, dict[str, None]] = {}
    for claim in suite_claims().values():
        parts = claim.metric.split(".")
        if claim.is_local and parts[0] == prefix and len(parts) > 2 and parts[2] in ("job_time", "phase"):
            job = parts[1]
            out.setdefault(job, {}).update({claim.baseline: None, claim.candidate: None})
    return {job: list(configs) for job, configs in out.items()}


@workload
def mapreduce_small() -> list[Measurement]:
    """TeraSort and Sort job times (and phases) under every config the local mapreduce claims compare."""
    from pytest_hpcnet.reference.mapreduce.engine.driver import Engine
    from pytest_hpcnet.workloads import mapreduce

    out = []
    with local_launchers(MAPREDUCE_NODES) as (cluster, launchers), Engine(cluster, launchers) as engine:
        for job, configs in sorted(claimed_configs("mapreduce").items()):
            inp = mapreduce.prepare_input(engine, job, cluster.shared, rows=MAPREDUCE_TERASORT_ROWS,
                                          sort_bytes=MAPREDUCE_SORT_BYTES)
            timers = mapreduce.run_configs(engine, inp, configs, rounds=MAPREDUCE_ROUNDS, scratch=cluster.shared)
            for config, timer in timers.items():
                for m in timer.measurements(skip=1):   # the first call of each config was its warm-up
                    m.config = config   # the claim's spelling (the engine's canonical name adds defaults)
                    out.append(m)
    return out


@workload
def mapreduce_merge_small() -> list[Measurement]:
    """The reduce's merge alone, numpy's against the core's, on the same runs in interleaved rounds
    (suites/mapreduce/test_performance.py::test_native_merge_cost's shape, fewer rounds)."""
    from pytest_hpcnet.measure import run_paired
    from pytest_hpcnet.reference import native
    from pytest_hpcnet.workloads import mapreduce

    if not native.AVAILABLE:
        raise Unavailable(native.WHY_NOT)
    runs = mapreduce.merge_input()
    paired = run_paired(mapreduce.merge_timer("python", runs), mapreduce.merge_timer("native", runs),
                        rounds=MAPREDUCE_ROUNDS, baseline_name="impl=python", candidate_name="impl=native")
    return [measurement(mapreduce.MERGE_METRIC, samples, unit="s", direction="lower", config=name)
            for name, samples in ((paired.baseline_name, paired.baseline),
                                  (paired.candidate_name, paired.candidate))]


# The DFSIO suite's local claims (suites/dfsio/test_performance.py) with fewer paired rounds.
DFSIO_NODES = 4
DFSIO_SIZE = "2MB"
DFSIO_BLOCK = 512 * 1024
DFSIO_ROUNDS = 3


@workload
def dfsio_small() -> list[Measurement]:
    """TestDFSIO write throughput (MB/s): block store over tcp vs shm (replication 2), and the POSIX
    target with fsync on close vs none, each pair in interleaved rounds."""
    from pytest_hpcnet.measure import run_paired
    from pytest_hpcnet.reference.dfs.store import BlockStore
    from pytest_hpcnet.workloads.dfsio import FsTarget, parse_dfsio_args, run_dfsio

    out = []
    with local_launchers(DFSIO_NODES) as (cluster, launchers):
        opts = parse_dfsio_args(["-write", "-nrFiles", str(DFSIO_NODES), "-size", DFSIO_SIZE])
        workdirs = {n.name: n.workdir for n in cluster.nodes}

        def throughput(target):
            return lambda: run_dfsio(opts, target, launchers, cluster, write_res_file=False).throughput

        def record(paired):
            for name, samples in ((paired.baseline_name, paired.baseline), (paired.candidate_name, paired.candidate)):
                out.append(measurement("dfsio.write.throughput", samples, unit="MB/s", direction="higher",
                                       config=name, nodes=cluster.names, params={"size": DFSIO_SIZE}))

        stores = {}
        try:
            for transport in ("tcp", "shm"):
                stores[transport] = BlockStore(launchers, cluster, transport=transport,
                                               dirs={k: p / f"dfs-{transport}" for k, p in workdirs.items()}).start()
            targets = {t: FsTarget("blockstore", store=s.spec(replication=2, block_size=DFSIO_BLOCK))
                       for t, s in stores.items()}
            record(run_paired(throughput(targets["tcp"]), throughput(targets["shm"]), rounds=DFSIO_ROUNDS,
                              baseline_name="blockstore,transport=tcp,replication=2",
                              candidate_name="blockstore,transport=shm,replication=2"))
        finally:
            for store in stores.values():
                store.stop()
        close = FsTarget("posix", root="local", fsync="close", node_dirs=workdirs)
        none = FsTarget("posix", root="local", fsync="none", node_dirs=workdirs)
        record(run_paired(throughput(close), throughput(none), rounds=DFSIO_ROUNDS,
                          baseline_name="posix,fsync=close", candidate_name="posix,fsync=none"))
    return out


@workload
def dfsio_cpu_small() -> list[Measurement]:
    """The block store's write path in CPU time: CRC32C native vs the Python pipeline's CRC32 loop
    (ns/KiB), and a replication-2 write through the native vs the Python pipeline (ms/MiB, client and
    datanodes), each pair in interleaved rounds (suites/dfsio/test_performance.py's shapes, fewer rounds)."""
    from pytest_hpcnet.measure import run_paired
    from pytest_hpcnet.reference import native
    from pytest_hpcnet.reference.dfs.store import BlockStore
    from pytest_hpcnet.workloads.dfsio.pipeline_cost import interleaved_checksum_cost, pipeline_cpu_ms_per_mb

    if not native.AVAILABLE:
        raise Unavailable(native.WHY_NOT)
    out = []

    def record(paired, metric, unit):
        for name, samples in ((paired.baseline_name, paired.baseline), (paired.candidate_name, paired.candidate)):
            out.append(measurement(metric, samples, unit=unit, direction="lower", config=name))

    record(interleaved_checksum_cost(("crc32", "python"), ("crc32c", "native"), rounds=3),
           "dfsio.checksum.cpu_ns_per_kib", "ns/KiB")
    with local_launchers(2) as (cluster, launchers):
        stores, clients = {}, {}
        try:
            for impl in ("python", "native"):
                stores[impl] = BlockStore(launchers, cluster, transport="tcp", impl=impl,
                                          dirs={n.name: n.workdir / f"dfs-{impl}" for n in cluster.nodes}).start()
                clients[impl] = stores[impl].client(block_size=4 << 20, packet_size=8 * 1024, impl=impl,
                                                    node=cluster.names[0])
            record(run_paired(lambda: pipeline_cpu_ms_per_mb(clients["python"], "/cpu/f", 4, 2),
                              lambda: pipeline_cpu_ms_per_mb(clients["native"], "/cpu/f", 4, 2), rounds=3,
                              baseline_name="blockstore,transport=tcp,replication=2,impl=python",
                              candidate_name="blockstore,transport=tcp,replication=2,impl=native"),
                   "dfsio.write.cpu_ms_per_mb", "ms/MiB")
        finally:
            for c in clients.values():
                c.close()
            for s in stores.values():
                s.stop()
    return out


@workload
def checksum_floor_small() -> list[Measurement]:
    """The native per-chunk CRC32C against the bare crc32 instruction loop over the same chunks
    (ns/KiB, CPU time, interleaved passes; suites/dfsio/test_performance.py's shape, fewer rounds)."""
    from pytest_hpcnet.reference import native
    from pytest_hpcnet.workloads.dfsio.pipeline_cost import interleaved_checksum_cost

    if not native.AVAILABLE:
        raise Unavailable(native.WHY_NOT)
    if not native.core.crc32c_instruction_floor_available():
        raise Unavailable("the CRC32C instruction floor needs an x86-64 CPU with SSE4.2")
    paired = interleaved_checksum_cost(("crc32c", "floor"), ("crc32c", "native"), rounds=6, processes=3)
    return [measurement("dfsio.checksum.cpu_ns_per_kib", samples, unit="ns/KiB", direction="lower", config=name)
            for name, samples in ((paired.baseline_name, paired.baseline), (paired.candidate_name, paired.candidate))]
