"""The native core side by side (issue 16): native tcp RPC vs the native raw-socket floor, native shm
RPC vs native tcp RPC, and native vs Python tcp RPC, 64 B echo round trips, measured in one run; then
the native buffer designs, pooled
vs naive, at 64 KiB; then calls/s with N client processes, native (server and clients) vs Python.

asv discovers the classes (skipped, with the reason, where the native core is not built). Run
directly for the table and the ratios against the issue's goals:

    python benchmarks/bench_native.py [--size 64] [--rounds 9] [--calls 400] [--buffers-size 65536]
                                      [--clients 8] [--seconds 2] [--throughput-size 1024] [--one-core]

Every server runs in its own process (as in a deployment); the clients run in this process. The
native floor and the native RPC are timed inside the core (per-call samples, no interpreter in a
timed call); the Python RPC is timed around ``RpcClient.echo``, which is what its users get. Paths
take turns in interleaved rounds (ABBA order), so drift on a shared machine hits them alike; each
ratio is the median of per-round ratios of medians.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np
from asv_runner.benchmarks.mark import SkipNotImplemented

from pytest_hpcnet.workloads.local_processes import ServerProcess, client_loop, echo_for, interleaved_rounds
from pytest_hpcnet.workloads.local_processes import calls_per_second as local_calls_per_second

PATHS = ("floor-native", "rpc-native", "rpc-native-shm", "rpc-python")
SERVERS = {
    "floor-native": ["-m", "pytest_hpcnet.workloads.socket_floor", "serve", "--port", "0", "--impl", "native"],
    "rpc-native": ["-m", "pytest_hpcnet.reference.rpc.cli", "serve", "--port", "0", "--impl", "native",
                    "--handlers", "1"],
    "rpc-native-shm": ["-m", "pytest_hpcnet.reference.rpc.cli", "serve", "--port", "0", "--impl", "native",
                        "--handlers", "1", "--transport", "shm"],
    "rpc-native-naive": ["-m", "pytest_hpcnet.reference.rpc.cli", "serve", "--port", "0", "--impl", "native",
                          "--handlers", "1", "--buffers", "naive"],
    "rpc-python": ["-m", "pytest_hpcnet.reference.rpc.cli", "serve", "--port", "0", "--impl", "python",
                    "--handlers", "4"],
}


def _require_native() -> None:
    from pytest_hpcnet.reference import native
    if not native.AVAILABLE:
        raise SkipNotImplemented(native.WHY_NOT)   # asv skips the benchmark, saying why


def _start_server(path: str) -> ServerProcess:
    return ServerProcess(SERVERS[path], path)


class _Timer:
    """Times ``n`` round trips of ``size`` bytes on one path; samples in us."""

    def __init__(self, path: str, address, size: int):
        from pytest_hpcnet.reference import native
        from pytest_hpcnet.reference.rpc import make_client
        self.path, self.size = path, size
        if path == "floor-native":
            self._pp = native.core.PingPong(address[0], address[1], size)
            self.samples = lambda n: self._pp.samples(n)
        elif path.startswith("rpc-native"):
            buffers = "naive" if path.endswith("-naive") else "pooled"
            transport = "shm" if path.endswith("-shm") else "tcp"
            self._c = make_client(address, impl="native", buffers=buffers, transport=transport, timeout=30)
            self.samples = lambda n: self._c.echo_samples(size, n)
        else:
            self._c = make_client(address, impl="python", timeout=30)
            self.samples = self._python_samples
            self._payload = bytes(size)

    def _python_samples(self, n: int) -> list[float]:
        out, clock, echo, payload = [], time.perf_counter_ns, self._c.echo, self._payload
        for _ in range(n):
            t0 = clock()
            echo(payload)
            out.append((clock() - t0) / 1000)
        return out

    def close(self) -> None:
        if self.path != "floor-native":
            self._c.close()


def side_by_side(size: int = 64, rounds: int = 9, calls: int = 400, paths=PATHS, one_core: bool = False) -> dict:
    """{"samples": {path: [us]}, "round_p50": {path: [us per round]}} from one interleaved run.

    ``one_core``: the servers and this client all on one CPU (``measure.on_one_core``; server
    processes inherit it): each round trip is then both ends' software cost, with no idle CPU to wake
    inside a call; unpinned, an idle box adds a vCPU wake-up (30-40 us on this VM) to every hop."""
    from pytest_hpcnet.measure import on_one_core
    with on_one_core() if one_core else contextlib.nullcontext():
        return _side_by_side(size, rounds, calls, paths)


def _side_by_side(size, rounds, calls, paths) -> dict:
    servers = {p: _start_server(p) for p in paths}
    timers = {}
    try:
        timers = {p: _Timer(p, servers[p].address, size) for p in paths}
        for t in timers.values():
            t.samples(max(50, calls // 2))   # warm-up
        samples, round_p50 = interleaved_rounds({p: timers[p].samples for p in paths}, rounds, calls)
    finally:
        for t in timers.values():
            t.close()
        for s in servers.values():
            s.stop()
    return {"samples": samples, "round_p50": round_p50}


def ratio(run: dict, candidate: str, baseline: str) -> float:
    rp = run["round_p50"]
    return float(np.median(np.array(rp[candidate]) / np.array(rp[baseline])))


def _client_process(impl: str, host: str, port: int, seconds: float, size: int) -> None:
    """One throughput client process (``local_processes.client_loop``); a native client runs the
    timed loop in the core."""
    from pytest_hpcnet.reference.rpc import make_client
    loop = (lambda c, n, s: c.echo_for(n, s)) if impl == "native" else echo_for
    client_loop(lambda: make_client((host, port), impl=impl, timeout=30), size, seconds, loop)


def calls_per_second(path: str, clients: int, seconds: float, size: int) -> float:
    """Echo calls/s of ``clients`` client processes against a fresh ``path`` server (rpc-native or
    rpc-python; the clients are of the same implementation)."""
    server = _start_server(path)
    impl = "native" if path == "rpc-native" else "python"
    try:
        argv = [os.path.abspath(__file__), "_client", impl, server.address[0], str(server.address[1]),
                str(seconds), str(size)]
        return local_calls_per_second([argv] * clients, seconds, f"{path} throughput")
    finally:
        server.stop()


# -- asv ---------------------------------------------------------------------------------------
class NativeSideBySide:
    """One interleaved run of the three paths at 64 B; the p50s and the two ratios of issue 16."""

    timeout = 300

    def setup_cache(self):
        _require_native()
        return side_by_side(64, rounds=5, calls=300)

    def track_rpc_native_over_floor_native_p50_ratio(self, run):
        return ratio(run, "rpc-native", "floor-native")

    track_rpc_native_over_floor_native_p50_ratio.unit = "ratio (lower is better)"

    def track_rpc_native_over_rpc_python_p50_ratio(self, run):
        return ratio(run, "rpc-native", "rpc-python")

    track_rpc_native_over_rpc_python_p50_ratio.unit = "ratio (lower is better)"

    def track_rpc_native_shm_over_tcp_p50_ratio(self, run):
        return ratio(run, "rpc-native-shm", "rpc-native")

    track_rpc_native_shm_over_tcp_p50_ratio.unit = "ratio (lower is better)"

    def track_p50_us_floor_native(self, run):
        return float(np.median(run["samples"]["floor-native"]))

    def track_p50_us_rpc_native(self, run):
        return float(np.median(run["samples"]["rpc-native"]))

    def track_p50_us_rpc_python(self, run):
        return float(np.median(run["samples"]["rpc-python"]))

    track_p50_us_floor_native.unit = track_p50_us_rpc_native.unit = track_p50_us_rpc_python.unit = "us"


class NativeBufferDesigns:
    """Native tcp RPC at 64 KiB: pooled buffers vs naive copies, one interleaved run."""

    timeout = 300

    def setup_cache(self):
        _require_native()
        return side_by_side(65536, rounds=5, calls=100, paths=("rpc-native-naive", "rpc-native"))

    def track_pooled_over_naive_p50_ratio_64k(self, run):
        return ratio(run, "rpc-native", "rpc-native-naive")

    track_pooled_over_naive_p50_ratio_64k.unit = "ratio (lower is better)"


# -- direct run --------------------------------------------------------------------------------
def main(argv=None) -> int:
    from tabulate import tabulate

    from pytest_hpcnet.measure import summarize
    from pytest_hpcnet.reference import native

    ap = argparse.ArgumentParser(prog="python benchmarks/bench_native.py", description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--buffers-size", type=int, default=65536,
                    help="payload of the pooled vs naive comparison (0: skip it)")
    ap.add_argument("--clients", type=int, default=8, help="throughput client processes (0: skip)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--throughput-size", type=int, default=1024)
    ap.add_argument("--one-core", action="store_true",
                    help="latency paths: servers and client on one CPU (software cost per call, no idle-CPU wake-ups)")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_client":
        impl, host, port, seconds, size = argv[1:6]
        _client_process(impl, host, int(port), float(seconds), int(size))
        return 0
    a = ap.parse_args(argv)
    if not native.AVAILABLE:
        print(f"bench_native: {native.WHY_NOT}", file=sys.stderr)
        return 1
    run = side_by_side(a.size, a.rounds, a.calls, one_core=a.one_core)
    rows = []
    for p in PATHS:
        st = summarize(run["samples"][p])
        rows.append([p, a.size, st["n"]] + [round(st[k], 1) for k in
                                             ("min", "median", "mean", "stdev", "p99", "p99_9", "max")])
    print(f"round-trip latency (us), {a.size} B payload, {a.rounds} interleaved rounds of {a.calls} calls"
          + (", servers and client on one CPU" if a.one_core else ""))
    print(tabulate(rows, headers=["path", "size", "n", "min", "p50", "mean", "stdev", "p99", "p99.9", "max"]))
    print()
    print(tabulate([["native tcp RPC p50 / native raw-socket floor p50",
                     f"{ratio(run, 'rpc-native', 'floor-native'):.2f}x", "<= 1.3x"],
                    ["native shm RPC p50 / native tcp RPC p50",
                     f"{ratio(run, 'rpc-native-shm', 'rpc-native'):.2f}x", "<= 0.5x"],
                    ["native tcp RPC p50 / Python tcp RPC p50",
                     f"{ratio(run, 'rpc-native', 'rpc-python'):.2f}x", "<= 0.25x"]],
                   headers=["figure (median of per-round ratios)", "measured", "goal (issue 16)"]))
    if a.buffers_size:
        designs = ("rpc-native-naive", "rpc-native")
        run = side_by_side(a.buffers_size, a.rounds, max(20, a.calls // 4), paths=designs, one_core=a.one_core)
        print()
        print(tabulate([[p, a.buffers_size, round(float(np.median(run["samples"][p])), 1)] for p in designs],
                       headers=["path", "size", "p50 (us)"]))
        print(f"native pooled p50 / native naive p50 at {a.buffers_size} B: "
              f"{ratio(run, 'rpc-native', 'rpc-native-naive'):.2f}x (goal <= 0.85x)")
    if a.clients:
        tput = {p: calls_per_second(p, a.clients, a.seconds, a.throughput_size) for p in ("rpc-python", "rpc-native")}
        print()
        print(tabulate([[p, a.clients, a.throughput_size, f"{v:.0f}"] for p, v in tput.items()],
                       headers=["path (server and clients)", "client processes", "size", "calls/s"]))
        print(f"native / Python calls/s: {tput['rpc-native'] / tput['rpc-python']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
