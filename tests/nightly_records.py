"""Run records of "nightly runs" of a seed claim, made by the plugin itself (not written by hand).

``make_nightly_records(dest)`` runs pytest once per night on a two-node inventory of this host (named
like a cluster, each node reading the canned sysfs tree of seed 001's testbed: EDR + POWER8, so the
claim's markers hold), a test that records TestDFSIO write
throughput over IPoIB and over RDMA in paired rounds, and the dfsio suite's claims file; the plugin
judges ``dfsio.seed001.throughput.rdma_vs_ipoib`` at the end from those measurements and writes the run
record. What a real nightly series would differ in, and one box in one minute cannot, is then set in
each record: its date (a night apart) and the stack's version. The project commit stays the same, as
it does when only the stack under test changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pytest_hpcnet.results import git_commit

REPO = Path(__file__).resolve().parents[1]
SEED_CLAIM = "dfsio.seed001.throughput.rdma_vs_ipoib"

TEST_FILE = '''
import os
from pytest_hpcnet.measure import measurement


def test_testdfsio_write_ipoib_vs_rdma(measure):
    ratio = float(os.environ["NIGHTLY_RATIO"])
    ipoib = [1510.0, 1490.0, 1502.0, 1497.0, 1508.0, 1493.0, 1505.0, 1499.0]   # MB/s per paired round
    rdma = [x * ratio * (1 + 0.004 * ((i % 3) - 1)) for i, x in enumerate(ipoib)]
    params = {"nrFiles": 60, "size": "1GB"}
    measure.record(
        measurement("dfsio.write.throughput", ipoib, unit="MB/s", direction="higher",
                    config="transport=tcp,net=ib", params=params),
        measurement("dfsio.write.throughput", rdma, unit="MB/s", direction="higher",
                    config="transport=verbs", params=params))
'''


CLUSTER = "op-rehearsal"
INVENTORY = """
[cluster]
name = "{name}"
workdir = "work-{name}"

[[nodes]]
name = "dn1"
host = "127.0.0.1"
sysroot = "{sysroot}"

[[nodes]]
name = "dn2"
host = "127.0.0.1"
sysroot = "{sysroot}"
"""


@dataclass(frozen=True)
class Night:
    date: str          # ISO time of the run
    version: str       # the stack's version that night
    ratio: float       # RDMA / IPoIB throughput measured
    cluster: str = CLUSTER


# three nights near the published 2.18x-2.26x, then a fourth 25% worse than the third
NIGHTS = (
    Night("2026-11-26T02:00:00+00:00", "2.9.0", 2.24),
    Night("2026-11-27T02:00:00+00:00", "2.9.1", 2.22),
    Night("2026-11-28T02:00:00+00:00", "2.10.0", 2.25),
)
WORSE = Night("2026-11-29T02:00:00+00:00", "2.10.1", round(2.25 * 0.75, 4))
# the same claim measured on another cluster in between: not a point of this cluster's series
ELSEWHERE = Night("2026-11-27T14:00:00+00:00", "2.9.1", 2.0, cluster="other-cluster")


def make_nightly_records(dest: Path, nights=NIGHTS, work: Path | None = None) -> list[Path]:
    """One real run record per night in ``dest`` (returned in night order)."""
    dest = Path(dest)
    work = Path(work or dest.parent / "nightly-work")
    work.mkdir(parents=True, exist_ok=True)
    (work / "test_nightly.py").write_text(TEST_FILE)
    paths = []
    for i, night in enumerate(nights):
        out = work / f"report-{i}"
        inventory = work / f"{night.cluster}.toml"
        inventory.write_text(INVENTORY.format(name=night.cluster, sysroot=REPO / "fixtures" / "sysfs" / "edr-power8"))
        env = {**os.environ, "NIGHTLY_RATIO": str(night.ratio),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "test_nightly.py",
             f"--hpcnet-cluster={inventory.name}",
             f"--hpcnet-claims={REPO / 'suites' / 'dfsio' / 'claims.toml'}", f"--hpcnet-report={out}"],
            cwd=work, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        [made] = list(out.glob("*.json")) or [None]
        assert made is not None, f"no run record ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
        record = json.loads(made.read_text())
        verdict = next(v for v in record["verdicts"] if v["claim_id"] == SEED_CLAIM)
        assert verdict["quantity"] is not None, verdict
        record["provenance"]["time"] = night.date
        record["provenance"]["target"]["version"] = night.version
        record["provenance"]["git"] = git_commit(REPO)   # what a run of this checkout records
        stamp = night.date[:19].replace("-", "").replace(":", "") + "Z"
        record["run_id"] = f"{stamp}-{record['run_id'].split('-', 1)[1]}"
        dest.mkdir(parents=True, exist_ok=True)
        path = dest / f"{record['run_id']}.json"
        path.write_text(json.dumps(record, indent=1, sort_keys=True))
        paths.append(path)
    return paths
