"""Targets: the stacks under test. Each names its configurations and offers the suites' workloads.

``reference`` is this project's own implementation; external stacks (``hadoop``) register the same way,
a third party's through the entry point group ``pytest_hpcnet.targets`` (see ``hookspec``). A
configuration is a name claims refer to (``transport=shm``) and the settings it stands for.

A target is the seam the conformance suites are written against: ``target.workloads(cluster, launchers,
workdir)`` hands back a ``Workloads`` object whose methods run TeraGen, TeraSort, TeraValidate,
RandomWriter, Sort, SortValidator and TestDFSIO on that stack (and start an RPC echo server or client
where it has one); a target that also keeps a per-job record (``job_record``, YARN's application shape)
offers ``crosscheck``: the same job under several configurations, interleaved and repeated. A workload
the stack does not have raises ``WorkloadMissing``; a stack that cannot run here (no Java, no shared
dir) raises ``TargetUnavailable``: under pytest both skip the test with that line. Nothing here imports
pytest.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from ..errors import ConfigError, HpcnetError
from ..registry import Registry

# What the suites ask a target for; a Workloads subclass offers some of them (``offers``).
WORKLOADS = ("teragen", "terasort", "teravalidate", "randomwriter", "sort", "sortvalidate", "dfsio",
             "rpc_server", "rpc_client", "crosscheck")
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


@dataclass(frozen=True)
class JobRecord:
    """One job as YARN's application record has it, the fields ``hpcnet crosscheck`` judges: the job's
    id, ``state`` and ``finalStatus`` (FINISHED and SUCCEEDED for a job that ran to the end),
    ``elapsedTime`` (ms) and ``vcoreSeconds``; ``memorySeconds`` (MB-seconds) where the stack counts it,
    else None. A target says in its ``job_record`` where its figures come from."""
    id: str
    state: str
    finalStatus: str
    elapsedTime: int
    vcoreSeconds: float
    memorySeconds: int | None


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

    def check_config(self, config: str, where: str = "--config") -> None:
        """Refuse, in one line naming the known values, a configuration name this target does not know
        (before any job runs)."""
        from ..vocabulary import Vocabulary
        Vocabulary(targets=[self.vocabulary()]).check_config(config, where)

    def discard(self, path) -> None:
        """Remove a job's output (a place ``scratch()`` handed out) that nobody will read."""
        import shutil
        shutil.rmtree(path, ignore_errors=True)

    # -- MapReduce -----------------------------------------------------------------------------------
    def teragen(self, rows: int, outdir, *, maps: int = 1, start_row: int = 0,
                config: str = "") -> WorkloadResult:
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

    def job_record(self, result: WorkloadResult) -> JobRecord:
        """The per-job record of a job run here (``teragen``, ``terasort``): what ``crosscheck`` judges."""
        raise self.missing("crosscheck", "it keeps no per-job record")

    def crosscheck(self, configs: list[str], repeat: int, job: tuple[str, int], *, maps: int = 2,
                   reduces: int = 2, keep_output: bool = False, progress=None) -> list:
        """``job`` (``("teragen" | "terasort", rows)``) under each configuration, ``repeat`` rounds
        interleaved; one ``workloads.crosscheck.Run`` (config, round, JobRecord, wall seconds) per job.
        ``report.crosscheck`` judges them."""
        if not self.offers("crosscheck"):
            raise self.missing("crosscheck", "it keeps no per-job record")
        from ..workloads.crosscheck import run_crosscheck
        return run_crosscheck(self, configs, repeat, job, maps=maps, reduces=reduces, keep_output=keep_output,
                              progress=progress)

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


# The targets whose configuration names the shipped suites' claims use: the reference's, and Ozone's
# storage set-ups in seed 002's crosscheck claims.
SHIPPED_CLAIM_TARGETS = ("reference", "ozone")


def shipped_vocabularies() -> list:
    """The vocabularies of ``SHIPPED_CLAIM_TARGETS``: what every run's claims may name."""
    return [vocabulary_of(load_target(name)) for name in SHIPPED_CLAIM_TARGETS]


_REGISTRY = Registry("target", ENTRY_POINT_GROUP, ("configurations", "describe", "workloads"),
                     "pytest_hpcnet_targets hook")
TARGETS = _REGISTRY.classes
register, unregister = _REGISTRY.register, _REGISTRY.unregister
load_entry_points, register_from_hook = _REGISTRY.load_entry_points, _REGISTRY.register_from_hook
known_targets = _REGISTRY.known


def load_target(name: str, where: str | None = None) -> Target:
    known = known_targets()
    try:
        cls = known[name]
    except KeyError:
        raise ConfigError(f"unknown target {name!r} (known: {', '.join(sorted(known))})", where) from None
    return cls()


from . import reference  # noqa: E402,F401  (registers itself)
from . import hadoop  # noqa: E402,F401  (registers "hadoop")
from . import ozone  # noqa: E402,F401  (registers "ozone")
