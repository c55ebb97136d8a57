"""Time budgets of the Hadoop target, in one place.

CI runs the suites with ``-n 2`` on a 2-core box, and the other xdist worker may keep both cores busy
(the verbs tests' QEMU guest emulates its CPUs in software). What Hadoop does is JVMs starting and
working, so a loaded box stretches every step. Measured on a 2-core box, idle and then with two
shells spinning on the CPU (and neighbours' QEMU guest and test runs: load average 10-20):

    MiniCluster start-up                            12 s  ->  22-53 s  (README: ~2 min on a slower box)
    one small job (teragen 1000 rows, uber)         16 s  ->  63 s
    TestDFSIO -write then -read (two jobs)          55 s  -> 189 s
    TeraGen + TeraSort + TeraValidate + fs cat      62 s  -> 140 s
    hpcnet crosscheck, 4 teragens + 4 yarn clients 111 s  -> 371 s    (the slowest Hadoop test)

i.e. 1.2x-4.5x. Each budget is an idle figure with room for a slower box (``IDLE_*``, above what was
measured) times ``LOADED``, for the other worker holding both cores.
"""

from __future__ import annotations

LOADED = 4                       # the stretch of a loaded box (jobs up to 4x; the IDLE figures hold the rest)

IDLE_MINICLUSTER_START_S = 120   # the slowest start-up reported for a 2-core box
IDLE_CLIENT_S = 30               # one short client JVM: fs, yarn application, the RPC benchmark server's start
IDLE_TEST_S = 150                # the slowest Hadoop test's own work (the crosscheck command: 371 s loaded)

MINICLUSTER_START_S = LOADED * IDLE_MINICLUSTER_START_S
CLIENT_S = LOADED * IDLE_CLIENT_S
# A Hadoop test's pytest-timeout. It covers the test's fixtures too, and the first test to ask for
# the shared MiniCluster pays its start-up.
TEST_S = MINICLUSTER_START_S + LOADED * IDLE_TEST_S

# One MapReduce program at the size a user asks for (``hpcnet crosscheck -- teragen 1G`` on a real
# cluster): not a test figure; the tests' small jobs end well inside their TEST_S.
JOB_S = 900
