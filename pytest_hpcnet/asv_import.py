"""Run records into asv: claims measured by pytest on a cluster, night after night, on asv's web report.

``hpcnet asv-import RUN.json... --into DIR`` (and ``--hpcnet-asv=DIR`` at the end of a run) keeps an asv
project in DIR that ``asv publish`` and ``asv preview`` read unchanged, regressions page included:

    DIR/asv.conf.json           written here: repo = "repo", branch "main", results and html below DIR
    DIR/records/<run id>.json   every imported run record: the history's source of truth
    DIR/repo/                   a bare git repository with one commit per run ("run repository")
    DIR/results/                asv results: benchmarks.json, <machine>/machine.json, one file per run

Why a repository of its own: asv puts results on its time axis by commit. It orders commits by
``git rev-list --all --date-order --reverse`` and keeps one result file per (machine, commit,
environment), so the project's own commit cannot be the axis when many nightly runs test one project
commit against a changing stack (they would overwrite each other). Every import therefore rebuilds a
repository holding one empty commit per run, in run-time order, authored and committed at the run's
time (so hashes are the same whenever the same records are imported, in any order). The commit's
message and its ``run.json`` name the run, cluster, stack version and project commit; a lightweight tag
``<target>-<version>@<project commit>`` marks each run where that pair first appears, and asv draws tags
as labelled lines on every graph. Import order does not matter: an older record imported late lands at
its place in time.

What becomes a benchmark (asv ``track`` type, one value per run):
  - ``claims.<claim id>``: each judged claim's quantity, oriented by ``tracking`` so that lower is
    better, so asv's regression (an upward step) means the claim got worse. The description (asv's
    ``code``, shown on hover and in the grid) states the claim and its bound; the unit shows the bound
    in the tracked orientation. Canary verdicts (an injected regression) are left out.
  - ``measured.<metric>.<config>[.<params>]``: each measurement's headline figure (its ``value``, the
    median) as measured, in its unit. asv only knows "lower is better", so regression detection is
    turned off (``regressions_first_commits``) for figures where higher is better; their claims carry
    the judgement.
Machine: the cluster (inventory name; a ``local:N``/``netns:N`` cluster is named after its host too),
described from the record's provenance: node count and names, probed features, CPU, memory, target.
The stack under test is the result parameter ``target``, so two stacks on one cluster are two lines.
"""

from __future__ import annotations

import fcntl
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from . import tracking
from .errors import ConfigError
from .results import RunRecord, load, write_atomic

BRANCH = "main"
RESULT_COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
                  "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
AUTHOR = "hpcnet asv-import <hpcnet@localhost>"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slug(text: str) -> str:
    """A name part asv can use in file names and URLs (letters, digits, . _ -)."""
    return _UNSAFE.sub("_", str(text)).strip("_") or "_"


def run_time(record: RunRecord, where: str) -> datetime:
    text = record.provenance.get("time")
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ConfigError(f"the record has no run time (provenance.time {text!r})", where) from None
    if when.tzinfo is None:
        raise ConfigError(f"the run time {text!r} has no time zone", where)
    return when


# --- machine -------------------------------------------------------------------------------------

def machine_name(prov: dict) -> str:
    """The cluster a run was on: the inventory's name; ``local:N``/``netns:N`` with the host's name (the
    cluster is that host); a Slurm allocation by the Slurm cluster's name, not the job's."""
    cluster = prov.get("cluster") or {}
    name = str(cluster.get("name") or cluster.get("source") or "cluster")
    source = str(cluster.get("source") or name)
    if source.startswith(("local:", "netns:")):
        name = f"{str(prov.get('host') or 'host').split('.')[0]}-{name}"
    elif source == "slurm":
        parts = name.split(":")          # slurm:<cluster>:<job>
        name = f"slurm-{parts[1]}" if len(parts) == 3 else "slurm"
    return slug(name)


