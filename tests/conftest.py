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
