"""Build the Soft-RoCE guest into a cache directory, and the small per-run overlay with this project.

Cached pieces (``cache_dir()``, default ``~/.cache/hpcnet-vm``, or ``$HPCNET_VM_CACHE``), each rebuilt
only when what it is made from changes (a stamp file records that):

- ``rootfs/``: Debian bookworm by ``debootstrap --variant=minbase`` with ``guest.PACKAGES`` (the slow
  step, ~1.5 min), the kernel modules Soft-RoCE needs, and the project's Python dependencies;
- ``kernel/``: Debian's ``linux-image-<abi>-amd64`` unpacked with ``dpkg-deb -x`` (the host's /boot
  and package database are not touched);
- ``pydeps/``: cp311 wheels of ``guest.PYTHON_REQUIREMENTS`` installed with ``pip --target``;
- ``base.cpio.zst``: the root filesystem as a zstd-compressed initramfs.

The overlay (``/init`` and the project source with an import path and entry point for the pytest
plugin) is a plain cpio made for every run, so changing the code never rebuilds the base. The kernel
unpacks the overlay first and the base after it; they hold different files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import guest
from .guest import VmError

MIRROR = "http://deb.debian.org/debian"
PY_SITE = "usr/local/lib/python3.11/dist-packages"
# fixtures: golden digests, cluster inventories; benchmarks: the verbs figures are measured in the guest
PROJECT_DIRS = ("pytest_hpcnet", "suites", "fixtures", "benchmarks")
PROJECT_FILES = ("pyproject.toml",)
TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt",
        "var/lib/apt/lists", "usr/share/lintian", "usr/share/zoneinfo")
PRUNE = ("bin", "scipy/**/tests")   # numpy's are not prunable: numpy.testing imports from them
REQUIRED_TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "debootstrap": "debootstrap", "cpio": "cpio",
                  "zstd": "zstd", "dpkg-deb": "dpkg", "apt-get": "apt", "depmod": "kmod"}


@dataclass(frozen=True)
class Guest:
    """A built guest: boot it with ``kernel`` and ``base`` (plus an overlay)."""

    kernel: Path
    base: Path
    kernel_version: str


def cache_dir() -> Path:
    env = os.environ.get("HPCNET_VM_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcnet-vm"


def missing_tools() -> dict[str, str]:
    """Tools the harness needs that are not on PATH -> the Debian package that provides each."""
    extra = ["/usr/sbin", "/sbin"]
    path = os.pathsep.join([os.environ.get("PATH", ""), *extra])
    return {tool: pkg for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool, path=path) is None}


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, **kw)
    except FileNotFoundError:
        raise VmError(f"{what}: {cmd[0]} is not installed") from None
    except subprocess.CalledProcessError as e:
        tail = "\n".join((e.stdout + e.stderr).splitlines()[-15:])
        raise VmError(f"{what} failed (exit {e.returncode}): {' '.join(cmd)}\n{tail}") from None


def _stamp_ok(stamp: Path, key: str) -> bool:
    return stamp.exists() and stamp.read_text() == key


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def build_rootfs(cache: Path, mirror: str, log) -> Path:
    root, stamp = cache / "rootfs", cache / "rootfs.stamp"
    key = _key(guest.SUITE, guest.PACKAGES, mirror)
    if _stamp_ok(stamp, key):
        return root
    if os.geteuid() != 0:
        raise VmError("debootstrap needs root (it creates device nodes and chroots); run `hpcnet vm build` as root")
    shutil.rmtree(root, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    log(f"debootstrap {guest.SUITE} (minbase + {', '.join(guest.PACKAGES)}) ...")
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(guest.PACKAGES)}", guest.SUITE,
          str(root), mirror], "debootstrap")
    for rel in TRIM:
        shutil.rmtree(root / rel, ignore_errors=True)
    stamp.write_text(key)
    return root


def kernel_package() -> str:
    """The versioned linux-image package the ``linux-image-amd64`` metapackage points at."""
    out = _run(["apt-cache", "depends", "linux-image-amd64"], "apt-cache depends").stdout
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Depends: linux-image-"):
            return line.split()[1]
    raise VmError("apt-cache does not know linux-image-amd64 (run apt-get update with Debian bookworm sources)")


def build_kernel(cache: Path, log) -> tuple[Path, str]:
    kdir, stamp = cache / "kernel", cache / "kernel.stamp"
    if not stamp.exists():
        package = kernel_package()
        log(f"downloading {package} ...")
        debs = cache / "debs"
        shutil.rmtree(debs, ignore_errors=True)
        debs.mkdir(parents=True)
        _run(["apt-get", "download", package], "apt-get download", cwd=debs)
        shutil.rmtree(kdir, ignore_errors=True)
        for deb in debs.glob("*.deb"):
            _run(["dpkg-deb", "-x", str(deb), str(kdir)], "dpkg-deb -x")
        shutil.rmtree(debs)
        stamp.write_text(package)
    versions = sorted(p.name for p in (kdir / "lib/modules").iterdir())
    if not versions:
        raise VmError(f"no kernel modules under {kdir}/lib/modules")
    version = versions[-1]
    return kdir / "boot" / f"vmlinuz-{version}", version


def install_modules(kdir: Path, version: str, root: Path) -> None:
    src, dst = kdir / "lib/modules" / version, root / "lib/modules" / version
    shutil.rmtree(dst, ignore_errors=True)
    for rel in guest.MODULE_PATHS:
        path = src / "kernel" / rel
        if path.is_dir():
            shutil.copytree(path, dst / "kernel" / rel)
        elif path.exists():
            (dst / "kernel" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / "kernel" / rel)
    for name in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    _run(["depmod", "-b", str(root), version], "depmod")


def build_pydeps(cache: Path, log) -> Path:
    target, stamp = cache / "pydeps", cache / "pydeps.stamp"
    key = _key(guest.PYTHON_REQUIREMENTS, PRUNE)
    if _stamp_ok(stamp, key):
        return target
    shutil.rmtree(target, ignore_errors=True)
    log("pip install (cp311 wheels) " + " ".join(guest.PYTHON_REQUIREMENTS) + " ...")
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--only-binary=:all:",
          "--python-version", "3.11", "--platform", "manylinux2014_x86_64", "--target", str(target),
          *guest.PYTHON_REQUIREMENTS], "pip install of the guest's Python packages")
    for pattern in PRUNE:   # scipy's own test suites: a fifth of its size, never imported
        for junk in target.glob(pattern):
            shutil.rmtree(junk, ignore_errors=True)
    stamp.write_text(key)
    return target


def _cpio(directory: Path, out, what: str) -> None:
    names = subprocess.run(["find", ".", "-print0"], cwd=directory, check=True, capture_output=True).stdout
    proc = subprocess.run(["cpio", "--null", "-o", "-H", "newc", "--quiet"], cwd=directory, input=names,
                          stdout=out, stderr=subprocess.PIPE)
    if proc.returncode:
        raise VmError(f"cpio of {what} failed: {proc.stderr.decode(errors='replace')[-500:]}")


BUILD_STEPS = ("root filesystem", "kernel", "Python packages", "initramfs")


def build(cache: Path | None = None, mirror: str = MIRROR, log=print, progress=None) -> Guest:
    """Build (or reuse) the cached guest; returns where its kernel and base initramfs are.
    ``progress(1)`` hears of each of the ``BUILD_STEPS`` done (cached ones included)."""
    advance = progress or (lambda n: None)
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    missing = missing_tools()
    if missing:
        raise VmError("missing tools: " + ", ".join(f"{t} (Debian package {p})" for t, p in missing.items()))
    root = build_rootfs(cache, mirror, log)
    advance(1)
    vmlinuz, version = build_kernel(cache, log)
    advance(1)
    pydeps = build_pydeps(cache, log)
    advance(1)
    base, stamp = cache / "base.cpio.zst", cache / "base.stamp"
    key = _key((cache / "rootfs.stamp").read_text(), version, guest.MODULE_PATHS,
               (cache / "pydeps.stamp").read_text())
    if not (_stamp_ok(stamp, key) and base.exists()):
        log("assembling the base initramfs ...")
        install_modules(cache / "kernel", version, root)
        site = root / PY_SITE
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(pydeps, site, symlinks=True)
        tmp = base.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            cpio = subprocess.Popen(["zstd", "-T1", "-q", "-c"], stdin=subprocess.PIPE, stdout=out)
            _cpio(root, cpio.stdin, "the root filesystem")
            cpio.stdin.close()
            if cpio.wait():
                raise VmError("zstd failed compressing the root filesystem")
        tmp.replace(base)
        stamp.write_text(key)
    advance(1)
    return Guest(kernel=vmlinuz, base=base, kernel_version=version)


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


NATIVE_DEST = "opt/hpcnet-native"   # the built native core (pytest_hpcnet_native), when the host has one


def native_package() -> Path | None:
    """The directory of the native core this host imports (abi3, built for the same Debian and CPython
    as the guest's), or None where it is not built."""
    import importlib.util
    spec = importlib.util.find_spec("pytest_hpcnet_native")
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(list(spec.submodule_search_locations)[0])
    return pkg if any(pkg.glob("_native*.so")) else None


def make_overlay(workdir: Path, init_text: str, source: Path | None = None,
                 native: Path | None | bool = True) -> Path:
    """A plain cpio with ``/init``, the project at /opt/hpcnet, the native core at /opt/hpcnet-native
    when the host has one built (``native``: True finds it, a path names it, None/False leaves it out;
    without it the guest's native tests skip saying so), and what makes them importable: a .pth file
    and a dist-info whose entry point registers the pytest plugin, as an install would."""
    source = source or project_root()
    tree = workdir / "overlay"
    shutil.rmtree(tree, ignore_errors=True)
    (tree / "init").parent.mkdir(parents=True)
    (tree / "init").write_text(init_text)
    (tree / "init").chmod(0o755)
    dest = tree / "opt/hpcnet"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hpcnet", "local-work", "softroce-work")
    for name in PROJECT_DIRS:
        shutil.copytree(source / name, dest / name, ignore=ignore)
    for name in PROJECT_FILES:
        shutil.copy2(source / name, dest / name)
    if native is True:
        native = native_package()
    paths = ["/opt/hpcnet"]
    if native:
        shutil.copytree(native, tree / NATIVE_DEST / "pytest_hpcnet_native", ignore=ignore)
        paths.append("/" + NATIVE_DEST)
    site = tree / PY_SITE
    info = site / "pytest_hpcnet-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pytest-hpcnet\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nhpcnet = pytest_hpcnet.plugin\n")
    (site / "hpcnet.pth").write_text("".join(p + "\n" for p in paths))
    out = workdir / "overlay.cpio"
    with open(out, "wb") as f:
        _cpio(tree, f, "the overlay")
    return out


def timed(fn, *args, **kw):
    start = time.monotonic()
    return fn(*args, **kw), time.monotonic() - start
