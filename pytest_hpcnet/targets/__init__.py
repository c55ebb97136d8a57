"""Targets: the stacks under test. Each names its configurations and offers the suites' workloads.

``reference`` is this project's own implementation; external stacks (``hadoop``) register the same way,
a third party's through the entry point group ``pytest_hpcnet.targets`` (see ``hookspec``). A
configuration is a name claims refer to (``transport=shm``) and the settings it stands for.

A target is the seam the conformance suites are written against: ``target.workloads(cluster, launchers,
workdir)`` hands back a ``Workloads`` object whose methods run TeraGen, TeraSort, TeraValidate,
RandomWriter, Sort, SortValidator and TestDFSIO on that stack (and start an RPC echo server or client
where it has one). A workload the stack does not have raises ``WorkloadMissing``; a stack that cannot
run here (no Java, no shared dir) raises ``TargetUnavailable``: under pytest both skip the test with that
line. Nothing here imports pytest.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from ..errors import ConfigError, HpcnetError

# What the suites ask a target for; a Workloads subclass offers some of them (``offers``).
WORKLOADS = ("teragen", "terasort", "teravalidate", "randomwriter", "sort", "sortvalidate", "dfsio",
             "rpc_server", "rpc_client")
ENTRY_POINT_GROUP = "pytest_hpcnet.targets"


class NotOffered(HpcnetError):
    """This target cannot run what was asked here: the test that asked skips with the message."""


class WorkloadMissing(NotOffered):
    def __init__(self, target: str, workload: str, why: str = ""):
        self.target, self.workload = target, workload
        super().__init__(f"target {target!r} offers no {workload!r} workload{f' ({why})' if why else ''}")


class TargetUnavailable(NotOffered):
    def __init__(self, target: str, why: str):
        self.target = target
        super().__init__(f"target {target!r} cannot run here: {why}")


@dataclass
class WorkloadResult:
    """What a workload ran and found, the same shape on every target.

    ``records``: records written (None where the stack does not say); ``details``: the job's figures
    (``checksum`` as lowercase hex, ``lines`` and ``valid`` of a validation, the TestDFSIO block's
    figures); ``raw``: the target's own result object, for target-specific checks."""
    workload: str
    seconds: float
    records: int | None = None
    details: dict = field(default_factory=dict)
    raw: object = None


class Scratch:
    """Where one test's job data goes: ``local(name)`` is a directory on this host (the test may read
    and change its files), ``path(name)`` a place on the stack's own file system (its default FS);
    both are handed to the workloads as they are. ``cleanup()`` removes what was made here."""

    def __init__(self, local_root: Path, remote_root: str | None = None):
        self.local_root = Path(local_root)
        self.remote_root = remote_root

    def local(self, name: str) -> Path:
        return self.local_root / name

    def path(self, name: str):
        return self.local(name) if self.remote_root is None else f"{self.remote_root.rstrip('/')}/{name}"

    def cleanup(self) -> None:
        import shutil
        shutil.rmtree(self.local_root, ignore_errors=True)


class Workloads:
    """The workloads of one target on one cluster, started on first use and stopped by ``close()``.

    Subclasses implement what their stack has and list it in ``offered``; everything else raises
    ``WorkloadMissing`` naming the target and the workload. ``name``, ``configurations()`` and
    ``describe()`` are the target's, so a test sees one object."""

    offered: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, target, cluster, launchers, workdir: Path):
        self.target, self.cluster, self.launchers = target, cluster, launchers
        self.workdir = Path(workdir)

    # -- the target's own face ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.target.name

    def configurations(self) -> dict[str, dict]:
        return self.target.configurations()

    def describe(self) -> dict:
        return self.target.describe()

    def vocabulary(self):
        return vocabulary_of(self.target)

    def sample_configs(self) -> list[str]:
        """The configurations a conformance test runs each job under (each one costs a job)."""
        return list(getattr(self.target, "sample_configs", lambda: [""])())

    def offers(self, workload: str) -> bool:
        return workload in self.offered

    def missing(self, workload: str, why: str = "") -> WorkloadMissing:
        return WorkloadMissing(self.name, workload, why)

    def scratch(self) -> Scratch:
        """A fresh place for one test's job data (local dirs under this target's work dir)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        return Scratch(Path(tempfile.mkdtemp(prefix="job-", dir=self.workdir)))

    def close(self) -> None:
        """Stop whatever the workloads started (engines, services, clusters)."""

    # -- MapReduce -----------------------------------------------------------------------------------
    def teragen(self, rows: int, outdir, *, maps: int = 1, start_row: int = 0) -> WorkloadResult:
        raise self.missing("teragen")

    def terasort(self, indir, outdir, *, reduces: int = 1, config: str = "",
                 maps: int | None = None) -> WorkloadResult:
        raise self.missing("terasort")

    def teravalidate(self, outdir, reportdir) -> WorkloadResult:
        raise self.missing("teravalidate")

    def randomwriter(self, outdir, total_bytes: int, *, maps: int = 1) -> WorkloadResult:
        raise self.missing("randomwriter")

    def sort(self, indir, outdir, *, reduces: int = 1, config: str = "") -> WorkloadResult:
        raise self.missing("sort")

    def sortvalidate(self, indir, outdir) -> WorkloadResult:
        raise self.missing("sortvalidate")

    # -- TestDFSIO -----------------------------------------------------------------------------------
    def dfsio(self, args: list[str], *, res_file: str | os.PathLike) -> WorkloadResult:
        """``TestDFSIO <args> -resFile <res_file>`` on the stack's distributed file system;
        ``details``: the printed block's figures (``DFSIO_FIGURES``)."""
        raise self.missing("dfsio")

    # -- RPC -----------------------------------------------------------------------------------------
    def rpc_server(self, *, threads: int = 4):
        """A context manager: an echo server of the stack's RPC, yielding (host, port)."""
        raise self.missing("rpc_server")

    def rpc_client(self, address, *, clients: int, seconds: int, msg_size: int) -> WorkloadResult:
        """The stack's RPC client echoing ``msg_size`` bytes against ``address``;
        ``details["calls_per_second"]``."""
        raise self.missing("rpc_client")


