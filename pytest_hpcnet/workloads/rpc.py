"""RPC workloads on the reference RPC: an echo server per configuration on one node, clients on another.

- ``latency_sweep``: one client process holds a connection to every configuration's server and times
  echo round trips (RTT, not RTT/2) over payload sizes in interleaved rounds (round r: every size,
  every configuration). Within a round the configurations take turns call by call, in forward then
  reversed order (A B C, C B A, ...), so a burst of load from a neighbour falls on all of them alike
  instead of on whichever block of calls it hit; that keeps the per-round ratios steady enough for a
  gate on a shared 2-core machine (measured: per-round sd of the log ratio 0.03 against 0.10 for
  blocks of 20 calls, same load). One
  ``Measurement`` per (configuration, size) with perftest-style statistics of every call; its samples
  are in round order, ``params["rounds"]`` equal slices, so ``round_p50`` gives per-round medians
  for paired claims (``paired_p50``).
- ``throughput``: ``max(counts)`` client processes, each with its own connection to every server,
  follow one schedule of fixed phases (round, client count, configuration): in a phase the first
  ``n`` clients call echo back to back and count the calls completed inside it. Calls/s of a phase =
  total calls / phase length. Processes start once for all phases (starting 16 Python processes per
  point would cost more than the measurement); a start file written after every client reported
  ready fixes the schedule's time zero.

A configuration is ``(transport, buffers)``, ``(transport, buffers, network)`` (the network whose
address the server listens on; the workload's ``network`` otherwise) or ``(transport, buffers, network,
impl)``; its name is ``transport=T,buffers=B,net=N``, plus ``,impl=native`` for the compiled core
(``impl=python``, the readable reference, is the default and is not spelled out, so the names the
claims were set with keep meaning what they measured). With ``impl=native`` both ends are native (the
server's built-in echo never enters Python) and the sweep times each call inside the core; a sweep of
one native configuration alone has no turns to take, so each round's calls run back to back inside
one call into the core, as perftest's ib_send_lat runs its own (no interpreter between calls, so the
server's busy-poll window still holds when the next call comes). The server
(``python -m pytest_hpcnet.workloads.rpc serve``) is the reference ``RpcServer`` with the built-in
echo and ping plus two methods the conformance suite needs: ``sleepEcho`` (sleeps the milliseconds
in the payload's first two bytes, big-endian, then echoes) and ``fail`` (raises ``ValueError`` with
the payload as message).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from ..cluster.nodeprogram import announce, await_ready, node_main, serve_until_signalled
from ..cluster.pool import Launchers, finish
from ..errors import HpcnetError
from ..measure import abba, floor_round, on_one_core, shares

if TYPE_CHECKING:
    from ..measure import Measurement, Paired

# ``measure`` (numpy + scipy) is imported inside the functions that build Measurements: the server and
# client processes this module also runs as must start fast, and scipy alone takes ~0.5 s to import.

LATENCY_METRIC = "rpc.echo.rtt"
INTERLEAVED_METRIC = "rpc.echo.rtt.floor"   # per round, the fastest call (interleaved_echo)
INTERLEAVED_CALLS = 100                     # calls per configuration and round (interleaved_echo)
THROUGHPUT_METRIC = "rpc.echo.calls_per_second"
PEAK_THROUGHPUT_METRIC = "rpc.echo.peak_calls_per_second"   # per round, the best over the client counts
SWEEP_SIZES = (1, 64, 1024, 16384, 65536, 1 << 20)
CLIENT_COUNTS = (1, 2, 4, 8, 16)
CONFIGS = (("tcp", "pooled"), ("tcp", "naive"), ("shm", "pooled"), ("shm", "naive"))
# the native core's tcp configurations, named ``...,impl=native`` (shm works natively too, same host only)
NATIVE_CONFIGS = (("tcp", "pooled", "eth", "native"), ("tcp", "naive", "eth", "native"))


def config_name(transport: str, buffers: str, network: str = "eth", impl: str = "python") -> str:
    name = f"transport={transport},buffers={buffers},net={network}"
    return name if impl == "python" else f"{name},impl={impl}"


def config_parts(config: tuple) -> tuple[str, str, str | None, str]:
    """``(transport, buffers[, network[, impl]])`` -> (transport, buffers, network or None, impl)."""
    transport, buffers, *rest = config
    network = rest[0] if rest else None
    impl = rest[1] if len(rest) > 1 else "python"
    return transport, buffers, network, impl


def iterations_for(size: int, small: int) -> int:
    """Calls per round for a payload size: ``small`` up to 4 KiB, fewer for big payloads (a 1 MiB echo
    takes milliseconds, and its median needs far fewer samples to settle)."""
    if size <= 4096:
        return small
    if size <= 65536:
        return max(2, small // 2)
    return max(2, small // 20)


# -- servers ----------------------------------------------------------------------------------
@dataclass
class Served:
    transport: str
    buffers: str
    host: str
    port: int
    proc: object
    network: str = "eth"
    impl: str = "python"

    @property
    def config(self) -> str:
        return config_name(self.transport, self.buffers, self.network, self.impl)

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def spec(self) -> str:
        return f"{self.transport}:{self.buffers}:{self.impl}:{self.host}:{self.port}"


def start_server(launchers: Launchers, node, *, transport: str, buffers: str, network: str = "eth",
                 handlers: int = 8, dispatch: str = "auto", max_data_length: int | None = None,
                 impl: str = "python") -> Served:
    """Start the echo server on ``node``; returns once it listens. Kill it with ``served.proc.kill()``."""
    from ..reference.native import resolve_impl
    from ..reference.rpc.native import check_config
    if resolve_impl(impl) == "native":   # refused here, in words, rather than by a server that exits
        check_config(transport, buffers)
    argv = [sys.executable, "-m", __name__, "serve", "--host", node.address(network), "--port", "0",
            "--transport", transport, "--buffers", buffers, "--handlers", str(handlers),
            "--dispatch", dispatch, "--impl", impl]
    if max_data_length is not None:
        argv += ["--max-data-length", str(max_data_length)]
    proc = launchers.start(node, argv)
    try:
        ready = await_ready(proc)
    except BaseException:
        proc.kill()
        raise
    return Served(transport, buffers, ready.host, ready.port, proc, network, impl)


@contextlib.contextmanager
def servers(launchers: Launchers, node, configs=CONFIGS, **options):
    """One running server per configuration on ``node``; all killed on exit."""
    started: list[Served] = []
    try:
        for config in configs:
            transport, buffers, net, impl = config_parts(config)
            opts = dict(options, network=net) if net else options
            started.append(start_server(launchers, node, transport=transport, buffers=buffers, impl=impl,
                                        **opts))
        yield started
    finally:
        for s in started:
            s.proc.kill()


# -- latency ----------------------------------------------------------------------------------
def latency_sweep(launchers: Launchers, server_node, client_node, *, configs=CONFIGS,
                  sizes: Sequence[int] = SWEEP_SIZES, rounds: int = 10, iterations: int = 40,
                  warmup: int = 20, network: str = "eth", timeout: float = 300) -> list[Measurement]:
    """Echo round-trip latency per configuration and payload size (see the module docstring)."""
    from ..measure import measurement
    with servers(launchers, server_node, configs, network=network) as served:
        argv = [sys.executable, "-m", __name__, "sweep", "--servers", ",".join(s.spec for s in served),
                "--sizes", ",".join(map(str, sizes)), "--rounds", str(rounds),
                "--iterations", str(iterations), "--warmup", str(warmup)]
        out, _ = finish(launchers.start(client_node, argv), timeout)
    results = json.loads(out)
    measurements = []
    for s in served:
        for size in sizes:
            per_round = results[s.spec][str(size)]
            samples = [x for r in per_round for x in r]
            measurements.append(measurement(
                LATENCY_METRIC, samples, unit="us", direction="lower",
                config=s.config, nodes=(client_node.name, server_node.name),
                params={"size": size, "round_trip": True, "rounds": rounds}))
    return measurements


def round_p50(m: Measurement) -> list[float]:
    """Per-round medians of a latency sweep measurement (its samples are ``rounds`` equal slices)."""
    rounds = m.params["rounds"]
    k = len(m.samples) // rounds
    return [statistics.median(m.samples[r * k:(r + 1) * k]) for r in range(rounds)]


def paired_p50(measurements: Iterable[Measurement], baseline: str, candidate: str, size: int) -> Paired:
    """Per-round median latencies of two configurations at one size, paired by round."""
    from ..measure import Paired
    found: dict[str, list[float]] = {}
    for m in measurements:
        if m.metric == LATENCY_METRIC and m.params.get("size") == size and m.config in (baseline, candidate):
            found[m.config] = round_p50(m)
    missing = {baseline, candidate} - set(found)
    if missing:
        raise HpcnetError(f"no {LATENCY_METRIC} at {size} B for {', '.join(sorted(missing))}")
    return Paired(baseline, candidate, found[baseline], found[candidate], metric=LATENCY_METRIC)


def paired_latency(sweep: Iterable[Measurement], launchers: Launchers, server_node, client_node,
                   baseline: tuple, candidate: tuple, size: int, **sweep_options) -> Paired:
    """``paired_p50`` of a sweep already taken, able to take more rounds of just these two configurations
    (``Paired.more``: a claim whose interval straddles its bound asks for them)."""
    paired = paired_p50(sweep, config_name(*baseline), config_name(*candidate), size)
    base, cand = list(paired.baseline), list(paired.candidate)

    def more(rounds: int) -> tuple[list[float], list[float]]:
        extra = latency_sweep(launchers, server_node, client_node, configs=(baseline, candidate),
                              sizes=(size,), rounds=rounds, **sweep_options)
        got = paired_p50(extra, paired.baseline_name, paired.candidate_name, size)
        base.extend(got.baseline)
        cand.extend(got.candidate)
        return list(base), list(cand)
    paired.more = more
    return paired


def interleaved_echo(baseline: tuple, candidate: tuple, size: int, *, rounds: int,
                     calls: int = INTERLEAVED_CALLS, warmup: int = 100, timeout: float = 60.0,
                     one_core: bool = True, processes: int = 1) -> Paired:
    """Echo round trips of two configurations in this process (server threads and client), taking
    turns call by call (A B, B A, ...): per round, the fastest of ``calls`` calls of each (its floor),
    in µs.

    A configuration is ``(transport, buffers[, network[, impl]])``. An ``impl=native`` one's server and
    client are the native core's, and each of its calls is timed inside the core (``echo_samples`` of
    one call), so no interpreter sits inside its timed call; a Python one's calls are timed here, around
    ``RpcClient.echo``, as the Python implementation's cost includes its interpreter.

    Both configurations share one process's scheduling, so a neighbour's load falls on both alike,
    and with ``one_core`` (the default) the servers' threads and the client all run on one CPU
    (``measure.on_one_core``): a round trip is then the CPU work of both ends and their context
    switches, with no idle CPU inside it, so the ratio is the same on an idle box (where every
    cross-CPU wake-up first wakes a sleeping vCPU) and a loaded one (where it waits for a neighbour).
    A neighbour's time slice can still land inside a call and only ever adds to it, so a round keeps
    its fastest call: the call nothing interrupted. The more calls a round has, the likelier it holds
    one such call on a loaded box: with 20, a Python round's floor was now and then 15-30% above its
    neighbours' at load 10 (a native/Python round of 0.13-0.14 among 0.19-0.20); 100 calls cost a
    Python 64 KiB round 30 ms.

    ``processes`` > 1 takes the rounds in that many fresh processes in turn (``python -m
    pytest_hpcnet.workloads.rpc interleaved``, each its own servers and clients), as equal shares.
    Why: a process keeps its memory placement for its life, and with it the speed of its 64 KiB
    copies: on this 2-core VM the native pooled/naive 64 KiB ratio sat at 0.60-0.61, 0.65-0.66 or
    0.67 in a process, whatever the load and however often its connections were re-opened, while a
    native/Python 64 B ratio varied as much inside a process as between processes. Rounds from
    several processes give a run's median a mix of those placements instead of one draw. ``more``
    takes further rounds (in new processes, or on new connections here, by the same procedure).
    """
    from ..measure import Paired
    base: list[float] = []
    cand: list[float] = []

    def more(n: int) -> tuple[list[float], list[float]]:
        for share in shares(n, processes):
            if processes == 1:
                got = _interleaved_rounds(baseline, candidate, size, share, calls, warmup, timeout, one_core,
                                          start=len(base))
            else:
                got = _interleaved_child(baseline, candidate, size, share, calls, warmup, timeout, one_core,
                                         start=len(base))
            base.extend(got[0])
            cand.extend(got[1])
        return list(base), list(cand)
    more(rounds)
    return Paired(config_name(*baseline), config_name(*candidate), list(base), list(cand),
                  metric=INTERLEAVED_METRIC, more=more)


def _interleaved_rounds(baseline: tuple, candidate: tuple, size: int, rounds: int, calls: int, warmup: int,
                        timeout: float, one_core: bool, start: int = 0) -> tuple[list[float], list[float]]:
    """``rounds`` rounds of ``interleaved_echo`` here, on connections opened for them and closed after
    (round numbers from ``start``: which configuration goes first keeps alternating)."""
    from ..reference.rpc import make_client, make_server
    timed = []
    payload, clock = bytes(size), time.perf_counter_ns
    with contextlib.ExitStack() as stack:
        if one_core:   # before the servers start: their threads inherit the calling thread's CPU
            stack.enter_context(on_one_core())
        for config in (baseline, candidate):
            transport, buffers, _, impl = config_parts(config)
            if impl == "floor":
                timed.append(stack.enter_context(_floor_echo(transport, size, timeout)))
                continue
            server = stack.enter_context(make_server(impl, buffers=buffers, transport=transport))
            client = stack.enter_context(make_client(server.address, impl=impl, buffers=buffers,
                                                     transport=transport, timeout=timeout))
            timed.append(_timed_echo(client, impl, payload, clock))
        for _ in range(warmup):
            for one in timed:
                one()
        base: list[float] = []
        cand: list[float] = []
        for r in range(start, start + rounds):
            b, c = floor_round(timed[0], timed[1], calls, r)
            base.append(b)
            cand.append(c)
        return base, cand


def _config_arg(config: tuple) -> str:
    transport, buffers, network, impl = config_parts(config)
    return f"{transport},{buffers},{network or ''},{impl}"


def _parse_config_arg(text: str) -> tuple:
    transport, buffers, network, impl = (text.split(",") + ["", ""])[:4]
    return (transport, buffers, network or "eth", impl or "python")


def _interleaved_child(baseline: tuple, candidate: tuple, size: int, rounds: int, calls: int, warmup: int,
                       timeout: float, one_core: bool, start: int) -> tuple[list[float], list[float]]:
    """``_interleaved_rounds`` in a fresh Python process (``python -m pytest_hpcnet.workloads.rpc
    interleaved``); its rounds as JSON on its stdout."""
    import subprocess
    argv = [sys.executable, "-m", __name__, "interleaved", "--baseline", _config_arg(baseline),
            "--candidate", _config_arg(candidate), "--size", str(size), "--rounds", str(rounds),
            "--calls", str(calls), "--warmup", str(warmup), "--timeout", str(timeout), "--start", str(start)]
    if not one_core:
        argv.append("--unpinned")
    # the child runs this very package, wherever it was imported from (a work tree, an installed copy)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    budget = 120 + 2 * timeout
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=budget, env=env)
    except subprocess.TimeoutExpired as e:
        raise HpcnetError(f"interleaved echo rounds took more than {budget:.0f} s: {' '.join(argv)}") from e
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise HpcnetError(f"interleaved echo rounds failed (exit {done.returncode}): {' '.join(argv)}\n{tail}")
    got = json.loads(done.stdout)
    return got["baseline"], got["candidate"]


@contextlib.contextmanager
def _floor_echo(transport: str, size: int, timeout: float):
    """The raw-socket ping-pong floor (the native core's, ``floor.rs``: a length-prefixed message echoed
    whole, no RPC at all) as a timed call: one round trip of ``size`` bytes, timed in the core, in µs --
    what ``impl=floor`` means in a configuration. tcp only."""
    from ..reference import native
    if transport != "tcp":
        raise HpcnetError(f"the ping-pong floor runs over tcp, not {transport}")
    if not native.AVAILABLE:
        raise HpcnetError(f"the ping-pong floor is the native core's: {native.WHY_NOT}")
    server = native.core.FloorServer("127.0.0.1", 0)
    try:
        pingpong = native.core.PingPong(*server.address, size, timeout)
        yield lambda: pingpong.samples(1)[0]
        del pingpong   # closes the connection, which ends the server's echo thread
    finally:
        server.stop()


def _timed_echo(client, impl: str, payload: bytes, clock):
    """A function making one echo call on ``client`` and returning its round trip in µs."""
    size = len(payload)
    if impl == "native":
        def one() -> float:
            (rtt,) = client.echo_samples(size, 1)   # timed in the core; it checks the reply's length
            return rtt
        return one

    def one() -> float:
        t0 = clock()
        reply = client.echo(payload)
        rtt = (clock() - t0) / 1000.0
        if len(reply) != size:
            raise HpcnetError(f"echo of {size} B returned {len(reply)} B")
        return rtt
    return one


def peak_per_round(measurements: Iterable[Measurement], config: str) -> list[float]:
    """Per round, the highest calls/s over the client counts measured for ``config``."""
    rows = [m.samples for m in measurements if m.metric == THROUGHPUT_METRIC and m.config == config]
    if not rows:
        raise HpcnetError(f"no {THROUGHPUT_METRIC} for {config}")
    return [max(r[i] for r in rows) for i in range(min(len(r) for r in rows))]


def _connect(spec: str, timeout: float = 30.0):
    from ..reference.rpc import make_client
    transport, buffers, impl, host, port = spec.split(":", 4)
    return make_client((host.strip("[]"), int(port)), impl=impl, transport=transport, buffers=buffers,
                       timeout=timeout)


def _sweep(specs: list[str], sizes: list[int], rounds: int, iterations: int, warmup: int) -> dict:
    clients = {spec: _connect(spec) for spec in specs}
    payloads = {size: bytes(size) for size in sizes}
    out = {spec: {str(size): [] for size in sizes} for spec in specs}
    clock = time.perf_counter_ns
    try:
        for spec, c in clients.items():
            for size in sizes:
                for _ in range(max(1, iterations_for(size, warmup))):
                    c.echo(payloads[size])
        order = list(clients.items())
        lone_native = len(order) == 1 and getattr(order[0][1], "impl", "python") == "native"
        for r in range(rounds):
            for size in sizes:
                payload, n = payloads[size], iterations_for(size, iterations)
                if lone_native:   # back to back in the core (see the module docstring)
                    spec, c = order[0]
                    out[spec][str(size)].append(c.echo_samples(size, n))
                    continue
                samples = {spec: [] for spec in clients}
                for forward in abba(n, r):
                    for spec, c in (order if forward else order[::-1]):
                        if getattr(c, "impl", "python") == "native":   # timed inside the core
                            samples[spec].append(c.echo_samples(size, 1)[0])
                            continue
                        t0 = clock()
                        reply = c.echo(payload)
                        samples[spec].append((clock() - t0) / 1000.0)
                        if len(reply) != size:
                            raise HpcnetError(f"{spec}: echo of {size} B returned {len(reply)} B")
                for spec in clients:
                    out[spec][str(size)].append(samples[spec])
    finally:
        for c in clients.values():
            c.close()
    return out


# -- throughput -------------------------------------------------------------------------------
def throughput(launchers: Launchers, server_node, client_node, start_dir, *, configs=CONFIGS,
               counts: Sequence[int] = CLIENT_COUNTS, rounds: int = 2, seconds: float = 0.4,
               size: int = 64, network: str = "eth", timeout: float = 300) -> list[Measurement]:
    """Aggregate echo calls/s per configuration and client count, each client a separate process on
    ``client_node``. ``start_dir`` is a directory on ``client_node`` for the start file. One
    ``Measurement`` per (configuration, count); its samples are the per-round figures."""
    from ..measure import measurement
    nprocs = max(counts)
    start_file = os.path.join(str(start_dir), f"rpc-throughput-start-{os.getpid()}-{time.time_ns()}")
    with servers(launchers, server_node, configs, network=network) as served:
        specs = ",".join(s.spec for s in served)
        procs = [launchers.start(client_node, [
            sys.executable, "-m", __name__, "load", "--servers", specs, "--index", str(i),
            "--counts", ",".join(map(str, counts)), "--rounds", str(rounds), "--seconds", str(seconds),
            "--size", str(size), "--start-file", start_file]) for i in range(nprocs)]
        try:
            for p in procs:
                await_ready(p, "ready", timeout=120)
            # time zero a little ahead, so every client is polling for it when it comes
            launchers.run(client_node, [sys.executable, "-c",
                                        f"import time; open({start_file!r}, 'w').write(str(time.time() + 0.2))"],
                          timeout=60)
            outputs = [json.loads(finish(p, timeout)[0].splitlines()[-1]) for p in procs]   # after "ready"
        finally:
            for p in procs:
                p.kill()
            launchers.run(client_node, [sys.executable, "-c",
                                        f"import os; os.path.exists({start_file!r}) and os.unlink({start_file!r})"],
                          timeout=60)
    measurements = []
    for s in served:
        for n in counts:
            per_round = []
            for r in range(rounds):
                key = _phase_key(r, n, s.spec)
                per_round.append(sum(o.get(key, 0) for o in outputs) / seconds)
            measurements.append(measurement(
                THROUGHPUT_METRIC, per_round, unit="calls/s", direction="higher",
                config=s.config, nodes=(client_node.name, server_node.name),
                params={"clients": n, "size": size, "seconds": seconds, "rounds": rounds}))
    return measurements


def _phase_key(rnd: int, count: int, spec: str) -> str:
    return f"{rnd}/{count}/{spec}"


GAP = 0.05   # seconds between phases: the previous phase's last calls drain


def _load(specs: list[str], index: int, counts: list[int], rounds: int, seconds: float, size: int,
          start_file: str) -> dict:
    clients = {spec: _connect(spec) for spec in specs}
    payload = bytes(size)
    try:
        for c in clients.values():
            for _ in range(20):
                c.echo(payload)
        announce("ready")
        while not os.path.exists(start_file):
            time.sleep(0.002)
        time.sleep(0.01)   # the writer may still be writing
        with open(start_file) as f:
            t = float(f.read())
        done = {}
        for r, forward in enumerate(abba(rounds)):
            for n in counts:
                for spec in (specs if forward else specs[::-1]):
                    begin, end = t, t + seconds
                    t = end + GAP
                    if index >= n:
                        continue
                    c = clients[spec]
                    while time.time() < begin:
                        time.sleep(min(0.001, max(0.0, begin - time.time())))
                    if getattr(c, "impl", "python") == "native":   # the loop runs in the core
                        done[_phase_key(r, n, spec)] = c.echo_for(size, end - time.time())
                        continue
                    calls = 0
                    while True:
                        c.echo(payload)
                        if time.time() > end:
                            break
                        calls += 1
                    done[_phase_key(r, n, spec)] = calls
        return done
    finally:
        for c in clients.values():
            c.close()


# -- processes --------------------------------------------------------------------------------
def _serve(args) -> int:
    import struct

    from ..reference.rpc import make_server, wire

    def sleep_echo(request):
        (ms,) = struct.unpack(">H", request.payload[:2].rjust(2, b"\0"))
        time.sleep(ms / 1000)
        return wire.EchoResponseProto(payload=request.payload)

    def fail(request):
        raise ValueError(request.payload.decode(errors="replace"))

    options = {"max_data_length": args.max_data_length} if args.max_data_length else {}
    server = make_server(args.impl, transport=args.transport, host=args.host, port=args.port,
                         buffers=args.buffers, handlers=args.handlers, dispatch=args.dispatch, **options)
    server.register("sleepEcho", wire.EchoRequestProto, sleep_echo)
    server.register("fail", wire.EchoRequestProto, fail)
    server.start()
    serve_until_signalled(server.stop, ready=lambda: announce(
        "listening", transport=args.transport, address=server.address, buffers=args.buffers,
        impl=getattr(server, "impl", "python")))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--transport", default="tcp")
    s.add_argument("--buffers", default="pooled")
    s.add_argument("--handlers", type=int, default=8)
    s.add_argument("--dispatch", default="auto")
    s.add_argument("--max-data-length", type=int, default=None)
    s.add_argument("--impl", choices=["native", "python", "auto"], default="python")
    w = sub.add_parser("sweep")
    w.add_argument("--servers", required=True)
    w.add_argument("--sizes", required=True)
    w.add_argument("--rounds", type=int, default=10)
    w.add_argument("--iterations", type=int, default=40)
    w.add_argument("--warmup", type=int, default=20)
    ld = sub.add_parser("load")
    ld.add_argument("--servers", required=True)
    ld.add_argument("--index", type=int, required=True)
    ld.add_argument("--counts", required=True)
    ld.add_argument("--rounds", type=int, default=2)
    ld.add_argument("--seconds", type=float, default=0.4)
    ld.add_argument("--size", type=int, default=64)
    ld.add_argument("--start-file", required=True)
    il = sub.add_parser("interleaved")
    il.add_argument("--baseline", required=True, help="transport,buffers[,network[,impl]]")
    il.add_argument("--candidate", required=True)
    il.add_argument("--size", type=int, required=True)
    il.add_argument("--rounds", type=int, required=True)
    il.add_argument("--calls", type=int, default=INTERLEAVED_CALLS)
    il.add_argument("--warmup", type=int, default=100)
    il.add_argument("--timeout", type=float, default=60.0)
    il.add_argument("--start", type=int, default=0)
    il.add_argument("--unpinned", action="store_true")
    return node_main(parser, _run, argv, label="rpc workload")


def _run(args) -> int:
    if args.cmd == "serve":
        return _serve(args)
    if args.cmd == "interleaved":
        base, cand = _interleaved_rounds(_parse_config_arg(args.baseline), _parse_config_arg(args.candidate),
                                         args.size, args.rounds, args.calls, args.warmup, args.timeout,
                                         not args.unpinned, start=args.start)
        json.dump({"baseline": base, "candidate": cand}, sys.stdout)
        return 0
    specs = args.servers.split(",")
    try:
        if args.cmd == "sweep":
            result = _sweep(specs, [int(x) for x in args.sizes.split(",")], args.rounds, args.iterations,
                            args.warmup)
        else:
            result = _load(specs, args.index, [int(x) for x in args.counts.split(",")], args.rounds,
                           args.seconds, args.size, args.start_file)
    except (HpcnetError, OSError) as e:
        print(f"rpc workload {args.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