def machine_info(prov: dict) -> dict:
    """asv's machine.json for the record's cluster; every key shows in the site's machine tooltip."""
    cluster = prov.get("cluster") or {}
    nodes = cluster.get("nodes") or []
    facts = [n.get("facts") or {} for n in nodes]
    cpus = Counter(f"{(f.get('cpu') or {}).get('model') or '?'}" for f in facts)
    arches = Counter((f.get("cpu") or {}).get("arch") or "?" for f in facts)
    logical = sum(int((f.get("cpu") or {}).get("logical_cpus") or 0) for f in facts)
    memory = sum(int(f.get("memory_bytes") or 0) for f in facts)
    features = [frozenset(n.get("features") or ()) for n in nodes]
    common = frozenset.intersection(*features) if features else frozenset()
    extra = {n.get("name"): sorted(set(n.get("features") or ()) - common) for n in nodes}
    feature_text = " ".join(sorted(common)) or "-"
    if any(extra.values()):
        feature_text += "; also " + "; ".join(f"{k}: {' '.join(v)}" for k, v in extra.items() if v)
    names = [str(n.get("name")) for n in nodes]
    target = prov.get("target") or {}
    return {
        "machine": machine_name(prov),
        "cluster": str(cluster.get("source") or cluster.get("name") or "-"),
        "nodes": f"{len(nodes)}: " + (", ".join(names) if len(names) <= 6 else f"{names[0]} .. {names[-1]}"),
        "features": feature_text,
        "cpu": ", ".join(f"{k} x{v}" if v > 1 else k for k, v in cpus.items()) or "-",
        "arch": ", ".join(arches) or "-",
        "num_cpu": str(logical or "-"),
        "ram": str(memory or "-"),
        "os": str(prov.get("platform") or "-"),
        "target": f"{target.get('name', '-')} {target.get('version', '')}".strip(),
        "version": 1,
    }


# --- benchmarks ----------------------------------------------------------------------------------

@dataclass
class Tracked:
    """One benchmark's definition and this run's value of it."""

    name: str
    value: float
    unit: str
    pretty_name: str
    code: str
    form: str                 # what the version hashes: results of another form are not comparable
    higher_is_better: bool = False   # a measured figure asv must not call a regression when it drops

    def benchmark(self) -> dict:
        version = hashlib.sha256(f"{self.form}\n{self.unit.split(';')[0]}".encode()).hexdigest()
        return {"name": self.name, "pretty_name": self.pretty_name, "code": html.escape(self.code),
                "type": "track", "unit": self.unit, "param_names": [], "params": [], "timeout": 60,
                "version": version}


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def claim_tracked(verdict: dict) -> Tracked | str | None:
    """The claim's quantity as a lower-is-better benchmark; None when the run did not measure it (n/a,
    not evaluated) or injected a regression (canary); else why it cannot be tracked."""
    cid, q = verdict.get("claim_id"), verdict.get("quantity")
    if verdict.get("injected") or not isinstance(q, (int, float)) or isinstance(q, bool):
        return None
    kind, direction = verdict.get("kind") or "ratio", tracking.verdict_direction(verdict)
    if direction is None:
        return f"{cid}: cannot tell which way is better from its bound {verdict.get('bound')!r}"
    metric = verdict.get("metric") or "value"
    baseline, candidate = verdict.get("baseline") or "baseline", verdict.get("candidate") or "candidate"
    form, unit = tracking.form_and_unit(kind, direction, metric, baseline, candidate)
    value = tracking.oriented(form, kind, float(q))
    lo, hi = tracking.verdict_bounds(verdict)
    limit = tracking.oriented_bound(form, kind, direction, lo, hi)
    unit_with_bound = unit[:-1] + (f"; claim: at most {_fmt(limit)})" if limit is not None else ")")
    code = "\n".join([
        f"claim {cid}: {verdict.get('statement') or '(statement not recorded)'}",
        f"bound as claimed: {verdict.get('bound')} on the {kind} ({direction} is better)",
        f"tracked here as {unit}" + (f": above {_fmt(limit)} breaks the claim" if limit is not None else ""),
        f"source: {verdict.get('source')}",
    ])
    return Tracked(name=f"claims.{cid}", value=value, unit=unit_with_bound,
                   pretty_name=f"{cid} (bound {verdict.get('bound')})", code=code, form=form)