# The TestDFSIO block's figures, as every target's dfsio result names them in ``details``.
DFSIO_FIGURES = ("nr_files", "total_mb", "throughput", "average_io_rate", "io_rate_std", "exec_sec")


class Target(Protocol):
    name: ClassVar[str]

    def configurations(self) -> dict[str, dict]: ...
    def describe(self) -> dict: ...
    def workloads(self, cluster, launchers, workdir: Path) -> Workloads: ...
    # optional: def vocabulary(self) -> vocabulary.TargetVocabulary -- the keys (values, meaning) and
    # words its configuration names use; without it, what its configurations' names imply


def vocabulary_of(target):
    """A target's declared vocabulary, or the one its configuration names imply."""
    from ..vocabulary import vocabulary_of_configurations
    declared = getattr(target, "vocabulary", None)
    return declared() if callable(declared) else vocabulary_of_configurations(target.name, target.configurations())


TARGETS: dict[str, type] = {}
_entry_points_loaded = False


def _qualname(cls) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


def register(cls, origin: str | None = None):
    """Add a target class under ``cls.name`` (a decorator too). Registering the same class again is a
    no-op; another class under a name already taken is a ``ConfigError`` naming both."""
    name = getattr(cls, "name", None)
    where = origin or _qualname(cls)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a target needs a non-empty string class attribute 'name', "
                          f"{_qualname(cls)} has {name!r}", where)
    missing = [m for m in ("configurations", "describe", "workloads") if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigError(f"target {name!r} ({_qualname(cls)}) lacks {', '.join(f'{m}()' for m in missing)}",
                          where)
    taken = TARGETS.get(name)
    if taken is not None and taken is not cls:
        raise ConfigError(f"target name {name!r} is taken by {_qualname(taken)}; refusing {_qualname(cls)}",
                          where)
    TARGETS[name] = cls
    return cls


def unregister(cls) -> None:
    """Remove ``cls`` if it is the class registered under its name."""
    if TARGETS.get(getattr(cls, "name", None)) is cls:
        del TARGETS[cls.name]


def load_entry_points(entry_points=None) -> list[type]:
    """Register every target the installed distributions name under ``pytest_hpcnet.targets``
    (``name = "module:Class"``; the entry point's name must be the target's ``name``). Returns them."""
    from importlib import metadata
    found = []
    eps = metadata.entry_points(group=ENTRY_POINT_GROUP) if entry_points is None else entry_points
    for ep in eps:
        where = f"entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP})"
        try:
            cls = ep.load()
        except Exception as e:  # a broken third-party package: say which, in one line
            raise ConfigError(f"cannot load: {type(e).__name__}: {e}", where) from None
        if getattr(cls, "name", None) != ep.name:
            raise ConfigError(f"names target {getattr(cls, 'name', None)!r}; the entry point's name must "
                              f"be the target's name", where)
        found.append(register(cls, where))
    return found


def register_from_hook(results, where: str = "pytest_hpcnet_targets hook") -> list[type]:
    """Register what implementations of the ``pytest_hpcnet_targets`` hook returned (one list of
    classes each); returns the classes newly added, for ``unregister`` when the run ends."""
    added = []
    for classes in results:
        for cls in classes or ():
            if TARGETS.get(getattr(cls, "name", None)) is not cls:
                added.append(register(cls, where))
    return added


def known_targets() -> dict[str, type]:
    """Every target: the built-in ones, those registered so far, and (once) the entry points'."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        _entry_points_loaded = True
        load_entry_points()
    return TARGETS


def load_target(name: str, where: str | None = None) -> Target:
    known = known_targets()
    try:
        cls = known[name]
    except KeyError:
        raise ConfigError(f"unknown target {name!r} (known: {', '.join(sorted(known))})", where) from None
    return cls()


from . import reference  # noqa: E402,F401  (registers itself)
from . import hadoop  # noqa: E402,F401  (registers "hadoop")
