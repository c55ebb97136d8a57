"""The published RDMA-Hadoop MapReduce claims (seeds 000 and 001), run where their hardware is.

Each test carries the hardware markers of its paper's testbed, so on a cluster without them it is
skipped with the reason (``pytest -m ib_qdr suites/mapreduce`` then runs none and exits 0). On the
real testbed it runs the job at the paper's shape -- 32 maps, 16 TeraSort / 14 Sort reducers for seed
000; 60 maps for seed 001 -- on input whose size comes from the environment (the published figures
span several sizes; the default here is a modest one that still takes minutes):

    HPCNET_MAPREDUCE_PAPER_ROWS   TeraGen rows for TeraSort claims (default 100,000,000 = 10 GB)
    HPCNET_MAPREDUCE_PAPER_BYTES  RandomWriter bytes for Sort claims (default 10 GiB)
    HPCNET_MAPREDUCE_PAPER_ROUNDS paired rounds (default 3: each round is two full jobs)
"""

from __future__ import annotations

import pytest

from pytest_hpcnet.claims import load_claims
from pytest_hpcnet.hardware import config_features
from pytest_hpcnet.options import env_int
from pytest_hpcnet.workloads import mapreduce as wm

from .mapreduce_pairs import CLAIMS_FILE, PairRun, job_of

CLAIMS = load_claims([CLAIMS_FILE])
SEED000 = [c.id for c in CLAIMS.values() if c.id.startswith("mapreduce.seed000.")]
SEED001 = [c.id for c in CLAIMS.values() if c.id.startswith("mapreduce.seed001.")]
SHAPE = {  # (maps, reduces) per seed and job, as the papers ran them
    "seed000": {"terasort": (32, 16), "sort": (32, 14)},
    "seed001": {"terasort": (60, 60), "sort": (60, 60)},
}


def run_claim(claim_id, seed, engine, cluster, shared_dir, measure, claim, hpcnet, fabric_ceiling):
    c = CLAIMS[claim_id]
    # the candidate's transport (verbs) needs pyverbs and an RDMA device on every node: where they are
    # absent the claim is n/a, said before any job runs
    requires = config_features(c.baseline, c.candidate)
    if hpcnet.missing(requires):
        claim(c.id, None, requires=requires)     # records n/a and skips with the reason
    job = job_of(c)
    maps, reduces = SHAPE[seed][job]
    inp = wm.prepare_input(engine, job, shared_dir, maps=maps,
                           rows=env_int("HPCNET_MAPREDUCE_PAPER_ROWS", 100_000_000),
                           sort_bytes=env_int("HPCNET_MAPREDUCE_PAPER_BYTES", 10 << 30))
    rounds = env_int("HPCNET_MAPREDUCE_PAPER_ROUNDS", 3)
    run = PairRun(engine, measure, inp, c.baseline, c.candidate, shared_dir, reduces=reduces,
                  maps=maps if job == "terasort" else None, rounds=rounds)
    try:
        paired = run.paired(c.metric)
        fabric_ceiling(c.id)      # perftest vs qperf on the same nodes: what the fabric alone allows
        claim(c.id, paired)
    finally:
        run.record()


@pytest.mark.ib_qdr
@pytest.mark.lustre
@pytest.mark.parametrize("claim_id", SEED000)
def test_seed000_mapreduce_over_lustre(claim_id, engine, cluster, shared_dir, measure, claim, hpcnet, fabric_ceiling):
    run_claim(claim_id, "seed000", engine, cluster, shared_dir, measure, claim, hpcnet, fabric_ceiling)


@pytest.mark.edr
@pytest.mark.power8
@pytest.mark.parametrize("claim_id", SEED001)
def test_seed001_openpower(claim_id, engine, cluster, shared_dir, measure, claim, hpcnet, fabric_ceiling):
    run_claim(claim_id, "seed001", engine, cluster, shared_dir, measure, claim, hpcnet, fabric_ceiling)


def test_every_paper_claim_has_a_test():
    paper = {c.id for c in CLAIMS.values() if not c.is_local}
    assert paper == set(SEED000) | set(SEED001)
    for cid in SEED000:
        assert set(CLAIMS[cid].markers) == {"ib_qdr", "lustre"}
    for cid in SEED001:
        assert set(CLAIMS[cid].markers) == {"edr", "power8"}
