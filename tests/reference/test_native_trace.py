"""HPCNET_TRACE (native/src/trace.rs): the native core's round-trip points, and the breakdown that
benchmarks/bench_verbs_latency.py --breakdown makes of them. Over tcp here (the verbs end's own points,
post/posted/received/read, run in the Soft-RoCE guest)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_hpcnet.reference import native

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason=native.WHY_NOT or "native core absent")

_CALLS = """
import json
from pytest_hpcnet.reference.rpc import make_client, make_server
from pytest_hpcnet_native import _native
with make_server("native", handlers=1) as s, make_client(s.address, impl="native") as c:
    c.echo_samples(64, 30, 5)
print(json.dumps(_native.trace_take()))
"""


def _points(trace: str | None) -> list:
    env = {k: v for k, v in os.environ.items() if k != "HPCNET_TRACE"}
    if trace is not None:
        env["HPCNET_TRACE"] = trace
    out = subprocess.run([sys.executable, "-c", _CALLS], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_each_timed_call_is_bracketed_with_the_server_dispatch_inside():
    points = _points("1")
    names = [name for name, _ in points]
    assert names == ["start", "dispatch", "end"] * 35      # 5 warm-up calls, 30 timed
    times = [t for _, t in points]
    assert times == sorted(times)


@pytest.mark.parametrize("value", [None, "", "0"])
def test_no_points_are_kept_unless_asked_for(value):
    assert _points(value) == []


def _bench():
    path = Path(__file__).parents[2] / "benchmarks" / "bench_verbs_latency.py"
    spec = importlib.util.spec_from_file_location("bench_verbs_latency", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_breakdown_lines_up_both_sides_per_call_and_leaves_the_previous_calls_tail_out():
    bench = _bench()
    client, server = [], []
    for i in range(bench.WARMUP + 10):
        t0 = i * 100_000
        client += [("start", t0), ("post", t0 + 2_000)] + [("sleep", t0 + 30_000)] * (i % 5 == 0) + [
            ("received", t0 + 50_000), ("end", t0 + 51_000)]
        # the previous reply's send returns inside this call: not this call's
        server += [("posted", t0 + 5_000), ("received", t0 + 20_000), ("dispatch", t0 + 21_000),
                   ("post", t0 + 26_000 + (i % 2) * 2_000)]
    n, rows, present = bench.timeline(client, server)
    assert n == 10
    # a point few calls have (a sleep) is no row, but counted
    assert rows == [(2.0, "client post"), (20.0, "server received"), (21.0, "server dispatch"),
                    (27.0, "server post"), (50.0, "client received"), (51.0, "client end")]
    assert present["client sleep"] == 2 and present["server sleep"] == 0 and present["client post"] == 10
