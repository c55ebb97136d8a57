from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SYSFS = REPO / "fixtures" / "sysfs"


@pytest.fixture
def sysfs():
    """Canned /sys + /proc trees of real hardware (see fixtures/sysfs/README.md)."""
    return SYSFS


@pytest.fixture
def run_hpcnet(pytester, tmp_path):
    """Run pytest in a subprocess with the plugin, a report dir under tmp_path, and no cache."""
    def run(*args, env=None):
        if env:
            for k, v in env.items():
                pytester._monkeypatch.setenv(k, v)
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--hpcnet-report={tmp_path / 'report'}",
                                             *args, timeout=240)
    return run


@pytest.fixture(scope="session")
def nightly_records(tmp_path_factory):
    """Real run records of four nights of seed 001's DFSIO claim on one cluster (the fourth 25% worse)
    and one night on another cluster (tests/nightly_records.py says how they are made)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        import nightly_records as nightly
    finally:
        sys.path.remove(str(Path(__file__).parent))
    root = tmp_path_factory.mktemp("nightly")
    made = nightly.make_nightly_records(root / "made", nightly.NIGHTS + (nightly.WORSE, nightly.ELSEWHERE),
                                        work=root / "work")
    return {"three": made[:3], "worse": made[3], "elsewhere": made[4], "claim": nightly.SEED_CLAIM,
            "cluster": nightly.CLUSTER, "nights": nightly.NIGHTS + (nightly.WORSE,)}
