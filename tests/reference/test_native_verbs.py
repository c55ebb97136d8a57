"""Native verbs on a host without RDMA: the module loads libibverbs/librdmacm only at run time (no
undefined ``ibv_``/``rdma_`` symbols), says in one line why it cannot run (libraries missing, or built
without rdma-core's headers), and ``impl=native`` with ``transport=verbs`` refuses with that reason.
Real verbs traffic is tested in the Soft-RoCE guest (suites/rpc/test_verbs_rpc.py, test_conformance.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.rpc import make_client, make_server

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason=native.WHY_NOT or "native core absent")
CRATE = Path(__file__).resolve().parents[2] / "native"
NO_HEADERS = "built without rdma-core headers: install libibverbs-dev and librdmacm-dev"


def _module() -> Path:
    return Path(native.core.__file__)


def test_the_module_has_no_link_time_dependency_on_rdma_core():
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run(["nm", "-D", "--undefined-only", str(_module())], capture_output=True, text=True,
                         check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert not [n for n in names if n.startswith(("ibv_", "rdma_"))], names
    needed = subprocess.run(["readelf", "-d", str(_module())], capture_output=True, text=True).stdout
    assert "libibverbs" not in needed and "librdmacm" not in needed


def _reason_in_a_fresh_process(env: dict) -> str:
    code = "from pytest_hpcnet_native import _native as n; print(n.verbs_unavailable())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_host_where_libibverbs_does_not_load_says_so_in_one_line():
    if not native.core.VERBS_BUILT:
        pytest.skip(NO_HEADERS)
    why = _reason_in_a_fresh_process({"HPCNET_LIBIBVERBS": "libibverbs-absent.so.1"})
    assert why.startswith("cannot load libibverbs-absent.so.1 (install rdma-core's libibverbs1)"), why
    assert "\n" not in why
    why = _reason_in_a_fresh_process({"HPCNET_LIBRDMACM": "librdmacm-absent.so.1"})
    assert why.startswith("cannot load librdmacm-absent.so.1"), why


def test_tcp_still_runs_where_libibverbs_does_not_load():
    code = ("import os; from pytest_hpcnet.reference.rpc import make_client, make_server\n"
            "with make_server('native') as s:\n"
            "    with make_client(s.address, impl='native') as c: print(c.echo(b'tcp'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HPCNET_LIBIBVERBS": "libibverbs-absent.so.1"})
    assert out.returncode == 0 and "b'tcp'" in out.stdout, out.stderr


def test_impl_native_over_verbs_refuses_with_the_reason(monkeypatch):
    monkeypatch.setattr(native.core, "verbs_unavailable", lambda: NO_HEADERS)
    with pytest.raises(ConfigError, match="cannot speak verbs here: built without rdma-core headers"):
        make_server("native", transport="verbs")
    with pytest.raises(ConfigError, match="install libibverbs-dev and librdmacm-dev"):
        make_client(("10.0.0.1", 1), impl="native", transport="verbs")


def test_without_an_rdma_device_the_error_names_it():
    from pytest_hpcnet.reference.transport import TransportError
    if native.core.verbs_unavailable():
        pytest.skip(native.core.verbs_unavailable())
    if Path("/sys/class/infiniband").is_dir() and any(Path("/sys/class/infiniband").iterdir()):
        pytest.skip("this host has an RDMA device")
    with pytest.raises(TransportError, match="RDMA|rdma"):
        make_server("native", transport="verbs", host="127.0.0.1")


@pytest.mark.skipif(shutil.which("cargo") is None, reason="cargo is not installed")
def test_the_crate_builds_without_rdma_core_headers(tmp_path):
    """HPCNET_NATIVE_VERBS=no is the build.rs path a host without the headers takes: the crate must
    still compile (the shim's functions become stubs behind the error above)."""
    env = {**os.environ, "HPCNET_NATIVE_VERBS": "no", "CARGO_BUILD_JOBS": "2",
           "CARGO_TARGET_DIR": str(CRATE / "target")}
    out = subprocess.run(["cargo", "check", "--offline", "--release", "--features", "pyo3/extension-module"],
                         cwd=CRATE, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no native verbs" not in out.stderr   # the switch, not a missing header, turned it off
