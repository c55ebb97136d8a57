"""Run records: every measurement and verdict of one run, with where and how it was measured.

One JSON file per run (``<report dir>/<run id>.json``). The record is plain data so the CLI, asv and the
HTML report can read it without pytest. ``schema`` is bumped whenever a field changes meaning.
"""

from __future__ import annotations

import getpass
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from .errors import ConfigError
from .hostcpu import host_cpu
from .measure import Measurement

SCHEMA = 1
_PACKAGES = ("pytest-hpcnet", "pytest-hpcnet-native", "pytest", "numpy", "scipy", "protobuf", "pytest-xdist",
             "pytest-benchmark")


def git_commit(cwd: Path) -> dict:
    """The checked-out commit of the project under test, and whether the tree had local changes."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _versions() -> dict:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def new_run_id(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{socket.gethostname().split('.')[0]}-{os.getpid()}"


def provenance(*, cluster: dict, target: dict, cwd: Path, args: list[str]) -> dict:
    return {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "user": getpass.getuser(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "host_cpu": host_cpu(),          # local gates' bounds are per CPU (Claim.hosts)
        "packages": _versions(),
        "git": git_commit(cwd),
        "args": args,
        "cluster": cluster,
        "target": target,
    }


@dataclass
class RunRecord:
    run_id: str
    provenance: dict
    measurements: list[Measurement] = field(default_factory=list)
    verdicts: list[dict] = field(default_factory=list)   # Verdict.to_json() dicts

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "run_id": self.run_id, "provenance": self.provenance,
                "measurements": [m.to_json() for m in self.measurements], "verdicts": self.verdicts}

    def write(self, directory: Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.run_id}.json"
        write_atomic(path, json.dumps(self.to_json(), indent=1, sort_keys=True))
        return path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one, never half.

    The text goes to a temporary file of a name no other writer uses (``mkstemp`` in the same
    directory, hidden, not ``*.json``, so a directory listing never picks it up), is flushed to disk,
    and then replaces ``path`` in one ``os.replace`` (atomic within a file system). Two runs writing
    into one directory at once each write their own temporary file.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)   # mkstemp makes 0600; a record is read by others (CI, a web server)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load(path: Path) -> RunRecord:
    """A run record written by ``RunRecord.write``; anything else is a ConfigError naming the file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError("no such run record", str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read a run record: {getattr(e, 'strerror', None) or e}", str(path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"not a run record (not JSON: {e.msg} at line {e.lineno})", str(path)) from None
    if not isinstance(data, dict) or "schema" not in data:
        raise ConfigError("not a run record (JSON without the run record's schema field)", str(path))
    if data.get("schema") != SCHEMA:
        raise ConfigError(f"run record schema {data.get('schema')!r}, this version reads {SCHEMA}", str(path))
    try:
        return RunRecord(run_id=data["run_id"], provenance=data["provenance"],
                         measurements=[Measurement.from_json(m) for m in data["measurements"]],
                         verdicts=data["verdicts"])
    except (KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"a damaged run record ({type(e).__name__}: {e})", str(path)) from None


def check_nodes(directory: Path, expected: int) -> str | None:
    """The newest record under ``directory`` lists ``expected`` nodes with as many different addresses
    (on each network) and names its controller address; None when it does, else what is wrong."""
    records = sorted(Path(directory).glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not records:
        return f"no run record under {directory}"
    cluster = load(records[-1]).provenance.get("cluster", {})
    nodes = cluster.get("nodes", [])
    if len(nodes) != expected:
        return f"{records[-1]}: {len(nodes)} node(s) recorded, expected {expected}"
    for network in sorted({net for n in nodes for net in n.get("addresses", {})}):
        addresses = {n["addresses"].get(network) for n in nodes}
        if len(addresses) != expected:
            return f"{records[-1]}: nodes share addresses on {network}: {sorted(map(str, addresses))}"
    if not cluster.get("controller", {}).get("addresses"):
        return f"{records[-1]}: no controller address recorded"
    return None


def main(argv=None) -> int:
    """``python -m pytest_hpcnet.results check-nodes DIR N`` (the Makefile's netns-suites check)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "check-nodes" or not args[2].isdigit():
        print("usage: python -m pytest_hpcnet.results check-nodes DIR N", file=sys.stderr)
        return 2
    problem = check_nodes(Path(args[1]), int(args[2]))
    if problem:
        print(f"run record check: {problem}", file=sys.stderr)
        return 1
    print(f"run record check: {args[2]} nodes with {args[2]} different addresses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
