"""Issue 17's verbs latency goal (native verbs RPC 64 B p50 <= 1.5x ``ib_send_lat``'s round trip, same
device, same boot) for two settings of the native verbs end taking turns, so a change to the end is
judged against the device in the same rounds. Needs an RDMA device: the Soft-RoCE guest runs it.

Each round, A and B in turn (A first in even rounds): a fresh server process (the native verbs
ping-pong floor and a native RPC server answering its built-in echo) and a fresh client process (600
ping-pongs, then 200 echo calls, of 64 B, after 50 of each not counted), reporting each median round
trip; then perftest's ``ib_send_lat`` (2 bytes, typical one-way x 2), whose round trips just before and
after the round (geometric mean) are that round's reference. Beside it, once a round, ``ib_send_lat``
with the ping-pong's own message (``--wire-ref``, default the 64 B plus the floor's 4-byte length and
the transport's 16-byte header: 84 B): what the device costs for the bytes our messages carry, so the
ping-pong over it is the endpoint's own share (under TCG rxe's per-message cost grows with the first
tens of bytes: 84 B cost 1.15-1.52x what 2 B did in four boots, 144 B 2% more than 84 B). One round
of both, first, is not counted (fresh processes' first native calls ran slow in the guest). A is the
environment as it is; B adds
``--b-env NAME=VALUE`` settings (the end's knobs: HPCNET_VERBS_SPIN_US, HPCNET_VERBS_YIELD_US,
HPCNET_VERBS_INLINE) and ``--b-core DIR``, a directory holding another build of ``pytest_hpcnet_native``
(first on B's PYTHONPATH). In the guest:

    hpcnet vm test --command "python3 /opt/hpcnet/benchmarks/bench_verbs_latency.py --b-env HPCNET_VERBS_SPIN_US=1000"

``--breakdown`` runs, instead of the rounds, one pass of each side with ``HPCNET_TRACE`` set (2000
ping-pongs, 2000 calls) and prints where a round trip goes: the median time from each call's start at
which each side posts its send, its poll sees the peer's message, a read hands it up, the RPC server
starts on the call (native/src/trace.rs).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from pytest_hpcnet import cluster as clusters
from pytest_hpcnet.fabric import TOOLS, ToolError
from pytest_hpcnet.fabric.probe import run_tool

SIZE = 64
WARMUP = 50   # calls of each kind before the timed ones, in every process


class Round(NamedTuple):
    ref: float                                   # ib_send_lat's RTT (2 B), before and after the round
    same: float                                  # ib_send_lat's RTT at the ping-pong's own message size
    got: dict[str, "Pass"]                       # side -> its pass


def median_ratio(xs, ys) -> float:
    return statistics.median(x / y for x, y in zip(xs, ys))


def timeline(client: list, server: list) -> tuple[int, list[tuple[float, str]], collections.Counter]:
    """Where a round trip's time goes, from HPCNET_TRACE's points (native/src/trace.rs): for each timed
    call (between the client's ``start`` and ``end``, warm-up calls left out) every point of both
    sides inside it, the server's from its first ``received`` on (before it, its points belong to the
    call before: under Soft-RoCE a send's system call returns only after the peer has its message);
    returns how many calls, the median offset in us from the call's start of each point that most
    calls have, in order, and in how many calls each point came at all (a ``sleep``, a wake-up
    paid for, is rare and costly: its count says more than its offset). The n-th repeat of a point
    in a call is its own row."""
    calls, current = [], None
    for name, t in client:
        if name == "start":
            current = (t, [])
        elif current and name == "end":
            calls.append((current[0], t, current[1]))
            current = None
        elif current:
            current[1].append(("client " + name, t))
    calls = calls[WARMUP:]
    times = [t for _, t in server]
    offsets = collections.defaultdict(list)
    present = collections.Counter()
    for t0, t1, mine in calls:
        theirs = server[bisect.bisect_left(times, t0):bisect.bisect_right(times, t1)]
        first = next((i for i, (name, _) in enumerate(theirs) if name == "received"), len(theirs))
        seen = collections.Counter()
        for label, t in sorted(mine + [("server " + name, t) for name, t in theirs[first:]], key=lambda p: p[1]):
            seen[label] += 1
            offsets[label if seen[label] == 1 else f"{label} ({seen[label]})"].append((t - t0) / 1e3)
        offsets["client end"].append((t1 - t0) / 1e3)
        present.update(seen.keys())
    rows = [(statistics.median(v), label) for label, v in offsets.items() if len(v) >= 0.8 * len(calls)]
    return len(calls), sorted(rows), present


def print_breakdown(side: str, p: "Pass") -> None:
    for kind, rtt in (("pingpong", p.pingpong), ("rpc", p.rpc)):
        n, rows, present = timeline(p.points[kind], p.points["server"])
        if not rows:
            sys.exit(f"bench_verbs_latency: {side} took no trace points (a build without native/src/trace.rs?)")
        print(f"{side} {'ping-pong' if kind == 'pingpong' else 'RPC echo'} {SIZE} B, median {rtt:.1f} us: where a "
              f"round trip goes ({n} calls; median us from the call's start)")
        for offset, label in rows:
            print(f"  {offset:7.1f}  {label}")
        print("  slept on the completion channel: " + ", ".join(
            f"{end} in {present[end + ' sleep']} of {n} calls" for end in ("client", "server")))


_SERVER = """
import sys, json
from pytest_hpcnet.reference.rpc.native import NativeRpcServer
from pytest_hpcnet_native import _native
floor = _native.VerbsFloorServer(sys.argv[1], 0)
rpc = NativeRpcServer("verbs", sys.argv[1], 0).start()
print(json.dumps([floor.address[1], rpc.address[1]]), flush=True)
sys.stdin.read()
floor.stop(); rpc.stop()
print(json.dumps(getattr(_native, "trace_take", list)()), flush=True)   # HPCNET_TRACE's points, if on
"""
_CLIENT = """
import sys, json, statistics
from pytest_hpcnet.reference.rpc.native import NativeRpcClient
from pytest_hpcnet_native import _native
host, (floor_port, rpc_port, size, n_pp, n_rpc, WARMUP) = sys.argv[1], map(int, sys.argv[2:8])
take = getattr(_native, "trace_take", list)
pingpong = _native.verbs_pingpong(host, floor_port, size, n_pp, WARMUP)
pp_points = take()
client = NativeRpcClient((host, rpc_port), transport="verbs")
echo = client.echo_samples(size, n_rpc, WARMUP)
client.close()
print(json.dumps([statistics.median(pingpong), statistics.median(echo), pp_points, take()]))
"""


class Pass(NamedTuple):
    pingpong: float                              # median round trips, us
    rpc: float
    points: dict[str, list]                      # HPCNET_TRACE's: "pingpong", "rpc" (client), "server"


def one_side(host: str, env: dict, pingpongs: int = 600, calls: int = 200) -> Pass:
    """Median ping-pong and RPC echo round trips from fresh processes with ``env``."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER, host], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("the verbs server process exited before it listened")
        floor_port, rpc_port = json.loads(line)
        out = subprocess.run([sys.executable, "-c", _CLIENT, host, *map(str, (floor_port, rpc_port, SIZE, pingpongs,
                                                                              calls, WARMUP))],
                             capture_output=True, text=True, env=env, timeout=300)
        if out.returncode:
            raise RuntimeError(f"the verbs client failed: {out.stderr.strip().splitlines()[-1:]}")
        pingpong, echo, pp_points, rpc_points = json.loads(out.stdout)
        server.stdin.close()
        server_points = json.loads(server.stdout.readline() or "[]")
        return Pass(pingpong, echo, {"pingpong": pp_points, "rpc": rpc_points, "server": server_points})
    finally:
        if not server.stdin.closed:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--b-env", nargs="*", default=[], metavar="NAME=VALUE")
    p.add_argument("--b-core", type=Path, help="a directory holding another build of pytest_hpcnet_native")
    p.add_argument("--wire-ref", type=int, default=None, metavar="BYTES",
                   help="ib_send_lat's size for the same-bytes reference (default: the ping-pong's message)")
    p.add_argument("--breakdown", action="store_true",
                   help="instead of the rounds, one traced pass of each side (HPCNET_TRACE): where a round trip goes")
    args = p.parse_args(argv)
    bad = [kv for kv in args.b_env if "=" not in kv]
    if bad or args.rounds < 1:
        p.error(f"--b-env takes NAME=VALUE, got {bad}" if bad else "--rounds: at least 1")
    if args.wire_ref is not None and args.wire_ref < 1:
        p.error("--wire-ref: at least 1 byte")
    if args.b_core and not (args.b_core / "pytest_hpcnet_native").is_dir():
        p.error(f"--b-core: no pytest_hpcnet_native under {args.b_core}")
    from pytest_hpcnet.reference import native
    from pytest_hpcnet.reference.transport.verbs.loader import VerbsUnavailable, rdma_host
    from pytest_hpcnet.reference.transport.base import LENGTH   # the floor's length prefix, same wire
    from pytest_hpcnet.reference.transport.verbs.wire import HDR
    why = native.WHY_NOT if not native.AVAILABLE else native.core.verbs_unavailable()
    try:
        host = rdma_host("127.0.0.1")
    except VerbsUnavailable as e:
        why = why or str(e)
    if why:
        sys.exit(f"bench_verbs_latency: native verbs cannot run here: {why}")
    envs = {"A": dict(os.environ), "B": dict(os.environ, **dict(kv.split("=", 1) for kv in args.b_env))}
    if args.b_core:
        envs["B"]["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.b_core), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as root, clusters.open("local:1", Path(root)) as (cluster, launchers):
        node = cluster.nodes[0]

        wire = args.wire_ref or SIZE + LENGTH.size + HDR.size

        def device_rtt(size: int | None = None) -> float:
            tool = TOOLS["ib_send_lat"] if size is None else dataclasses.replace(TOOLS["ib_send_lat"], size=size)
            try:
                return 2 * run_tool(launchers, node, node, tool, host)
            except ToolError as e:
                sys.exit(f"bench_verbs_latency: {e}")

        for side in envs.values():            # not counted
            one_side(host, side)
        if args.breakdown:
            for side in "AB" if args.b_env or args.b_core else "A":
                print_breakdown(side, one_side(host, dict(envs[side], HPCNET_TRACE="1"), 2000, 2000))
            return 0
        rows, before = [], device_rtt()
        for r in range(args.rounds):
            got = {side: one_side(host, envs[side]) for side in ("AB" if r % 2 == 0 else "BA")}
            after = device_rtt()
            ref = (before * after) ** 0.5
            same = device_rtt(wire)
            rows.append(Round(ref, same, got))
            print(f"round {r}: ib_send_lat RTT {ref:.1f} us ({wire} B: {same:.1f} us); " + "; ".join(
                f"{s} ping-pong {p.pingpong:.1f} us, RPC {p.rpc:.1f} us ({p.rpc / ref:.2f}x)"
                for s, p in sorted(got.items())), flush=True)
            before = after
    print(f"B: {' '.join(args.b_env) or '-'}{f' core {args.b_core}' if args.b_core else ''}; "
          f"medians over {args.rounds} rounds (x: over that round's ib_send_lat RTT; goal for the RPC <= 1.5x):")
    refs, sames = [r.ref for r in rows], [r.same for r in rows]
    print(f"  ib_send_lat at {wire} B over 2 B: {median_ratio(sames, refs):.2f}x")
    for side in "AB":
        pp = [r.got[side].pingpong for r in rows]
        rpc = [r.got[side].rpc for r in rows]
        print(f"  {side}: ping-pong {statistics.median(pp):.1f} us ({median_ratio(pp, refs):.2f}x; "
              f"{median_ratio(pp, sames):.2f}x the device at {wire} B), "
              f"RPC {statistics.median(rpc):.1f} us ({median_ratio(rpc, refs):.2f}x)")
    wins = sum(r.got["B"].rpc < r.got["A"].rpc for r in rows)
    print(f"  B's RPC faster than A's in {wins} of {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
