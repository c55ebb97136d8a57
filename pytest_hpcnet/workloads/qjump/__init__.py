"""The QJump workload: barrier-sync latency alone, under bulk interference, and at a priority level
(the Naiad experiment, seed 004), on any cluster.

Modules: ``barrier`` (the latency program, one per node), ``bulk`` (interference flows: sinks and
sources), ``scenarios`` (alone / interference / qjump, as Measurements), ``commands`` (``hpcnet qjump
run`` with its socket ``hook``, ``hpcnet qjump-config``). The levels and the tc layout that enforces them
are the cluster's (``cluster.shaping``); the ``.bs`` files the barrier writes are ``report.bsfile``'s
format, which ``hpcnet plot cdf`` draws.
"""
