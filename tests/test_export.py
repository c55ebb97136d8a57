"""hpcnet export: each format parsed back, the InfluxDB line protocol by an independent parser."""

from __future__ import annotations

import csv
import io
import json

import pytest

from pytest_hpcnet import export
from pytest_hpcnet.cli import main
from pytest_hpcnet.measure import measurement
from pytest_hpcnet.results import RunRecord, load


def _exported(capsys, path, fmt) -> str:
    assert main(["export", str(path), "--format", fmt]) == 0
    return capsys.readouterr().out


def test_csv_and_jsonl_carry_every_figure(nightly_records, capsys):
    path = nightly_records["worse"]
    record = load(path)
    rows = list(csv.DictReader(io.StringIO(_exported(capsys, path, "csv"))))
    objects = [json.loads(line) for line in _exported(capsys, path, "jsonl").splitlines()]
    assert len(rows) == len(objects) == 3          # two measurements, one judged claim (the n/a ones left out)
    for row, obj in zip(rows, objects):
        assert set(row) == set(obj) == set(export.COLUMNS)
        assert row["run_id"] == obj["run_id"] == record.run_id
        assert row["cluster"] == obj["cluster"] == nightly_records["cluster"]
        assert row["target_version"] == obj["target_version"] == "2.10.1"
        assert row["commit"] == obj["commit"] == record.provenance["git"]["commit"]
    by_config = {o["config"]: o for o in objects if o["row"] == "measurement"}
    for m in record.measurements:
        assert by_config[m.config]["value"] == m.value and float(
            next(r for r in rows if r["config"] == m.config)["value"]) == m.value
        assert json.loads(by_config[m.config]["params"]) == m.params
    [claim] = [o for o in objects if o["row"] == "claim"]
    verdict = next(v for v in record.verdicts if v["claim_id"] == nightly_records["claim"])
    assert (claim["quantity"], [claim["ci_lo"], claim["ci_hi"]], claim["outcome"], claim["bound"]) == \
        (verdict["quantity"], verdict["ci"], "fail", ">= 2.18")


def test_influx_line_protocol_parses_back(nightly_records, capsys):
    parser = pytest.importorskip("line_protocol_parser", reason="pip install line-protocol-parser (test extra)")
    path = nightly_records["worse"]
    record = load(path)
    lines = _exported(capsys, path, "influx").splitlines()
    points = [parser.parse_line(line) for line in lines]
    assert [p["measurement"] for p in points] == ["hpcnet_measurement", "hpcnet_measurement", "hpcnet_claim"]
    ns = 1795917600 * 10**9                         # 2026-11-29T02:00:00Z
    assert all(p["time"] == ns for p in points)
    for p in points:
        assert p["tags"]["cluster"] == nightly_records["cluster"] and p["tags"]["target_version"] == "2.10.1"
        assert p["fields"]["run_id"] == record.run_id
    verbs = next(p for p in points if p["tags"].get("config") == "transport=verbs")
    m = next(m for m in record.measurements if m.config == "transport=verbs")
    assert verbs["fields"]["value"] == m.value and verbs["fields"]["n"] == 8
    assert verbs["tags"]["p_nrFiles"] == "60" and verbs["tags"]["metric"] == "dfsio.write.throughput"
    claim = points[2]
    assert claim["tags"]["claim_id"] == nightly_records["claim"]
    assert claim["fields"]["outcome"] == "fail" and claim["fields"]["bound"] == ">= 2.18"
    assert claim["fields"]["enforced"] is True


def test_influx_escapes_what_the_protocol_reserves(tmp_path, capsys):
    parser = pytest.importorskip("line_protocol_parser", reason="pip install line-protocol-parser (test extra)")
    nasty = 'a b,c=d"e\\f'
    record = RunRecord(run_id="r1", provenance={
        "time": "2026-12-01T00:00:00+00:00", "host": "h 1", "cluster": {"name": "c,1"},
        "target": {"name": "hadoop", "version": "3.4 (vendor=x)"}, "git": {"commit": None}},
        measurements=[measurement("m.x", [1.0, 2.0, 3.0], unit="MB/s", direction="higher", config=nasty,
                                  params={"k=v": nasty, "empty": ""})],
        verdicts=[{"claim_id": "c id", "outcome": "pass", "quantity": float("nan"), "ci": None, "kind": "ratio",
                   "bound": 'say "hi"\nthere', "n": 3, "enforced": True}])
    path = record.write(tmp_path)
    lines = _exported(capsys, path, "influx").splitlines()
    assert len(lines) == 2
    m, c = (parser.parse_line(line) for line in lines)
    assert m["tags"]["config"] == nasty and m["tags"]["p_k=v"] == nasty and "p_empty" not in m["tags"]
    assert m["tags"]["host"] == "h 1" and m["tags"]["target_version"] == "3.4 (vendor=x)"
    assert "commit" not in m["tags"]                  # no commit recorded: no empty tag
    assert c["tags"]["claim_id"] == "c id" and "quantity" not in c["fields"]   # NaN is not a field value
    assert c["fields"]["bound"] == 'say "hi" there'


def test_export_writes_a_file(nightly_records, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    assert main(["export", str(nightly_records["worse"]), str(nightly_records["three"][0]), "--format", "jsonl",
                 "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 6
