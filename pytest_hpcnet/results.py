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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from .errors import ConfigError
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
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))
        tmp.replace(path)  # a reader never sees half a record
        return path


def load(path: Path) -> RunRecord:
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ConfigError(f"run record schema {data.get('schema')!r}, this version reads {SCHEMA}", str(path))
    return RunRecord(run_id=data["run_id"], provenance=data["provenance"],
                     measurements=[Measurement.from_json(m) for m in data["measurements"]],
                     verdicts=data["verdicts"])