def measurement_tracked(m) -> Tracked:
    params = "".join(f".{slug(k)}_{slug(v)}" for k, v in sorted(m.params.items()))
    name = f"measured.{m.metric}.{slug(m.config or 'default')}{params}"
    better = f"{m.direction} is better"
    shown = " ".join(f"{k}={v}" for k, v in sorted(m.params.items()))
    code = f"{m.metric} under {m.config or '(no configuration)'}{' ' + shown if shown else ''}: the median of " \
           f"each run's samples, in {m.unit} ({better})"
    return Tracked(name=name, value=float(m.value), unit=f"{m.unit} ({better})",
                   pretty_name=f"{m.metric} [{m.config}]{' ' + shown if shown else ''}", code=code,
                   form=f"measured {m.unit}", higher_is_better=m.direction == "higher")


def tracked_of(record: RunRecord) -> tuple[list[Tracked], list[str]]:
    """Every benchmark value of one run, and why some claims give none."""
    out: dict[str, Tracked] = {}
    skipped = []
    for v in record.verdicts:
        t = claim_tracked(v)
        if t is None:
            continue
        if isinstance(t, str):
            skipped.append(t)
        elif t.name not in out:        # a claim judged twice keeps its first (non-canary) verdict
            out[t.name] = t
    for m in record.measurements:
        t = measurement_tracked(m)
        out.setdefault(t.name, t)
    return list(out.values()), skipped


# --- the store -----------------------------------------------------------------------------------

@dataclass
class Run:
    path: Path
    record: RunRecord
    when: datetime
    machine: str
    target: str
    version: str
    commit: str
    dirty: bool
    tracked: list[Tracked] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.target}-{self.version}@{self.commit[:7] if self.commit else 'unknown'}"

    def message(self) -> str:
        return (f"{self.when.isoformat()} {self.machine}: {self.target} {self.version}, project "
                f"{(self.commit or 'unknown')[:12]}{' (dirty)' if self.dirty else ''}\n\n"
                f"run {self.record.run_id}\nrecord records/{self.path.name}\n")

    def summary(self) -> dict:
        return {"run_id": self.record.run_id, "time": self.when.isoformat(), "machine": self.machine,
                "target": self.target, "version": self.version, "project_commit": self.commit,
                "dirty": self.dirty}


def _run(path: Path) -> Run:
    record = load(path)
    prov = record.provenance
    target = prov.get("target") or {}
    git = prov.get("git") or {}
    run = Run(path=path, record=record, when=run_time(record, str(path)), machine=machine_name(prov),
              target=slug(target.get("name") or "target"), version=str(target.get("version") or "unknown"),
              commit=git.get("commit") or "", dirty=bool(git.get("dirty")))
    run.tracked, _ = tracked_of(record)
    return run


