"""Native RPC vs Hadoop's own RPC benchmark, side by side in one run: echo calls/s (issue 16's goal:
native >= 2x Hadoop with 8 clients, 1 KiB).

- Hadoop: ``org.apache.hadoop.ipc.RPCCallBenchmark`` from the hadoop-common tests jar (``make
  hadoop-jars``), its own client threads and server in one JVM, run as
  ``-c CLIENTS -s SERVER_THREADS -m SIZE -t WARMUP+SECONDS``. It prints the calls completed in each
  second; the first WARMUP seconds (JIT compilation, connection set-up) are dropped and the others
  averaged: Hadoop's warmed calls/s. Its own whole-run "Total calls per second" is shown beside it.
- Native: the native server in its own process (``hpcnet rpc serve --impl native``, echo answered in
  the core) and CLIENTS native client processes, each with its own connection, calling echo with SIZE
  bytes back to back for SECONDS after a warm-up (``bench_native.calls_per_second``).

Both run on the same box in one run, in ABBA order over ``--rounds`` (Hadoop, native, native,
Hadoop, ...), so drift in the box's load falls on both; the ratio is native's median over Hadoop's.
Where Java, the jars or the native core are missing it says so and exits 1 (asv skips, saying why).

    python benchmarks/bench_hadoop_rpc.py [--clients 8] [--server-threads 8] [--size 1024]
                                          [--seconds 10] [--warmup 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

from asv_runner.benchmarks.mark import SkipNotImplemented

try:   # asv imports this module as benchmarks.bench_hadoop_rpc; a direct run has no package
    from .bench_native import calls_per_second as native_calls_per_second
except ImportError:
    from bench_native import calls_per_second as native_calls_per_second

PER_SECOND = re.compile(r"^Calls per second: ([0-9.]+)\s*$", re.M)
CPU_PER_CALL = re.compile(r"^CPU time per call on (client|server): ([0-9]+) ns", re.M)


def unavailable() -> str | None:
    """Why this benchmark cannot run here, or None."""
    from pytest_hpcnet.reference import native
    from pytest_hpcnet.targets.hadoop.runtime import HadoopUnavailable, find_runtime
    if not native.AVAILABLE:
        return native.WHY_NOT
    try:
        find_runtime()
    except HadoopUnavailable as e:
        return str(e)
    return None


def hadoop_calls_per_second(clients: int, server_threads: int, size: int, seconds: int, warmup: int) -> dict:
    """One RPCCallBenchmark run: {"warmed": calls/s after the warm-up seconds, "total": its own figure,
    "per_second": [calls in each second]}."""
    from pytest_hpcnet.targets.hadoop import jobs
    from pytest_hpcnet.sockets import free_port
    from pytest_hpcnet.targets.hadoop.runtime import find_runtime
    r = jobs.rpc_benchmark(find_runtime(), clients=clients, seconds=warmup + seconds, msg_size=size,
                           port=free_port(), server_threads=server_threads)
    per_second = [float(x) for x in PER_SECOND.findall(r.output)]
    warmed = per_second[warmup:]
    if not warmed:
        raise RuntimeError(f"RPCCallBenchmark printed {len(per_second)} per-second lines, "
                           f"none after the {warmup} s warm-up")
    cpu = {side: int(ns) / 1000 for side, ns in CPU_PER_CALL.findall(r.output)}
    return {"warmed": statistics.fmean(warmed), "total": r.details["calls_per_second"], "per_second": per_second,
            "cpu_us_per_call": cpu.get("client", float("nan")) + cpu.get("server", float("nan"))}


def side_by_side(clients: int = 8, server_threads: int = 8, size: int = 1024, seconds: int = 10,
                 warmup: int = 5, rounds: int = 2) -> dict:
    """{"hadoop": [warmed calls/s per round], "hadoop_total": [...], "hadoop_cpu": [its CPU us per call,
    client + server], "native": [calls/s per round]}."""
    out: dict = {"hadoop": [], "hadoop_total": [], "hadoop_cpu": [], "native": []}
    for r in range(rounds):
        order = ("hadoop", "native") if r % 2 == 0 else ("native", "hadoop")
        for who in order:
            if who == "hadoop":
                h = hadoop_calls_per_second(clients, server_threads, size, seconds, warmup)
                out["hadoop"].append(h["warmed"])
                out["hadoop_total"].append(h["total"])
                out["hadoop_cpu"].append(h["cpu_us_per_call"])
            else:
                out["native"].append(native_calls_per_second("rpc-native", clients, seconds, size))
    return out


def ratio(run: dict) -> float:
    return statistics.median(run["native"]) / statistics.median(run["hadoop"])


# -- asv ---------------------------------------------------------------------------------------
class HadoopRpcSideBySide:
    """8 clients, 1 KiB echo, 10 s after a 5 s warm-up: native vs Hadoop's RPCCallBenchmark."""

    timeout = 600

    def setup_cache(self):
        why = unavailable()
        if why:
            raise SkipNotImplemented(why)   # asv skips the benchmark, saying why
        return side_by_side(rounds=1)

    def track_native_over_hadoop_calls_per_second_ratio(self, run):
        return ratio(run)

    track_native_over_hadoop_calls_per_second_ratio.unit = "ratio (higher is better)"

    def track_calls_per_second_native(self, run):
        return statistics.median(run["native"])

    def track_calls_per_second_hadoop_warmed(self, run):
        return statistics.median(run["hadoop"])

    track_calls_per_second_native.unit = track_calls_per_second_hadoop_warmed.unit = "calls/s"


# -- direct run --------------------------------------------------------------------------------
def main(argv=None) -> int:
    from tabulate import tabulate

    ap = argparse.ArgumentParser(prog="python benchmarks/bench_hadoop_rpc.py", description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8, help="client threads (Hadoop) / processes (native)")
    ap.add_argument("--server-threads", type=int, default=8, help="Hadoop's handler threads (-s)")
    ap.add_argument("--size", type=int, default=1024, help="echo payload bytes (-m)")
    ap.add_argument("--seconds", type=int, default=10, help="measured seconds per run")
    ap.add_argument("--warmup", type=int, default=5, help="Hadoop seconds dropped before them (JIT warm-up)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each, in ABBA order")
    a = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"bench_hadoop_rpc: {why}", file=sys.stderr)
        return 1
    run = side_by_side(a.clients, a.server_threads, a.size, a.seconds, a.warmup, a.rounds)
    rows = [["Hadoop RPCCallBenchmark (warmed)", *(f"{x:.0f}" for x in run["hadoop"])],
            ["Hadoop RPCCallBenchmark (its Total, whole run)", *(f"{x:.0f}" for x in run["hadoop_total"])],
            ["native server + client processes", *(f"{x:.0f}" for x in run["native"])],
            ["(Hadoop's CPU per call, client + server, us: its own figure)", *(f"{x:.0f}" for x in run["hadoop_cpu"])]]
    print(f"echo calls/s, {a.clients} clients, {a.size} B, {a.seconds} s per run "
          f"(Hadoop: -c {a.clients} -s {a.server_threads} -m {a.size} -t {a.warmup + a.seconds}, "
          f"first {a.warmup} s dropped)")
    print(tabulate(rows, headers=["path"] + [f"round {i + 1}" for i in range(a.rounds)]))
    print(f"native / Hadoop calls/s (medians): {ratio(run):.2f}x (goal >= 2x)")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (on a shared box the "
          "figures are each stack's share of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
