"""The end-of-run tables: within 120 columns at every level, and columns that say what they hold."""

from __future__ import annotations

import pytest

from pytest_hpcnet.measure import Measurement, measurement, summarize
from pytest_hpcnet.report.terminal import (WIDTH, choose_tables, measurements_table, verdicts_summary,
                                           verdicts_table)

LONG_CONFIG = "transport=tcp,intermediate=shared,shuffle={},net=eth,buffers=pooled,impl=native"


def _measurements() -> list[Measurement]:
    ms = [measurement("mapreduce.terasort.phase.shuffle", [0.1 + i / 100 for i in range(30)], unit="s",
                      direction="lower", config=LONG_CONFIG.format(shuffle),
                      params={"bytes": 20000000, "maps": 4, "nodes": 4, "records": 200000, "reduces": 4})
          for shuffle in ("direct", "fetch")]
    pooled = [19.6] + [80.0] * 98 + [5000.0]   # a p99 headline over pooled latencies
    ms.append(Measurement(metric="qjump.barrier.p99", value=138.0, unit="us", direction="lower",
                          samples=[130.0, 138.0, 150.0], config="alone", params={"scenario": "alone"},
                          stats=summarize(pooled)))
    return ms


def _verdicts() -> list[dict]:
    long_reason = "hardware absent: " + "; ".join(f"feature{i} missing on node0, node1, node2, node3"
                                                   for i in range(6))
    return [
        {"claim_id": "mapreduce.seed000.lustre_only.terasort.rdma_vs_ipoib.a_very_long_name", "outcome": "n/a",
         "bound": ">= 0.47 (tolerance 0.05, warn band 0.03)", "reason": long_reason, "source": "seed 000 " * 20},
        {"claim_id": "rpc.local.pooled_vs_naive.latency_65536", "outcome": "pass", "quantity": 1.05,
         "ci": [0.98, 1.13], "bound": "<= 1.3 (warn band 0.05)", "reason": "CI below 1.3", "source": "local: x",
         "enforced": False, "statement": "pooled buffers are no slower than naive ones at 64 KiB " * 4},
        {"claim_id": "qjump.priority.p99", "outcome": "fail", "quantity": 3.0, "ci": [2.5, 3.5],
         "bound": "<= 2 (warn band 0.3)", "reason": "CI above the stated maximum 2 " * 8, "source": "local: y"},
        {"claim_id": "dfsio.local.write", "outcome": "warn", "quantity": 1.0, "ci": [0.9, 1.1],
         "bound": ">= 1", "reason": "CI straddles 1", "source": "local: z", "bound_from": "mine.toml: faster disks"},
    ]


@pytest.mark.parametrize("tables", ["compact", "full"])
def test_every_line_fits_120_columns(tables):
    text = measurements_table(_measurements(), tables) + "\n" + verdicts_table(_verdicts(), tables) + "\n" \
        + "\n".join(verdicts_summary(_verdicts()))
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not too_wide, "\n".join(too_wide)


def test_the_headline_value_is_not_called_median():
    """qjump's p99 headline (138) beside its pooled latencies' median (80) and min (19.6)."""
    full = measurements_table(_measurements(), "full")
    header = next(line for line in full.splitlines() if line.startswith("config and params"))
    assert header.split()[3:6] == ["value", "median", "min"]
    row = next(line for line in full.splitlines() if line.startswith("alone"))
    assert row.split()[2:5] == ["138", "80", "19.6"]
    compact = measurements_table(_measurements(), "compact")
    assert "median" not in compact.splitlines()[0] and "value" in compact.splitlines()[0]


def test_compact_shows_what_tells_rows_apart_and_full_shows_everything():
    compact = measurements_table(_measurements(), "compact")
    assert "shuffle=direct" in compact and "net=eth" not in compact and "records=200000" not in compact
    full = measurements_table(_measurements(), "full")
    assert "net=eth" in full and "records=200000" in full


def test_fail_and_warn_come_first_and_na_is_one_line_unless_full():
    compact = verdicts_table(_verdicts(), "compact")
    order = [line.split()[0] for line in compact.splitlines()[2:] if line and not line.startswith(" ")]
    assert order[:3] == ["qjump.priority.p99", "dfsio.local.write", "rpc.local.pooled_vs_naive.latency_65536"]
    assert "a_very_long_name" not in compact and "Not listed: 1 n/a" in compact
    assert "(override)" in compact
    full = verdicts_table(_verdicts(), "full")
    assert "a_very_long_name" in full and "pooled buffers are no slower" in full
    assert "bound from mine.toml: faster disks" in full


def test_tables_follow_verbosity_unless_the_option_says():
    assert [choose_tables("auto", v) for v in (-1, 0, 1, 2)] == ["summary", "compact", "full", "full"]
    assert choose_tables("full", -1) == "full" and choose_tables("summary", 2) == "summary"
