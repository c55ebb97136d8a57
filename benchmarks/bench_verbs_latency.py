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
"""

from __future__ import annotations

import argparse
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


class Round(NamedTuple):
    ref: float                                   # ib_send_lat's RTT (2 B), before and after the round
    same: float                                  # ib_send_lat's RTT at the ping-pong's own message size
    got: dict[str, tuple[float, float]]          # side -> (ping-pong, RPC) median RTTs


def median_ratio(xs, ys) -> float:
    return statistics.median(x / y for x, y in zip(xs, ys))
_SERVER = """
import sys, json
from pytest_hpcnet.reference.rpc.native import NativeRpcServer
from pytest_hpcnet_native import _native
floor = _native.VerbsFloorServer(sys.argv[1], 0)
rpc = NativeRpcServer("verbs", sys.argv[1], 0).start()
print(json.dumps([floor.address[1], rpc.address[1]]), flush=True)
sys.stdin.read()
floor.stop(); rpc.stop()
"""
_CLIENT = """
import sys, json, statistics
from pytest_hpcnet.reference.rpc.native import NativeRpcClient
from pytest_hpcnet_native import _native
host, floor_port, rpc_port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pingpong = _native.verbs_pingpong(host, floor_port, size, 600, 50)
client = NativeRpcClient((host, rpc_port), transport="verbs")
echo = client.echo_samples(size, 200, 50)
client.close()
print(json.dumps([statistics.median(pingpong), statistics.median(echo)]))
"""


def one_side(host: str, env: dict) -> tuple[float, float]:
    """(ping-pong, RPC echo) median round trips in us, from fresh processes with ``env``."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER, host], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("the verbs server process exited before it listened")
        floor_port, rpc_port = json.loads(line)
        out = subprocess.run([sys.executable, "-c", _CLIENT, host, str(floor_port), str(rpc_port), str(SIZE)],
                             capture_output=True, text=True, env=env, timeout=300)
        if out.returncode:
            raise RuntimeError(f"the verbs client failed: {out.stderr.strip().splitlines()[-1:]}")
        pingpong, echo = json.loads(out.stdout)
        return pingpong, echo
    finally:
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
        rows, before = [], device_rtt()
        for r in range(args.rounds):
            got = {side: one_side(host, envs[side]) for side in ("AB" if r % 2 == 0 else "BA")}
            after = device_rtt()
            ref = (before * after) ** 0.5
            same = device_rtt(wire)
            rows.append(Round(ref, same, got))
            print(f"round {r}: ib_send_lat RTT {ref:.1f} us ({wire} B: {same:.1f} us); " + "; ".join(
                f"{s} ping-pong {pp:.1f} us, RPC {rpc:.1f} us ({rpc / ref:.2f}x)" for s, (pp, rpc) in sorted(got.items())),
                flush=True)
            before = after
    print(f"B: {' '.join(args.b_env) or '-'}{f' core {args.b_core}' if args.b_core else ''}; "
          f"medians over {args.rounds} rounds (x: over that round's ib_send_lat RTT; goal for the RPC <= 1.5x):")
    refs, sames = [r.ref for r in rows], [r.same for r in rows]
    print(f"  ib_send_lat at {wire} B over 2 B: {median_ratio(sames, refs):.2f}x")
    for side in "AB":
        pp = [r.got[side][0] for r in rows]
        rpc = [r.got[side][1] for r in rows]
        print(f"  {side}: ping-pong {statistics.median(pp):.1f} us ({median_ratio(pp, refs):.2f}x; "
              f"{median_ratio(pp, sames):.2f}x the device at {wire} B), "
              f"RPC {statistics.median(rpc):.1f} us ({median_ratio(rpc, refs):.2f}x)")
    wins = sum(r.got["B"][1] < r.got["A"][1] for r in rows)
    print(f"  B's RPC faster than A's in {wins} of {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
