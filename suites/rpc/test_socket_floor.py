"""Raw TCP ping-pong between two nodes: the physical floor the RPC figures are compared against (its
verbs twin, over the native endpoint, runs in the Soft-RoCE guest: test_verbs_rpc.py).

Round-trip times (RTT, not RTT/2) in microseconds, perftest-style statistics, payloads 1 B … 64 KiB.
"""

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.workloads import socket_floor


@pytest.fixture
def pair(cluster):
    if len(cluster.nodes) < 2:
        pytest.skip(f"needs two nodes, cluster {cluster.source} has {len(cluster.nodes)}")
    return cluster.nodes[1], cluster.nodes[0]  # server, client


def test_socket_pingpong_floor(pair, launchers, measure):
    server, client = pair
    results = socket_floor.run(launchers, server, client, iterations=2000, warmup=200)
    measure.record(*results)
    assert [m.params["size"] for m in results] == list(socket_floor.DEFAULT_SIZES)
    for m in results:
        s = m.stats
        assert s["n"] == 2000 and m.params["round_trip"] is True
        assert 0 < s["min"] <= s["median"] <= s["p99"] <= s["p99_9"] <= s["max"]


@pytest.mark.parametrize("kw, match", [({"transport": "verbs"}, "the verbs ping-pong is the native core's"),
                                       ({"transport": "udp", "impl": "native"}, "not 'udp'")])
def test_a_pingpong_it_cannot_run_is_refused_before_anything_starts(pair, launchers, kw, match):
    server, client = pair
    with pytest.raises(ConfigError, match=match) as e:
        socket_floor.run(launchers, server, client, **kw)
    assert "\n" not in str(e.value)
