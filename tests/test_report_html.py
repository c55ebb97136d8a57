"""The per-run HTML report: content drawn from the record, charts inline, no network references."""

import re
from html.parser import HTMLParser

import numpy as np
import pytest

from pytest_hpcnet.cli import main
from pytest_hpcnet.measure import Measurement, measurement
from pytest_hpcnet.report.html import group_keys, render_html, write_html
from pytest_hpcnet.results import RunRecord

PROV = {"time": "2026-11-30T07:00:00+00:00", "host": "bench-host", "user": "ci", "python": "3.11.7",
        "platform": "Linux-6.1", "machine": "x86_64", "packages": {"numpy": "2.0"},
        "git": {"commit": "0123456789abcdef", "dirty": True}, "args": ["suites/rpc"],
        "cluster": {"source": "local:2", "name": "local:2", "nodes": [{"name": "node0"}, {"name": "node1"}]},
        "target": {"name": "reference"}}

VERDICTS = [
    {"claim_id": "rpc.shm.latency", "outcome": "pass", "quantity": 0.41, "ci": [0.38, 0.45], "bound": "<= 0.8",
     "source": "local: measured 2026-11-30", "reason": "CI below the effective maximum 0.8", "kind": "ratio",
     "confidence": 0.95, "n": 30},
    {"claim_id": "rpc.verbs.latency", "outcome": "n/a", "quantity": None, "ci": None, "bound": "<= 0.58",
     "source": "seed 003, Fig. 5", "reason": "hardware absent: ib_qdr missing on node0", "kind": "reduction"},
    {"claim_id": "mr.terasort.time", "outcome": "fail", "quantity": 1.31, "ci": [1.2, 1.4], "bound": "<= 1.0",
     "source": "local: gate", "reason": "whole CI above the effective maximum 1.04", "kind": "ratio",
     "confidence": 0.95, "n": 30},
]


def _record():
    rng = np.random.default_rng(0)
    ms = []
    for config, base in (("tcp", 80.0), ("shm", 30.0), ("verbs<&>", 12.0)):
        for size in (64, 4096):
            ms.append(measurement("rpc.echo.latency", base * (1 + size / 8192) * rng.lognormal(0, 0.1, 200),
                                  unit="us", direction="lower", config=config, params={"size": size}))
    for config, base in (("tcp", 12.0), ("shm", 9.0)):
        ms.append(measurement("mapreduce.terasort.time", base * rng.lognormal(0, 0.05, 5), unit="s",
                              direction="lower", config=config, params={"rows": 100000}))
    return RunRecord(run_id="20261130T070000Z-test-1", provenance=PROV, measurements=ms, verdicts=VERDICTS)


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attrs = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(v or "" for k, v in attrs if k in ("src", "href", "xlink:href"))


def test_report_has_provenance_claims_suites_and_charts(tmp_path):
    path = write_html(_record(), tmp_path / "out")
    assert path == tmp_path / "out" / "20261130T070000Z-test-1.html"
    text = path.read_text()
    top = text.index('id="contents"')
    assert top < text.index('id="claims"') < text.index('id="suite-mapreduce"') < text.index('id="suite-rpc"') \
        < text.index('id="provenance"')
    for fact in ("bench-host", "0123456789abcdef (local changes)", "local:2", "node0, node1", "suites/rpc"):
        assert fact in text
    for v in VERDICTS:
        assert v["claim_id"] in text and v["source"] in text and v["bound"].replace("<", "&lt;") in text
        assert v["outcome"].upper() in text
    assert "95% [0.38, 0.45]" in text and 'class="fail"' in text and 'class="na"' in text
    # FAIL before PASS, and the n/a claim folded away under one line
    assert text.index('data-outcome="fail"') < text.index('data-outcome="pass"') < text.index('data-outcome="n/a"')
    assert '<details class="unjudged" id="claims-na"><summary>1 N/A' in text
    # one bar chart per metric, a CDF per payload size for the latency metric only (us; the job time is s)
    assert len(re.findall(r'data-kind="bar"', text)) == 2
    assert len(re.findall(r'data-kind="cdf"', text)) == 2
    assert text.count("<svg") == 4
    # config names are escaped, not injected
    assert "verbs&lt;&amp;&gt;" in text and "verbs<&>" not in text


