"""Launch cost of one process per launcher: local, netns, ssh (reused connection), slurm (a job step).

Each sample is ``launchers.run(node, ["true"])``: start, wait, collect output; what a workload pays per
process it starts on a node, beyond the program itself. ssh reuses one master connection per node
(the first start pays the handshake, so setup does one start before timing); slurm runs each process
as a step of an allocation the launcher holds. netns, ssh and slurm need root; ssh needs OpenSSH's
sshd and slurm Debian's slurmctld, slurmd and munge (benchmarks that cannot run are skipped, saying why).

    asv run --bench bench_launch
    python benchmarks/bench_launch.py [--samples 30] [--launcher ssh ...]   # a table of figures
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from asv_runner.benchmarks.mark import SkipNotImplemented

LAUNCHERS = ["local", "netns", "ssh", "slurm"]


class Bench:
    """One node reached through ``kind``; ``launch()`` starts ``true`` there and waits for it."""

    def __init__(self, kind: str):
        from pytest_hpcnet import cluster as clusters
        from pytest_hpcnet.cluster import load_cluster, local_cluster, netns, slurmbox, sshd
        self.stack = ExitStack()
        self.root = Path(tempfile.mkdtemp(prefix=f"hpcnet-bench-{kind}-"))
        self.stack.callback(shutil.rmtree, self.root, ignore_errors=True)
        try:
            if kind == "local":
                cluster = local_cluster(1, self.root / "c")
            else:
                if not netns.available():
                    raise SkipNotImplemented(netns.NEEDS_ROOT)
                hosts = self.stack.enter_context(netns.temporary_netns_cluster(1, self.root / "c"))
                cluster = hosts
                if kind == "ssh":
                    if why := sshd.missing():
                        raise SkipNotImplemented(why)
                    daemons = self.stack.enter_context(sshd.EmbeddedSshd(hosts, self.root / "sshd"))
                    cluster = load_cluster(str(daemons.write_inventory(self.root / "ssh.toml")), self.root)
                elif kind == "slurm":
                    if why := slurmbox.missing():
                        raise SkipNotImplemented(why)
                    box = self.stack.enter_context(slurmbox.EmbeddedSlurm(hosts, self.root / "slurm"))
                    cluster = load_cluster(str(box.write_inventory(self.root / "slurm.toml")), self.root)
            _, self.launchers = self.stack.enter_context(clusters.open(cluster, self.root))
            self.node = cluster.nodes[0]
            self.launch()          # the first start opens the ssh master / the slurm allocation
        except BaseException:
            self.stack.close()
            raise

    def launch(self) -> None:
        code, _, err = self.launchers.run(self.node, ["true"], timeout=60)
        if code != 0:
            raise RuntimeError(f"true exited with {code}: {err}")

    def close(self) -> None:
        self.stack.close()


class LaunchCost:
    params = LAUNCHERS
    param_names = ["launcher"]
    timeout = 180
    number = 1
    repeat = (5, 30, 60.0)

    def setup(self, kind):
        self.bench = Bench(kind)

    def teardown(self, kind):
        # asv tears down after a setup that skipped too (no sshd or Slurm here): nothing was started
        bench = getattr(self, "bench", None)
        if bench is not None:
            bench.close()

    def time_launch_one_process(self, kind):
        self.bench.launch()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--launcher", action="append", choices=LAUNCHERS)
    args = parser.parse_args(argv)
    print(f"{'launcher':8} {'median ms':>10} {'min ms':>8} {'p90 ms':>8} {'first ms':>9}  samples")
    for kind in args.launcher or LAUNCHERS:
        t0 = time.perf_counter()
        try:
            bench = Bench(kind)
        except SkipNotImplemented as e:
            print(f"{kind:8} skipped: {e}")
            continue
        setup = time.perf_counter() - t0
        try:
            samples = []
            for _ in range(args.samples):
                t = time.perf_counter()
                bench.launch()
                samples.append((time.perf_counter() - t) * 1000)
        finally:
            bench.close()
        samples.sort()
        p90 = samples[min(len(samples) - 1, int(0.9 * len(samples)))]
        print(f"{kind:8} {statistics.median(samples):10.1f} {samples[0]:8.1f} {p90:8.1f} {setup * 1000:9.0f}  "
              f"{len(samples)}")
    print("first ms: building the node (namespace, daemons) and the first start (ssh handshake, allocation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
