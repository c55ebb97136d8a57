"""RPC benchmarks: raw-socket floor vs reference RPC over tcp vs reference RPC over shm.

asv discovers the classes (``setup``/``teardown``, ``time_*``, ``track_*``). Run directly for one
side-by-side comparison table with the ratios issue 3 asks for:

    python benchmarks/bench_rpc.py [--size 64] [--rounds 7] [--calls 400] [--clients 8] [--seconds 3]
                                   [--dispatch auto|pool|direct]

``--dispatch pool`` runs the RPC servers in Hadoop's exact shape (every call through the handler
pool); the default ``auto`` lets readers run the built-in echo themselves (see rpc/server.py).

Servers always run in their own process (as in a deployment: no GIL shared with the client); the
latency client runs in this process. Latency is round-trip. Paths are measured in interleaved rounds
(floor, tcp, shm, floor, tcp, shm, ...) so drift on a shared machine hits all of them alike; the
ratios are medians of per-round ratios of medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from pytest_hpcnet.workloads.local_processes import ServerProcess, client_loop, interleaved_rounds
from pytest_hpcnet.workloads.local_processes import calls_per_second as local_calls_per_second

FLOOR_SERVER = ["-m", "pytest_hpcnet.workloads.socket_floor", "serve", "--port", "0"]
RPC_SERVER = ["-m", "pytest_hpcnet.reference.rpc.cli", "serve", "--port", "0", "--impl", "python"]   # the native
# core's figures are benchmarks/bench_native.py's


def _start_server(path: str, buffers: str = "pooled", handlers: int = 4, dispatch: str = "auto") -> ServerProcess:
    """The raw-socket floor (``floor``) or the reference RPC over ``path``, in its own process."""
    if path == "floor":
        return ServerProcess(FLOOR_SERVER, path)
    args = RPC_SERVER + ["--transport", path, "--buffers", buffers, "--handlers", str(handlers),
                         "--dispatch", dispatch]
    return ServerProcess(args, path)


class _Pinger:
    """One client connection that times round trips of ``size`` bytes on a path."""

    def __init__(self, path: str, address, size: int, buffers: str = "pooled"):
        import socket
        import struct

        self.path, self.size = path, size
        if path == "floor":
            self.sock = socket.create_connection(address, timeout=30)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.message = struct.pack(">I", size) + bytes(size)
            self.reply = memoryview(bytearray(4 + size))
        else:
            from pytest_hpcnet.reference.rpc import RpcClient

            self.client = RpcClient(address, transport=path, buffers=buffers, timeout=30)
            self.payload = bytes(size)

    def once(self) -> None:
        if self.path == "floor":
            self.sock.sendall(self.message)
            got = 0
            while got < len(self.reply):
                n = self.sock.recv_into(self.reply[got:])
                if n == 0:
                    raise ConnectionError("floor server closed")
                got += n
        else:
            self.client.echo(self.payload)

    def samples_us(self, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            self.once()
            out.append((time.perf_counter_ns() - t0) / 1000)
        return out

    def close(self) -> None:
        if self.path == "floor":
            self.sock.close()
        else:
            self.client.close()


def _client_process(transport: str, host: str, port: int, seconds: float, size: int) -> None:
    """Body of one throughput client process (``local_processes.client_loop``)."""
    from pytest_hpcnet.reference.rpc import RpcClient

    client_loop(lambda: RpcClient((host, port), transport=transport, timeout=30), size, seconds)


def calls_per_second(path: str, address, clients: int, seconds: float, size: int = 64) -> float:
    """Aggregate echo calls/s of ``clients`` client processes, each with its own connection."""
    argv = [os.path.abspath(__file__), "_client", path, address[0], str(address[1]), str(seconds), str(size)]
    return local_calls_per_second([argv] * clients, seconds, f"{path} throughput")


# -- asv ---------------------------------------------------------------------------------------
class RpcLatency:
    """Round-trip latency of one echo (or one raw-socket ping-pong for the floor)."""

    params = (["floor", "tcp", "shm"], [64, 4096])
    param_names = ["path", "size"]
    timeout = 120

    def setup(self, path, size):
        self.server = _start_server(path)
        self.pinger = _Pinger(path, self.server.address, size)
        self.pinger.samples_us(200)   # warm-up

    def teardown(self, path, size):
        self.pinger.close()
        self.server.stop()

    def time_round_trip(self, path, size):
        self.pinger.once()

    def track_p50_us(self, path, size):
        return float(np.median(self.pinger.samples_us(2000)))

    track_p50_us.unit = "us"


class RpcThroughput:
    """Aggregate calls/s with N client processes."""

    params = (["tcp", "shm"], [1, 8])
    param_names = ["transport", "clients"]
    timeout = 120

    def setup(self, transport, clients):
        self.server = _start_server(transport, handlers=8)

    def teardown(self, transport, clients):
        self.server.stop()

    def track_calls_per_second(self, transport, clients):
        return calls_per_second(transport, self.server.address, clients, seconds=3)

    track_calls_per_second.unit = "calls/s"


class BufferDesignLatency:
    """Pooled vs naive buffers over tcp: the same echo, two buffer designs."""

    params = (["pooled", "naive"], [64, 65536])
    param_names = ["buffers", "size"]
    timeout = 120

    def setup(self, buffers, size):
        self.server = _start_server("tcp", buffers=buffers)
        self.pinger = _Pinger("tcp", self.server.address, size, buffers=buffers)
        self.pinger.samples_us(200)

    def teardown(self, buffers, size):
        self.pinger.close()
        self.server.stop()

    def track_p50_us(self, buffers, size):
        return float(np.median(self.pinger.samples_us(2000)))

    track_p50_us.unit = "us"


# -- direct run --------------------------------------------------------------------------------
def compare(size: int, rounds: int, calls: int, clients: int, seconds: float, dispatch: str = "auto") -> int:
    from tabulate import tabulate

    from pytest_hpcnet.measure import summarize

    paths = ["floor", "tcp", "shm"]
    servers = {p: _start_server(p, handlers=8, dispatch=dispatch) for p in paths}
    try:
        pingers = {p: _Pinger(p, servers[p].address, size) for p in paths}
        for p in paths:
            pingers[p].samples_us(300)
        samples, round_p50 = interleaved_rounds({p: pingers[p].samples_us for p in paths}, rounds, calls)
        for p in paths:
            pingers[p].close()
        rows = []
        for p in paths:
            st = summarize(samples[p])
            rows.append([p, size, st["n"]] + [round(st[k], 1) for k in
                                              ("min", "median", "mean", "stdev", "p99", "p99_9", "max")])
        print(f"round-trip latency (us), {size} B payload, {rounds} interleaved rounds of {calls} calls, "
              f"server dispatch={dispatch}")
        print(tabulate(rows, headers=["path", "size", "n", "min", "p50", "mean", "stdev", "p99", "p99.9",
                                      "max"]))
        tcp_floor = np.median(np.array(round_p50["tcp"]) / np.array(round_p50["floor"]))
        shm_tcp = np.median(np.array(round_p50["shm"]) / np.array(round_p50["tcp"]))
        tput = {p: calls_per_second(p, servers[p].address, clients, seconds, size) for p in ("tcp", "shm")}
    finally:
        for s in servers.values():
            s.stop()
    print()
    print(tabulate([["rpc tcp p50 / socket floor p50", f"{tcp_floor:.2f}x", "<= 1.3x"],
                    ["rpc shm p50 / rpc tcp p50", f"{shm_tcp:.2f}x", "<= 0.5x"],
                    [f"rpc tcp calls/s, {clients} client processes", f"{tput['tcp']:.0f}", ""],
                    [f"rpc shm calls/s, {clients} client processes", f"{tput['shm']:.0f}", ""]],
                   headers=["figure", "measured", "goal (issue 3)"]))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_client":
        transport, host, port, seconds, size = argv[1:6]
        _client_process(transport, host, int(port), float(seconds), int(size))
        return 0
    ap = argparse.ArgumentParser(prog="python benchmarks/bench_rpc.py", description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dispatch", choices=["auto", "pool", "direct"], default="auto")
    a = ap.parse_args(argv)
    return compare(a.size, a.rounds, a.calls, a.clients, a.seconds, a.dispatch)


if __name__ == "__main__":
    sys.exit(main())
