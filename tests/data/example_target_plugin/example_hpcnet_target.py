"""An example third-party pytest-hpcnet target: TeraGen only, run in the test's own process.

Every other workload the suites ask of it skips the test, naming the target and the workload.
"""

import time
from pathlib import Path

from pytest_hpcnet.reference.mapreduce.teragen import teragen
from pytest_hpcnet.targets import WorkloadResult, Workloads


class ExampleWorkloads(Workloads):
    offered = frozenset({"teragen"})

    def teragen(self, rows, outdir, *, maps=1, start_row=0):
        t0 = time.perf_counter()
        r = teragen(rows, Path(outdir), maps=maps, start_row=start_row)
        return WorkloadResult("teragen", time.perf_counter() - t0, r.rows, {"checksum": r.checksum_hex})


class ExampleTarget:
    name = "example"

    def configurations(self):
        return {"default": {}}

    def describe(self):
        return {"name": self.name, "version": "1.0"}

    def workloads(self, cluster, launchers, workdir):
        return ExampleWorkloads(self, cluster, launchers, workdir)
