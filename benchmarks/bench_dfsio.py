"""POSIX-target DFSIO write throughput next to ``dd`` in the same run, same directory, same size and
the same fsync policy (our fsync=close vs ``dd conv=fsync``: one fsync before the file is closed).

asv: ``DfsioVsDd.track_*`` (s/GiB of each, and dd/dfsio; lower is better). Directly:

    python benchmarks/bench_dfsio.py [--size-mb 256] [--dir /path/on/the/disk/under/test] [--rounds 9]

prints both throughputs and ``dfsio/dd``. Both figures exclude process start-up: dd's is the rate it
reports itself, ours is TestDFSIO's per-task figure (bytes / I/O time). dd writes 1 MiB blocks;
TestDFSIO writes its default -bufferSize of 1,000,000 bytes. MB = 2^20 bytes in both.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pytest_hpcnet import cluster as clusters
from pytest_hpcnet.workloads.dfsio import FsTarget, parse_dfsio_args, run_dfsio

DEFAULT_SIZE_MB = 256
_DD_RATE = re.compile(r"(\d+) bytes .* copied, ([\d.e+-]+) s")


def dd_write_mb_s(directory: Path, size_mb: int) -> float:
    target = directory / "dd.out"
    proc = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={size_mb}", "conv=fsync"],
                          capture_output=True, text=True, check=True)
    target.unlink()
    m = _DD_RATE.search(proc.stderr)
    if not m:
        raise RuntimeError(f"cannot read dd's rate from: {proc.stderr.strip()}")
    return int(m.group(1)) / float(m.group(2)) / 2**20


def dfsio_write_mb_s(directory: Path, size_mb: int, launchers, cluster) -> float:
    opts = parse_dfsio_args(["-write", "-nrFiles", "1", "-size", f"{size_mb}MB"])
    target = FsTarget("posix", root=str(directory / "dfsio"), fsync="close")
    result = run_dfsio(opts, target, launchers, cluster, write_res_file=False)
    shutil.rmtree(directory / "dfsio", ignore_errors=True)
    return result.throughput


def compare(directory: Path, size_mb: int, rounds: int = 1) -> dict:
    """``rounds`` paired rounds, alternating which writer goes first (A B, B A, ...) so drift on a
    shared machine hits both alike. The headline ratio is the median of per-round ratios."""
    root = Path(tempfile.mkdtemp(prefix="hpcnet-bench-dfsio-"))
    dd, ours = [], []
    try:
        with clusters.open("local:1", root) as (cluster, launchers):
            for r in range(rounds):
                if r % 2 == 0:
                    dd.append(dd_write_mb_s(directory, size_mb))
                    ours.append(dfsio_write_mb_s(directory, size_mb, launchers, cluster))
                else:
                    ours.append(dfsio_write_mb_s(directory, size_mb, launchers, cluster))
                    dd.append(dd_write_mb_s(directory, size_mb))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"dd": statistics.median(dd), "dfsio": statistics.median(ours),
            "ratio": statistics.median(o / d for o, d in zip(ours, dd)), "dd_runs": dd, "dfsio_runs": ours}


class DfsioVsDd:
    """asv benchmark: one comparison per run. asv reads an upward step as a regression, so the
    tracked figures are lower-is-better: seconds per GiB written, and dd's rate over ours."""

    timeout = 600
    size_mb = 64

    def setup_cache(self):
        workdir = Path(tempfile.mkdtemp(prefix="hpcnet-bench-dfsio-dir-"))
        try:
            return compare(workdir, self.size_mb, rounds=5)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def track_dd_seconds_per_gib(self, result):
        return 1024 / result["dd"]

    def track_dfsio_seconds_per_gib(self, result):
        return 1024 / result["dfsio"]

    def track_dd_over_dfsio(self, result):
        return 1 / result["ratio"]

    track_dd_seconds_per_gib.unit = track_dfsio_seconds_per_gib.unit = "s/GiB"
    track_dd_over_dfsio.unit = "ratio"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=DEFAULT_SIZE_MB)
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk under test "
                        "(default: a new temporary directory)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="hpcnet-bench-dfsio-dir-", dir=args.dir))
    try:
        r = compare(workdir, args.size_mb, args.rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"directory {workdir.parent}, {args.size_mb} MB per file, fsync once before close, "
          f"{args.rounds} paired rounds (medians)")
    print(f"dd conv=fsync bs=1M : {r['dd']:8.1f} MB/s  (runs: {', '.join(f'{x:.1f}' for x in r['dd_runs'])})")
    print(f"dfsio fsync=close   : {r['dfsio']:8.1f} MB/s  (runs: {', '.join(f'{x:.1f}' for x in r['dfsio_runs'])})")
    print(f"dfsio / dd          : {r['ratio']:8.2f}  (median of per-round ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
