"""The fabric's ceiling beside RDMA claims (pytest_hpcnet.fabric): the native tools' output read right,
the claim's quantity computed from the fabric's figures, whose a FAIL is, the report's rows; and the
tcp side measured for real with qperf between two local nodes (no RDMA device here: that side says why)."""

from __future__ import annotations

import shutil

import pytest

from pytest_hpcnet.claims import Claim
from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.fabric import TOOLS, ToolError, attach_ceilings, ceiling_rows, fabric_quantity
from pytest_hpcnet.fabric.ceiling import cause
from pytest_hpcnet.fabric.probe import measure_fabric
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.report.terminal import fabric_table, verdicts_summary

IB_SEND_LAT = """
---------------------------------------------------------------------------------------
                    Send Latency Test
 Dual-port       : OFF          Device         : mlx5_0
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       1000          0.98           4.12         1.03               1.05             0.08            1.31                    4.12   
---------------------------------------------------------------------------------------
"""
IB_WRITE_BW = """
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      5000             11345.12            11340.22              0.181443
"""
QPERF = "tcp_lat:\n    latency  =  17.8 us\ntcp_bw:\n    bw  =  1.17 GB/sec\nquit:\n"
SOCKPERF = ("sockperf: ---> percentile 99.000 =   11.672\nsockperf: ---> percentile 50.000 =    6.800\n"
            "sockperf: ---> <MIN> observation =    6.679\n")


def test_the_tools_outputs_are_read():
    assert TOOLS["ib_send_lat"].parse(IB_SEND_LAT) == 1.03
    assert TOOLS["ib_write_bw"].parse(IB_WRITE_BW) == 11340.22
    assert TOOLS["qperf_tcp_lat"].parse(QPERF) == 17.8
    assert TOOLS["qperf_tcp_bw"].parse(QPERF) == 1170.0
    assert TOOLS["sockperf_pingpong"].parse(SOCKPERF) == 6.8
    with pytest.raises(ToolError, match="clock calibration"):
        TOOLS["ib_send_lat"].parse(IB_SEND_LAT.replace("1.03 ", "inf  "))
    with pytest.raises(ToolError, match="Unable to find the Infiniband/RoCE device"):
        TOOLS["ib_write_bw"].parse(" Unable to find the Infiniband/RoCE device\n")
    with pytest.raises(ValueError, match="twice"):
        TOOLS.add(TOOLS["ib_send_lat"])


def _claim(**kw) -> Claim:
    base = dict(id="c", statement="s", metric="rpc.echo.rtt", candidate="transport=verbs,net=ib",
                baseline="transport=tcp,net=ib", source="seed", kind="reduction", direction="higher", min=0.46,
                fabric="latency")
    return Claim(**{**base, **kw})


def test_the_claims_quantity_from_the_fabrics_figures():
    # latency reduction: RDMA 1.5 us vs IPoIB 12 us one-way -> round trips 8x shorter -> -87.5%
    assert fabric_quantity(_claim(), rdma=1.5, ip=12.0) == pytest.approx(0.875)
    # throughput ratio (higher is better) from bandwidth: 11000 vs 3000 MB/s
    dfsio = _claim(metric="dfsio.write.throughput", kind="ratio", direction="higher", min=2.18, fabric="bandwidth")
    assert fabric_quantity(dfsio, rdma=11000, ip=3000) == pytest.approx(11000 / 3000)
    # job time reduction from bandwidth: the time scales with 1/bandwidth
    job = _claim(metric="mapreduce.sort.job_time", fabric="bandwidth", min=0.34)
    assert fabric_quantity(job, rdma=11000, ip=3000) == pytest.approx(1 - 3000 / 11000)
    # a lower-is-better ratio (candidate time / baseline time) from latency
    rtt = _claim(kind="ratio", direction="lower", min=None, max=0.54)
    assert fabric_quantity(rtt, rdma=2, ip=10) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        fabric_quantity(_claim(), rdma=0, ip=1)


def test_a_claim_may_name_only_a_known_fabric_quantity():
    from pytest_hpcnet.errors import ConfigError
    with pytest.raises(ConfigError, match="fabric must be 'latency' or 'bandwidth'"):
        _claim(fabric="jitter")


def test_whose_a_fail_is():
    claim = _claim()                                     # needs a reduction of at least 0.46
    assert cause(claim, "fail", 0.80, 0.20).startswith("FAIL is the stack's: the fabric alone gives 0.8")
    assert cause(claim, "fail", 0.30, 0.20).startswith("FAIL is the fabric's: the fabric alone gives 0.3")
    assert "though the fabric alone misses" in cause(claim, "pass", 0.30, 0.50)
    assert cause(claim, "fail", None, 0.2) == "fabric ceiling not measured"


def _fabric_measurements(rdma, ip, net="ib"):
    return [measurement("fabric.latency", [rdma] * 3, unit="us", direction="lower", config="transport=verbs,net=ib",
                        params={"tool": "ib_send_lat"}),
            measurement("fabric.latency", [ip] * 3, unit="us", direction="lower", config=f"transport=tcp,net={net}",
                        params={"tool": "qperf_tcp_lat"})]


