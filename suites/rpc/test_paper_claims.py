"""The published RPCoIB claims (seed 003), run where their hardware is: InfiniBand QDR and an RDMA device.

Without that hardware every test here is skipped with the reason (``pytest -m ib_qdr suites/rpc``
then exits cleanly). On the testbed the baseline is the reference RPC over tcp on the IPoIB (``ib``)
or Ethernet (``eth``) address, the candidate the reference RPC over the ``verbs`` transport; both use
pooled buffers (the RPCoIB design). The paper's "varied data sizes" latency figure is checked as the
per-round geometric mean over ``PAPER_SIZES`` of the per-size medians (a ratio of geometric means is
the geometric mean of the per-size ratios, so no size dominates); peak throughput is the highest
calls/s over 1..16 client processes in each round. ``HPCNET_RPC_PAPER_ITERATIONS`` (default 100) is
the calls per size per round, after as many warm-up calls: the Soft-RoCE rehearsal runs fewer, since
an emulated call takes milliseconds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_hpcnet.claims import load_claims
from pytest_hpcnet.measure import Series
from pytest_hpcnet.options import env_int
from pytest_hpcnet.workloads import rpc as wr

CLAIMS = load_claims([Path(__file__).with_name("claims.toml")])
PAPER = sorted(c.id for c in CLAIMS.values() if c.id.startswith("rpc.seed003."))
LATENCY = [cid for cid in PAPER if ".latency." in cid]
THROUGHPUT = [cid for cid in PAPER if ".throughput." in cid]
PAPER_SIZES = (1, 64, 256, 1024, 4096)


def config_of(name: str) -> tuple[str, str, str]:
    """``transport=tcp,net=ib`` -> ("tcp", "pooled", "ib"); verbs runs over the ib network."""
    fields = dict(part.split("=", 1) for part in name.split(","))
    transport = fields["transport"]
    return transport, fields.get("buffers", "pooled"), fields.get("net", "ib" if transport == "verbs" else "eth")


def missing_networks(nodes, *configs) -> str:
    """Why the nodes cannot run these configurations (a network some node has no address on), or ''.
    On local:N, say, there is no ``ib`` network: the claim is n/a with that reason, not a KeyError."""
    lacking = [f"{net} on {', '.join(n.name for n in nodes if net not in n.addresses)}"
               for net in sorted({cfg[2] for cfg in configs}) if any(net not in n.addresses for n in nodes)]
    return f"no address for network {'; '.join(lacking)} (give one per node in the inventory)" if lacking else ""


def geomean_per_round(measurements, config: str) -> Series:
    rows = [wr.round_p50(m) for m in measurements if m.config == config and m.metric == wr.LATENCY_METRIC]
    return Series(wr.LATENCY_METRIC, config,
                  [math.exp(sum(math.log(r[i]) for r in rows) / len(rows)) for i in range(len(rows[0]))])


@pytest.mark.ib_qdr
@pytest.mark.rdma
@pytest.mark.parametrize("claim_id", LATENCY)
def test_seed003_latency(claim_id, nodes, launchers, hpcnet, measure, claim, fabric_ceiling):
    c = CLAIMS[claim_id]
    base, cand = config_of(c.baseline), config_of(c.candidate)
    if why := missing_networks(nodes, base, cand):
        claim(c.id, None, unavailable=why)
    server, client = nodes
    calls = env_int("HPCNET_RPC_PAPER_ITERATIONS", 100)
    results = wr.latency_sweep(launchers, server, client, configs=(base, cand), sizes=PAPER_SIZES,
                               rounds=hpcnet.rounds, iterations=calls, warmup=calls)
    measure.record(*results)
    fabric_ceiling(c.id)          # perftest vs qperf on the same nodes: what the fabric alone allows
    claim(c.id, geomean_per_round(results, wr.config_name(*base)),
          geomean_per_round(results, wr.config_name(*cand)))


@pytest.mark.ib_qdr
@pytest.mark.rdma
@pytest.mark.parametrize("claim_id", THROUGHPUT)
def test_seed003_peak_throughput(claim_id, nodes, launchers, workdirs, measure, claim, fabric_ceiling):
    c = CLAIMS[claim_id]
    base, cand = config_of(c.baseline), config_of(c.candidate)
    if why := missing_networks(nodes, base, cand):
        claim(c.id, None, unavailable=why)
    server, client = nodes
    results = wr.throughput(launchers, server, client, workdirs[client.name], configs=(base, cand),
                            rounds=10, seconds=2.0)
    measure.record(*results)
    fabric_ceiling(c.id)
    claim(c.id, *(Series(wr.PEAK_THROUGHPUT_METRIC, name, wr.peak_per_round(results, name))
                  for name in (wr.config_name(*base), wr.config_name(*cand))))


def test_every_paper_claim_has_a_test_and_the_papers_hardware():
    assert set(LATENCY) | set(THROUGHPUT) == set(PAPER) and len(PAPER) == 4
    for cid in PAPER:
        assert set(CLAIMS[cid].markers) == {"ib_qdr", "rdma"}
        assert config_of(CLAIMS[cid].candidate) == ("verbs", "pooled", "ib")
        assert config_of(CLAIMS[cid].baseline)[0] == "tcp"
