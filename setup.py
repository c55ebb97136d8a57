"""Build of the pytest-hpcnet distribution: the Python package, plus the native core (native/: Rust +
PyO3) compiled into the same wheel by setuptools-rust where cargo is.

``HPCNET_NATIVE`` decides (``make setup``'s ``NATIVE=`` sets it):

- ``auto`` (default): build the core where cargo is; where cargo is missing, or the build fails, the
  package is installed without it (``impl=python`` runs; ``pytest_hpcnet.reference.native.WHY_NOT``
  says why) and the build says so;
- ``yes``: the core must build (a missing cargo or a failed build fails the install: for release
  wheels and CI);
- ``no``: the core is not built.

Everything else about the distribution is in pyproject.toml.
"""

import os
import shutil
import sys

from setuptools import setup
from setuptools_rust import Binding, RustExtension

MODE = os.environ.get("HPCNET_NATIVE", "auto")
if MODE not in ("auto", "yes", "no"):
    sys.exit(f"HPCNET_NATIVE={MODE!r}: choose auto, yes or no")

rust_extensions = []
options = {}
if MODE == "no":
    print("pytest-hpcnet: HPCNET_NATIVE=no: the native core is not built; impl=python runs", file=sys.stderr)
elif MODE == "auto" and shutil.which("cargo") is None:
    print("pytest-hpcnet: cargo not found: the native core is not built; impl=python runs "
          "(install Rust with rustup, then reinstall, for impl=native)", file=sys.stderr)
else:
    rust_extensions.append(RustExtension(
        "pytest_hpcnet_native._native", path="native/Cargo.toml", binding=Binding.PyO3,
        features=["pyo3/extension-module"], py_limited_api="auto",
        debug=False,   # setuptools-rust builds in-place (editable) installs in debug mode otherwise
        optional=MODE == "auto"))   # auto: a failed build installs the package without the core
    options["bdist_wheel"] = {"py_limited_api": "cp311"}   # PyO3's abi3-py311: one wheel for CPython >= 3.11

setup(rust_extensions=rust_extensions, options=options)
