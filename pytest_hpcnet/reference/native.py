"""The native core (issue 16): the compiled data path, and the one place that imports it.

``native/`` is a Rust crate (PyO3) that the package's build (setup.py, setuptools-rust) compiles into
the ``pytest_hpcnet_native`` package where cargo is (``make setup``, ``pip install .``). It holds the Hadoop IPC v9 client and server
over tcp (``rpc/native.py`` wraps them in the Python classes' interfaces) and the timing drivers that
return per-call samples, so no interpreter sits inside a timed call.

The Python implementation stays the readable reference and the fallback: where the package is
absent, ``AVAILABLE`` is False, ``WHY_NOT`` says why, ``default_impl()`` is ``"python"``, and asking
for ``impl=native`` raises ``ConfigError`` with that reason. Tests skip with it.
"""

from __future__ import annotations

from ..errors import ConfigError

IMPLS = ("native", "python")

try:
    from pytest_hpcnet_native import _native as core
except ImportError as e:   # not built here: no Rust toolchain, or NATIVE=no
    core = None
    AVAILABLE = False
    WHY_NOT = (f"the native core (pytest_hpcnet_native) is not installed: {e}. Build it with `make setup` "
               "or `pip install .` with cargo on the PATH (install Rust with rustup); impl=python runs instead")
    VERSION = None
else:
    AVAILABLE = True
    WHY_NOT = ""
    VERSION = core.__version__


def default_impl() -> str:
    """``native`` where the core is installed, else ``python``."""
    return "native" if AVAILABLE else "python"


def require(where: str = "impl") -> None:
    if not AVAILABLE:
        raise ConfigError(WHY_NOT, where=where)


def resolve_impl(impl: str | None, where: str = "impl") -> str:
    """``None``/``"auto"`` -> the default; ``"native"`` only where the core is installed."""
    if impl in (None, "", "auto"):
        return default_impl()
    if impl not in IMPLS:
        raise ConfigError(f"unknown implementation {impl!r}; choose one of {list(IMPLS)}", where=where)
    if impl == "native":
        require(where)
    return impl
