"""One asv ``track_`` benchmark per local claim: the claim's ratio, measured at a small scale, oriented so
that lower is better (asv flags an upward step as a regression).

Adding a claim is one line in ``TRACKED``: its id (from ``suites/*/claims.toml``) and the ``@workload``
from ``common`` that measures the claim's metric under its baseline and candidate configurations.
Adding a workload is one decorated function in ``common`` returning ``Measurement``s. A benchmark's
name is ``track_<claim id>__<form>_lower_is_better`` and its unit says which ratio it is, e.g.
``ratio qjump / alone (lower is better)`` or, for a claim that wants a *higher* ratio, the inverse:
``ratio alone / interference (lower is better)``.

Every workload runs once per ``asv run`` (as a ``setup_cache``) and all of its claims read from it.
"""

from __future__ import annotations

from pytest_hpcnet.claims import Claim

from . import common

# Local claims the suites do not define yet, with the goals their issues set (same model as claims.toml).
# When a suite's claims.toml gains one, delete it here and point TRACKED at the suite's id.
PENDING_CLAIMS = {
    c.id: c for c in (
        Claim(id="rpc.local.tcp_vs_socket_floor", metric="rpc.echo.rtt", baseline="socket-floor",
              candidate="transport=tcp", kind="ratio", direction="lower", max=1.3,
              statement="A 64-byte echo over the reference RPC on tcp costs at most 1.3x a raw TCP ping-pong",
              source="local: issue 3 goal (not yet in suites/rpc/claims.toml)"),
        Claim(id="rpc.local.shm_vs_tcp", metric="rpc.echo.rtt", baseline="transport=tcp",
              candidate="transport=shm", kind="ratio", direction="lower", max=0.5,
              statement="The reference RPC over shm halves the 64-byte echo round trip of tcp",
              source="local: issue 3 goal (not yet in suites/rpc/claims.toml)"),
    )
}

# claim id -> the workload that measures it
TRACKED = {
    "rpc.local.tcp_vs_socket_floor": common.rpc_small,
    "rpc.local.shm_vs_tcp": common.rpc_small,
    "qjump.interference.p99": common.qjump_small,
    "qjump.interference.p50": common.qjump_small,
    "qjump.priority.p99": common.qjump_small,
    "qjump.priority.p99_vs_interference": common.qjump_small,
    "mapreduce.local.terasort.direct_vs_fetch.shuffle": common.mapreduce_small,
    "mapreduce.local.terasort.direct_vs_fetch.job_time": common.mapreduce_small,
    "mapreduce.local.terasort.shm_vs_tcp.shuffle": common.mapreduce_small,
    "mapreduce.local.sort.direct_vs_fetch.job_time": common.mapreduce_small,
    "mapreduce.local.terasort.native_vs_python.merge": common.mapreduce_merge_small,
    "dfsio.local.blockstore.shm_vs_tcp.write": common.dfsio_small,
    "dfsio.local.posix.no_fsync_vs_fsync_close.write": common.dfsio_small,
    "dfsio.local.checksum.crc32c_native_vs_python_crc32.cpu": common.dfsio_cpu_small,
    "dfsio.local.blockstore.native_vs_python.cpu": common.dfsio_cpu_small,
    "dfsio.local.checksum.crc32c_native_vs_instruction_floor.cpu": common.checksum_floor_small,
}


def _make_track(claim: Claim, workload):
    def track(cache):
        return common.lower_is_better(claim, common.measurements_of(cache))

    def setup(cache):
        common.measurements_of(cache)   # NotImplementedError -> asv skips, with the workload's reason

    form, unit = common.lower_is_better_form(claim)
    track.__name__ = track.__qualname__ = common.benchmark_name(claim)
    track.__doc__ = f"{claim.statement} [{claim.id}; bound {claim.bound_text()}; tracked as {form}]"
    track.setup, track.setup_cache, track.unit = setup, workload, unit
    track.timeout = 600
    return track


def _generate(namespace: dict) -> None:
    claims = {**PENDING_CLAIMS, **common.suite_claims()}
    for claim_id, workload in TRACKED.items():
        if claim_id not in claims:
            raise KeyError(f"benchmarks/bench_claims.py: TRACKED names claim {claim_id!r}, which no "
                           "suites/*/claims.toml (nor PENDING_CLAIMS) defines")
        fn = _make_track(claims[claim_id], workload)
        namespace[fn.__name__] = fn


_generate(globals())
