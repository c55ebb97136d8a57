"""The native core (``impl=native``) through the suite's own workloads: the interleaved latency sweep
and the calls/s phases, native configurations next to the Python one, on the cluster's nodes. The run
record then holds ``...,impl=native`` measurements beside the Python ones (information: the rpc
claims name the Python configurations). Skipped, with the reason, where the native core is not built.
"""

from __future__ import annotations

import pytest

from pytest_hpcnet.reference import native
from pytest_hpcnet.workloads import rpc as wr
from pytest_hpcnet.workloads import socket_floor

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason=native.WHY_NOT or "-")

PYTHON_TCP = ("tcp", "pooled", "eth", "python")
CONFIGS = (PYTHON_TCP, *wr.NATIVE_CONFIGS)


def test_latency_sweep_native_next_to_python(nodes, launchers, measure):
    server, client = nodes
    sweep = wr.latency_sweep(launchers, server, client, configs=CONFIGS, sizes=(64, 65536), rounds=3,
                             iterations=20, warmup=10)
    measure.record(*sweep)
    assert {m.config for m in sweep} == {"transport=tcp,buffers=pooled,net=eth",   # python: the claims' name
                                         "transport=tcp,buffers=pooled,net=eth,impl=native",
                                         "transport=tcp,buffers=naive,net=eth,impl=native"}
    for m in sweep:
        assert len(m.samples) == 3 * wr.iterations_for(m.params["size"], 20) and min(m.samples) > 0


def test_latency_sweep_of_one_native_configuration_keeps_the_record_shape(nodes, launchers, measure):
    """Alone, a native configuration's calls of a round run in one call into the core (perftest's way;
    its figures are in test_verbs_rpc.py's summary): the record keeps the interleaved sweep's shape,
    every call a sample, ``rounds`` equal slices."""
    server, client = nodes
    sweep = wr.latency_sweep(launchers, server, client, configs=wr.NATIVE_CONFIGS[:1], sizes=(64,), rounds=2,
                             iterations=30, warmup=5)
    measure.record(*sweep)
    (m,) = sweep
    assert m.config.endswith(",impl=native") and m.params["rounds"] == 2
    assert len(m.samples) == 2 * wr.iterations_for(64, 30) and min(m.samples) > 0
    assert len(wr.round_p50(m)) == 2


def test_calls_per_second_native_next_to_python(nodes, launchers, workdirs, measure):
    server, client = nodes
    results = wr.throughput(launchers, server, client, workdirs[client.name], configs=CONFIGS[:2],
                            counts=(1, 2), rounds=1, seconds=0.3)
    measure.record(*results)
    assert {m.config for m in results} == {"transport=tcp,buffers=pooled,net=eth",
                                           "transport=tcp,buffers=pooled,net=eth,impl=native"}
    assert all(x > 0 for m in results for x in m.samples)


def test_native_socket_floor(nodes, launchers, measure):
    """The raw-socket ping-pong with both ends native (``tcp/eth,impl=native``): the floor the native
    RPC's figures are read against, in the same run record."""
    server, client = nodes
    results = socket_floor.run(launchers, server, client, sizes=(64, 65536), iterations=300, warmup=30,
                               impl="native")
    measure.record(*results)
    assert {m.config for m in results} == {"tcp/eth,impl=native"}
    assert all(len(m.samples) == 300 and min(m.samples) > 0 for m in results)