def test_ceilings_go_next_to_each_claim_and_into_the_report():
    claims = {"c": _claim(published=(0.46, 0.50)), "eth": _claim(id="eth", baseline="transport=tcp,net=eth"),
              "local": _claim(id="local", fabric=None)}
    verdicts = [{"claim_id": "c", "outcome": "fail", "quantity": 0.21, "reason": "whole CI below 0.46"},
                {"claim_id": "eth", "outcome": "n/a", "reason": "hardware absent"},
                {"claim_id": "local", "outcome": "pass", "quantity": 0.5}]
    attach_ceilings(verdicts, _fabric_measurements(1.5, 12.0), claims, notes={"eth": ["rdma: no device"]})
    c, eth, local = verdicts
    assert c["fabric"]["ceiling"] == pytest.approx(0.875) and c["fabric"]["ip"] == 12.0
    assert c["fabric"]["cause"].startswith("FAIL is the stack's")
    assert eth["fabric"]["ceiling"] is None and "rdma: no device" in eth["fabric"]["why"]   # no eth figure
    assert "fabric" not in local
    rows = ceiling_rows(verdicts)
    assert [r[0] for r in rows] == ["c", "eth"]
    assert rows[0][1] == "0.46..0.5 (>= 0.46)" and rows[0][2].startswith("0.875 [rdma 1.5 vs ip/ib 12 us]")
    assert rows[0][3] == "0.21" and rows[0][4].startswith("FAIL: FAIL is the stack's")
    assert "paper claim" in fabric_table(verdicts) and fabric_table([local]) == ""
    assert any("FAIL c: whole CI below 0.46 -- FAIL is the stack's" in line for line in verdicts_summary(verdicts))


@pytest.mark.skipif(shutil.which("qperf") is None, reason="qperf is not installed (Debian package qperf)")
def test_the_ip_side_is_measured_with_qperf_between_two_nodes(tmp_path):
    cluster = local_cluster(2, tmp_path)
    with Launchers(cluster, tmp_path / "logs") as launchers:
        measurements, why = measure_fabric(launchers, cluster.nodes, "latency", "eth", repeat=2)
    ip = [m for m in measurements if m.config == "transport=tcp,net=eth"]
    assert len(ip) == 1 and ip[0].metric == "fabric.latency" and ip[0].unit == "us"
    assert len(ip[0].samples) == 2 and all(s > 0 for s in ip[0].samples)
    assert ip[0].params == {"tool": "qperf_tcp_lat"} and ip[0].nodes == ("node0", "node1")
    if not [m for m in measurements if m.config == "transport=verbs,net=ib"]:   # no RDMA device here
        assert len(why) == 1 and why[0].startswith("rdma: ib_send_lat") and "\n" not in why[0]


def test_every_claim_comparing_rdma_with_ip_names_its_fabric_quantity():
    from pathlib import Path

    from pytest_hpcnet.claims import load_claims
    root = Path(__file__).resolve().parent.parent
    claims = load_claims(sorted(root.glob("suites/*/claims.toml")))
    rdma = [c for c in claims.values() if "transport=verbs" in c.candidate and "transport=tcp" in (c.baseline or "")]
    assert len(rdma) >= 15
    assert [c.id for c in rdma if c.fabric not in ("latency", "bandwidth")] == []


RDMA_CLAIM = """
[[claim]]
id = "my.rdma.latency"
statement = "RDMA RPC round trips are at least 30% shorter than over tcp"
metric = "rpc.echo.rtt"
baseline = "transport=tcp,net=eth"
candidate = "transport=verbs,net=eth"
kind = "reduction"
direction = "higher"
min = 0.3
fabric = "latency"
source = "a test of the fabric ceiling's wiring"
"""

RDMA_TEST = """
from pytest_hpcnet.measure import measurement

def test_rdma_rtt(measure, fabric_ceiling):
    base = [20.0, 21.0, 19.5, 20.5, 20.2, 19.8, 20.1, 20.4, 19.9, 20.3]
    for config, factor in (("transport=tcp,net=eth", 1.0), ("transport=verbs,net=eth", 0.9)):
        measure.record(measurement("rpc.echo.rtt", [b * factor for b in base], unit="us", direction="lower",
                                   config=config))
    print("fabric:", fabric_ceiling("my.rdma.latency"))
"""


@pytest.mark.skipif(shutil.which("qperf") is None, reason="qperf is not installed (Debian package qperf)")
def test_a_run_records_the_ceiling_next_to_the_claim_and_reports_it(pytester, run_hpcnet, tmp_path):
    """tcp only here: qperf measures the IP side between two local nodes, perftest finds no RDMA device
    and says so; the claim (10% shorter, 30% claimed) fails, and the report says the ceiling is missing."""
    import json

    (pytester.path / "mine.toml").write_text(RDMA_CLAIM)
    pytester.makepyfile(test_rdma=RDMA_TEST)
    result = run_hpcnet("--hpcnet-claims=mine.toml", "--hpcnet-cluster=local:2", "-s")
    result.stdout.fnmatch_lines(["*hpcnet fabric ceilings*", "*my.rdma.latency*(>= 0.3)*"])
    [path] = sorted((tmp_path / "report").glob("*.json"))
    record = json.loads(path.read_text())
    fabric = [m for m in record["measurements"] if m["metric"] == "fabric.latency"]
    assert [m["config"] for m in fabric] == ["transport=tcp,net=eth"] or len(fabric) == 2
    [verdict] = record["verdicts"]
    assert verdict["outcome"] == "fail" and verdict["fabric"]["quantity"] == "latency"
    if len(fabric) == 1:                   # no RDMA device: the ceiling is missing, and the report says why
        assert verdict["fabric"]["ceiling"] is None and verdict["fabric"]["ip"] > 0
        assert verdict["fabric"]["cause"].startswith("fabric ceiling not measured: rdma: ib_send_lat")
    result.stdout.fnmatch_lines(["FAIL my.rdma.latency*", "*-- fabric ceiling not measured*"])
