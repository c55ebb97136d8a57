"""Run records round-trip, refuse a schema they don't know, and print through `hpcnet report`."""

import json

import pytest

from pytest_hpcnet.cli import main
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.results import RunRecord, load, provenance


def _record(tmp_path):
    prov = provenance(cluster={"source": "local:2", "name": "local:2", "nodes": []},
                      target={"name": "reference"}, cwd=tmp_path, args=["suites"])
    m = measurement("demo.latency", [3.0, 1.0, 2.0], unit="us", direction="lower", config="tcp",
                    nodes=("node0", "node1"), params={"size": 64})
    verdict = {"claim_id": "demo.claim", "outcome": "warn", "quantity": 0.8, "ci": [0.7, 0.95],
               "bound": "<= 0.9", "reason": "interval straddles the bound", "source": "test"}
    return RunRecord(run_id="r1", provenance=prov, measurements=[m], verdicts=[verdict])


def test_round_trip(tmp_path):
    path = _record(tmp_path).write(tmp_path / "runs")
    back = load(path)
    assert back.measurements[0].nodes == ("node0", "node1")
    assert back.measurements[0].stats["median"] == 2.0
    assert back.verdicts[0]["outcome"] == "warn"
    assert back.provenance["git"] == {"commit": None, "dirty": None}  # tmp_path is no git checkout
    assert not list((tmp_path / "runs").glob("*.tmp"))


def test_unknown_schema_is_refused_with_the_file(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema": 99}))
    with pytest.raises(ConfigError, match="old.json"):
        load(path)


def test_report_command_prints_tables(tmp_path, capsys):
    path = _record(tmp_path).write(tmp_path)
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "demo.latency" in out and "size=64" in out and "WARN" in out and "demo.claim" in out


def test_report_command_on_missing_file(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.json")]) == 2


def test_check_nodes_wants_distinct_addresses_and_a_controller(tmp_path):
    from pytest_hpcnet.results import RunRecord, check_nodes

    def write(addresses, controller=True):
        nodes = [{"name": f"node{i}", "addresses": {"eth": a}} for i, a in enumerate(addresses)]
        cluster = {"nodes": nodes, "controller": {"addresses": {"eth": "10.199.1.254"} if controller else {}}}
        for old in tmp_path.glob("*.json"):
            old.unlink()
        RunRecord(run_id="r", provenance={"cluster": cluster}).write(tmp_path)

    write([f"10.199.1.{i}" for i in range(1, 5)])
    assert check_nodes(tmp_path, 4) is None
    assert "4 node(s) recorded, expected 3" in check_nodes(tmp_path, 3)
    write(["127.0.0.1"] * 4)
    assert "share addresses on eth" in check_nodes(tmp_path, 4)
    write([f"10.199.1.{i}" for i in range(1, 5)], controller=False)
    assert "no controller" in check_nodes(tmp_path, 4)