def test_a_claim_shows_its_statement_published_range_and_links_to_its_chart():
    verdict = dict(VERDICTS[2], statement="TeraSort is no slower with the gate", metric="mapreduce.terasort.time",
                   baseline="tcp", candidate="shm", published=[0.21, 0.37],
                   bound_from="mine.toml: our disks are faster")
    record = _record()
    record.verdicts = [verdict]
    text = render_html(record)
    assert "TeraSort is no slower with the gate" in text and "0.21 .. 0.37" in text
    assert "override: mine.toml: our disks are faster" in text
    assert '<a href="#metric-mapreduce.terasort.time">' in text and 'id="metric-mapreduce.terasort.time"' in text
    assert '<a href="#claim-mr.terasort.time">FAIL mr.terasort.time</a>' in text   # in the contents


def test_many_configurations_become_small_multiples_of_at_most_eight_series():
    """Issue 19: the RPC CDF drew 24 series in repeating colours; 1 MiB flattened the rest on a linear axis."""
    ms = [measurement("rpc.echo.rtt", [100.0 * (1 + size / 1024) + i for i in range(20)], unit="us",
                      direction="lower", config=f"transport=t{c},net=eth", params={"size": size})
          for c in range(10) for size in (64, 1048576)]
    text = render_html(RunRecord(run_id="many", provenance={}, measurements=ms, verdicts=[]))
    charts = text.split('<figure class="chart"')[1:]
    assert len([c for c in charts if 'data-kind="bar"' in c]) == 2            # 10 configs: 5 + 5
    assert len([c for c in charts if 'data-kind="cdf"' in c]) == 4            # 2 sizes x (5 + 5)
    for chart in charts:
        series = set(re.findall(r'id="chart\d+-series(\d+)-', chart))
        assert 1 <= len(series) <= 8
    assert "Every series also has net=eth" in text   # legends name only what differs


def test_report_needs_no_network_and_no_scripts(tmp_path):
    text = render_html(_record())
    parser = _Collect()
    parser.feed(text)
    assert "script" not in parser.tags and "link" not in parser.tags and "img" not in parser.tags
    # every reference stays inside the page (SVG's own #ids)
    assert parser.attrs and all(a.startswith("#") for a in parser.attrs)
    # the only URLs are XML namespace names, which browsers never fetch
    urls = set(re.findall(r'https?://[^"\s<>]+', text))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls


def test_svg_ids_are_unique_across_charts():
    text = render_html(_record())
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids))


def test_bars_group_by_parameters_that_vary_within_a_configuration():
    by_size = [Measurement("m", 1.0, "us", "lower", config=c, params={"size": s, "round_trip": True})
               for c in ("tcp", "shm") for s in (1, 64)]
    assert group_keys(by_size) == ["size"]
    # QJump style: every parameter is fixed per configuration (scenario, level) -> bars side by side
    scenarios = [Measurement("m", 1.0, "us", "lower", config=c, params={"scenario": c, "level": lvl})
                 for c, lvl in (("alone", 0), ("interference", 0), ("qjump", 7))]
    assert group_keys(scenarios) == []


def test_empty_run_still_renders(tmp_path):
    record = RunRecord(run_id="empty", provenance={})
    text = write_html(record, tmp_path).read_text()
    assert "recorded no measurements" in text and "No claims" in text


def test_report_command_writes_html_and_prints_its_path(tmp_path, capsys):
    path = _record().write(tmp_path / "runs")
    assert main(["report", str(path), "-o", str(tmp_path / "html")]) == 0
    out = capsys.readouterr().out
    html_path = tmp_path / "html" / "20261130T070000Z-test-1.html"
    assert html_path.is_file() and out.rstrip().endswith(f"wrote {html_path}")
    assert "rpc.echo.latency" in out                              # tables printed by default
    assert main(["report", str(path), "-q"]) == 0                 # default dir: next to the record
    out = capsys.readouterr().out
    assert out.strip() == f"wrote {tmp_path / 'runs' / '20261130T070000Z-test-1.html'}"


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_sample_counts_draw_without_cdf(tmp_path, n):
    m = measurement("x.lat", [5.0] * n, unit="us", direction="lower", config="a")
    text = render_html(RunRecord(run_id="t", provenance={}, measurements=[m]))
    assert 'data-kind="bar"' in text and 'data-kind="cdf"' not in text