@contextmanager
def _locked(store: Path):
    """One import at a time per store (two runs finishing together both import, one after the other)."""
    store.mkdir(parents=True, exist_ok=True)
    with open(store / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _git(*args, cwd: Path, stdin: bytes | None = None) -> str:
    git = shutil.which("git")
    if git is None:
        raise ConfigError("git not found; asv-import keeps its run repository with git (apt-get install git)",
                          "asv-import")
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    done = subprocess.run([git, *args], cwd=cwd, input=stdin, capture_output=True, env=env, timeout=300)
    if done.returncode != 0:
        raise ConfigError(f"git {args[0]} failed: {done.stderr.decode(errors='replace').strip()[-300:]}",
                          str(cwd))
    return done.stdout.decode()


def _fast_import_stream(runs: list[Run]) -> bytes:
    """One commit per run on ``main`` (the first without a parent), and the tags; dates = run times."""
    out = []
    seen_labels = set()
    for i, run in enumerate(runs, start=1):
        stamp = f"{int(run.when.timestamp())} +0000"
        message = run.message().encode()
        content = (json.dumps(run.summary(), indent=1, sort_keys=True) + "\n").encode()
        out.append(f"commit refs/heads/{BRANCH}\nmark :{i}\nauthor {AUTHOR} {stamp}\n"
                   f"committer {AUTHOR} {stamp}\ndata {len(message)}\n".encode() + message + b"\n")
        out.append(f"M 644 inline run.json\ndata {len(content)}\n".encode() + content + b"\n")
        label = _tag_name(run.label)
        if label not in seen_labels:
            seen_labels.add(label)
            out.append(f"reset refs/tags/{label}\nfrom :{i}\n\n".encode())
    out.append(b"done\n")
    return b"".join(out)


def _tag_name(label: str) -> str:
    """A valid git ref name from a label (no spaces, '..', '~^:?*[\\', '@{', leading '-' or '.')."""
    name = re.sub(r"[^A-Za-z0-9._@+-]+", "_", label).replace("..", "_").replace("@{", "_")
    return name.lstrip("-.") .rstrip(".") or "run"


def _build_repo(runs: list[Run], dest: Path) -> list[str]:
    """The run repository at ``dest``; the commit hash of each run, in order."""
    _git("init", "--quiet", "--bare", f"--initial-branch={BRANCH}", str(dest), cwd=dest.parent)
    if runs:
        _git("fast-import", "--quiet", "--done", cwd=dest, stdin=_fast_import_stream(runs))
        hashes = _git("rev-list", "--reverse", BRANCH, cwd=dest).split()
    else:
        hashes = []
    if len(hashes) != len(runs):
        raise ConfigError(f"the run repository has {len(hashes)} commits for {len(runs)} runs", str(dest))
    return hashes


def _build_results(runs: list[Run], hashes: list[str], dest: Path) -> dict[str, Tracked]:
    dest.mkdir(parents=True)
    definitions: dict[str, Tracked] = {}
    for run, commit in zip(runs, hashes):
        for t in run.tracked:
            definitions[t.name] = t           # the newest run describes a benchmark (e.g. a new bound)
    versions = {name: t.benchmark()["version"] for name, t in definitions.items()}
    machines = {}
    for run, commit in zip(runs, hashes):
        machines[run.machine] = machine_info(run.record.provenance)
        started = int(run.when.timestamp() * 1000)
        results = {}
        for t in run.tracked:
            if t.value != t.value or t.value in (float("inf"), float("-inf")):
                continue   # asv stores a failed benchmark as null; a run's non-finite figure says nothing
            if t.benchmark()["version"] != versions[t.name]:
                continue   # measured under another form than the benchmark now tracks
            results[t.name] = [[t.value], [], versions[t.name], started]
        data = {"commit_hash": commit, "env_name": run.target, "date": started,
                "params": {"machine": run.machine, "target": run.target}, "python": "",
                "requirements": {}, "env_vars": {}, "result_columns": RESULT_COLUMNS, "results": results,
                "durations": {}, "version": 2}
        folder = dest / run.machine
        folder.mkdir(exist_ok=True)
        (folder / f"{commit[:8]}-{run.target}.json").write_text(json.dumps(data, sort_keys=True))
    for name, info in machines.items():
        (dest / name / "machine.json").write_text(json.dumps(info, indent=1, sort_keys=True))
    benchmarks = {name: t.benchmark() for name, t in sorted(definitions.items())}
    benchmarks["version"] = 2
    (dest / "benchmarks.json").write_text(json.dumps(benchmarks, indent=1, sort_keys=True))
    return definitions


def asv_config(definitions: dict[str, Tracked]) -> dict:
    return {
        "version": 1,
        "project": "pytest-hpcnet runs",
        "project_url": "#",
        "repo": "repo",
        "dvcs": "git",
        "branches": [BRANCH],
        "results_dir": "results",
        "html_dir": "html",
        "show_commit_url": "#",
        # asv calls an upward step a regression; a higher-is-better figure dropping is one, but asv would
        # call its rise one instead: no regression detection for those (their claims judge them)
        "regressions_first_commits": {f"{re.escape(name)}(@|$)": None
                                      for name, t in sorted(definitions.items()) if t.higher_is_better},
    }


def _swap(new: Path, current: Path) -> None:
    old = current.with_name(f".{current.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if current.exists():
        current.rename(old)
    new.rename(current)
    if old.exists():
        shutil.rmtree(old)


@dataclass
class ImportResult:
    store: Path
    imported: list[str]          # run ids added (or replaced) by this import
    runs: int                    # runs in the store now
    machines: list[str]
    benchmarks: int
    skipped: list[str]           # claims of the imported runs that gave no value, and why


def import_records(store: Path, paths: list[Path]) -> ImportResult:
    """Add run records to the store and rebuild its run repository and asv results from all of them."""
    shown, store = Path(store), Path(store).absolute()
    if store.exists() and not store.is_dir():
        raise ConfigError("not a directory", str(shown))
    new = [_run(Path(p)) for p in paths]       # every record is checked before anything is written
    skipped = [s for r in new for s in tracked_of(r.record)[1]]
    with _locked(store):
        records = store / "records"
        records.mkdir(exist_ok=True)
        for run in new:
            write_atomic(records / f"{slug(run.record.run_id)}.json", run.path.read_text())
        runs = sorted((_run(p) for p in records.glob("*.json")), key=lambda r: (r.when, r.record.run_id))
        for tmp in (store / ".repo.new", store / ".results.new"):
            if tmp.exists():
                shutil.rmtree(tmp)
        hashes = _build_repo(runs, store / ".repo.new")
        definitions = _build_results(runs, hashes, store / ".results.new")
        _swap(store / ".repo.new", store / "repo")
        _swap(store / ".results.new", store / "results")
        write_atomic(store / "asv.conf.json", json.dumps(asv_config(definitions), indent=1, sort_keys=True) + "\n")
    return ImportResult(store=shown, imported=[r.record.run_id for r in new], runs=len(runs),
                        machines=sorted({r.machine for r in runs}), benchmarks=len(definitions), skipped=skipped)


def asv_executable() -> str | None:
    return shutil.which("asv", path=str(Path(sys.executable).parent)) or shutil.which("asv")


def publish(store: Path, timeout: float = 600) -> Path:
    """``asv publish`` in the store (the site goes to DIR/html), with the site's libraries made local
    when ``hpcnet asv-site fetch`` has cached them."""
    asv = asv_executable()
    if asv is None:
        raise ConfigError("asv not found (pip install 'asv>=0.6.6,<0.7')", "--publish")
    with _locked(Path(store)):
        done = subprocess.run([asv, "publish"], cwd=store, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise ConfigError(f"asv publish failed ({done.returncode}): {tail[0]}", str(store))
    from .report import asv_site
    html_dir = Path(store) / "html"
    if not asv_site.missing_assets(asv_site.default_assets_dir()):
        asv_site.localize(html_dir)
    return html_dir


# --- the command ---------------------------------------------------------------------------------

DEFAULT_STORE = Path(".hpcnet") / "asv"


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("asv-import", help="add run records to an asv project of claims over time",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", type=Path, metavar="RUN.json", help="run records to add")
    p.add_argument("--into", type=Path, default=DEFAULT_STORE, metavar="DIR",
                   help=f"the asv project directory (default {DEFAULT_STORE}; made when missing)")
    p.add_argument("--publish", action="store_true", help="then run `asv publish` there (site in DIR/html)")
    p.set_defaults(func=_import_command)


def _import_command(args) -> int:
    for path in args.records:
        if path.is_dir():
            raise ConfigError("not a run record (a directory; give its *.json files)", str(path))
    result = import_records(args.into, args.records)
    print(f"{result.store}: imported {len(result.imported)} run(s); {result.runs} run(s) on "
          f"{len(result.machines)} machine(s) ({', '.join(result.machines)}), {result.benchmarks} benchmark(s)")
    for line in result.skipped:
        print(f"  no value: {line}")
    if args.publish:
        print(f"published {publish(args.into)}")
    else:
        print(f"site: cd {result.store} && asv publish && asv preview")
    return 0
