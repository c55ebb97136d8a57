"""The state of one pytest run: cluster, target, claims, probes, and everything measured.

The plugin creates one ``HpcnetSession`` in ``pytest_configure`` and only wires hooks to it. Nothing here
imports pytest: bad settings raise ``ConfigError`` (the plugin turns it into ``pytest.UsageError``), so
the same session can be driven by the CLI or a test without pytest.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from . import hardware
from .errors import ConfigError, HpcnetError
from .hostcpu import host_cpu
from .claims import (Claim, NotMeasured, Verdict, as_paired, evaluate, load_claims, measured_pair,
                     measured_sides,
                     not_applicable, not_evaluated, sensitivity, settle)
from .cluster import load_cluster
from .cluster.pool import Launchers
from .measure import DEFAULT_ROUNDS, Measurement, Paired
from .results import RunRecord, new_run_id, provenance
from .targets import SHIPPED_CLAIM_TARGETS, load_target, shipped_vocabularies, vocabulary_of
from .vocabulary import Vocabulary


def discover_claim_files(rootdir: Path, args: list[str]) -> list[Path]:
    """claims.toml of every suite under the root, and any inside the paths given on the command line."""
    found = {p.resolve() for p in Path(rootdir).glob("suites/*/claims.toml")}
    for arg in args:
        path = Path(arg.split("::")[0])
        if path.is_dir():
            found.update(p.resolve() for p in path.rglob("claims.toml"))
    return sorted(found)


def check_writable_dir(path: Path, where: str) -> None:
    """ConfigError unless ``path`` is a directory this process can write into, or can be made one (the
    run record goes there at the very end, after every test ran: too late to find out then)."""
    path = Path(path)
    made = []
    try:
        probe = path.absolute()
        while not probe.exists():
            made.append(probe)
            probe = probe.parent
        if not probe.is_dir():
            raise ConfigError(f"{str(probe)!r} is not a directory (run records go in {str(path)!r})", where)
        for d in reversed(made):
            d.mkdir()
        with tempfile.NamedTemporaryFile(dir=path, prefix=".hpcnet-check-"):
            pass
    except OSError as e:
        raise ConfigError(f"cannot write run records into {str(path)!r}: {e.strerror or e}", where) from None
    finally:
        for d in made:
            try:
                d.rmdir()
            except OSError:
                pass


class HpcnetSession:
    def __init__(self, settings: dict, *, rootdir: Path, args: list[str], worker_probes: dict | None = None):
        values = {name: value for name, (value, _) in settings.items()}
        where = {name: origin for name, (_, origin) in settings.items()}
        self.rootdir = Path(rootdir)
        self.args = list(args)
        self.report_dir = Path(values["report"])
        check_writable_dir(self.report_dir, where["report"])
        self.asv_dir = Path(values["asv"]) if values.get("asv") else None
        if self.asv_dir is not None:
            check_writable_dir(self.asv_dir, where["asv"])
        self.probe_errors = values["probe_errors"]
        self.tables = values["tables"]             # how much the end-of-run summary shows (report.terminal)
        self.rounds = values["rounds"] or DEFAULT_ROUNDS
        self.max_rounds = values["max_rounds"]     # None: three times each comparison's own rounds
        if self.max_rounds is not None and self.max_rounds < self.rounds:
            raise ConfigError(f"the round budget ({self.max_rounds}) is below the rounds ({self.rounds})",
                              where["max_rounds"])
        self.canary = values["canary"]          # injected regression, or None
        self.strict_warn = values["strict_warn"]
        self.assumed = frozenset(values["assume"])
        self.enforce_verdicts = values["verdicts"] == "enforce"
        hardware.check_feature_names(self.assumed, where["assume"])

        self._tmp = Path(tempfile.mkdtemp(prefix="hpcnet-"))
        try:
            cluster = load_cluster(values["cluster"], root=self._tmp / "cluster", where=where["cluster"])
            if values["sysroot"]:
                sysroot = Path(values["sysroot"]).resolve()
                cluster = dataclasses.replace(
                    cluster, nodes=tuple(dataclasses.replace(n, sysroot=sysroot) for n in cluster.nodes))
            for node in cluster.nodes:
                hardware.check_feature_names(node.features, f"{cluster.source}: node {node.name}: features")
            if cluster.shared is not None and all(n.launcher == "local" for n in cluster.nodes):
                # every node is on this host, so the "cluster file system" is a dir here: make it, as
                # the local launcher makes work dirs (a remote cluster's must already be mounted)
                Path(cluster.shared).mkdir(parents=True, exist_ok=True)
            self.cluster = cluster
            self.target = load_target(values["target"], where["target"])
            # the suites' claims, then the cluster's own files (its bound overrides), then the user's
            user_files = list(cluster.claims) + [Path(p) for p in values["claims"]]
            self.user_claim_files = {str(p) for p in user_files}
            declared: dict = {}
            claims = load_claims(discover_claim_files(self.rootdir, self.args) + user_files, vocabulary=declared)
            # local gates run on this host's embedded cluster: judged with this CPU's recorded bounds
            self.host_cpu = host_cpu()
            self.claims: dict[str, Claim] = {k: c.on_host(self.host_cpu) for k, c in claims.items()}
            self.vocabulary = Vocabulary(metrics=declared.get("metrics", ()), configs=declared.get("configs", ()),
                                         targets=self._target_vocabularies())
            for claim in self.claims.values():
                self.vocabulary.check_claim(claim)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        self.launchers = Launchers(self.cluster, self._tmp / "logs")
        self._workloads = None
        self._probes = self.probes_from_json(worker_probes) if worker_probes is not None else None
        self.measurements: list[Measurement] = []
        self.verdicts: list[dict] = []
        self.collected_paths: set[Path] = set()
        self.owned_claims: set[str] = set()        # claim ids a collected test is parametrized by
        self.skips: dict[str, list[str]] = {}
        self.late_verdicts: list[Verdict] = []     # claims judged at the end from recorded measurements
        self.fabric_notes: dict[str, list[str]] = {}   # claim id -> why a side of its fabric ceiling is missing
        self._fabric_done: dict[tuple, list[str]] = {}

    @property
    def workloads(self):
        """The target's workloads on this run's cluster (``targets.Workloads``; what the ``target``
        fixture hands the tests). Whatever they start stops in ``close()``."""
        if self._workloads is None:
            self._workloads = self.target.workloads(self.cluster, self.launchers, self._tmp / "target")
        return self._workloads

    def _target_vocabularies(self) -> list:
        """The reference's and Ozone's vocabularies (the shipped suites' claims use their names: seed
        002's claims name Ozone's storage set-ups) and the run's target's, if another: what configuration
        names claims may use."""
        vocabularies = shipped_vocabularies()
        if self.target.name not in SHIPPED_CLAIM_TARGETS:
            try:
                vocabularies.append(vocabulary_of(self.target))
            except HpcnetError:   # e.g. an unreadable HPCNET_HADOOP_CONFIGS: its tests say so when run
                pass
        return vocabularies

    # -- hardware ---------------------------------------------------------------------------------
    @property
    def probes(self) -> dict[str, hardware.NodeProbe]:
        """Every node's probe, run once per run (on xdist workers: handed over by the controller)."""
        if self._probes is None:
            found = hardware.probe_cluster(self.cluster, self.launchers)
            self._probes = {name: dataclasses.replace(p, features=p.features | self.assumed)
                            for name, p in found.items()}
        return self._probes

    def probe_failures(self) -> list[str]:
        """One line per node whose hardware probe failed (node and cause)."""
        return [p.error if p.error.startswith(f"{name}:") else f"{name}: {p.error}"
                for name, p in self.probes.items() if p.error]

    def header(self) -> list[str]:
        """The session header: cluster, target, nodes and their probed features (one or two lines)."""
        c = self.cluster
        names = [n.name for n in c.nodes]
        shown = ", ".join(names) if len(names) <= 4 else f"{names[0]} .. {names[-1]}"
        target = self.target.describe()
        lines = [f"hpcnet: cluster {c.source}{f' ({c.name})' if c.name and c.name != c.source else ''}: "
                 f"{len(names)} node(s) {shown}; target {target.get('name')} {target.get('version', '')}".rstrip()]
        groups: dict[tuple, list[str]] = {}
        for name, p in self.probes.items():
            groups.setdefault(tuple(sorted(p.features)) if not p.error else ("PROBE FAILED",), []).append(name)
        parts = [f"{', '.join(nodes) if len(groups) > 1 else 'every node'}: {' '.join(f) or '-'}"
                 for f, nodes in groups.items()]
        lines.append("hpcnet: features: " + "; ".join(parts))
        return lines

    def probes_json(self) -> dict:
        return {name: {"features": sorted(p.features), "declared": sorted(p.declared), "facts": p.facts,
                       "error": p.error} for name, p in self.probes.items()}

    @staticmethod
    def probes_from_json(data: dict) -> dict[str, hardware.NodeProbe]:
        return {name: hardware.NodeProbe(name, frozenset(d["features"]), frozenset(d["declared"]),
                                         d["facts"], d["error"]) for name, d in data.items()}

    def missing(self, required) -> dict[str, list[str]]:
        """Feature -> nodes that lack it."""
        return hardware.missing(required, self.probes)

    def skip_reason(self, required) -> str | None:
        missing = self.missing(required)
        return f"{hardware.skip_reason(missing)} (cluster {self.cluster.source})" if missing else None

    # -- results ----------------------------------------------------------------------------------
    def record(self, m: Measurement) -> None:
        self.measurements.append(m)

    def check_claim(self, claim_id: str, baseline, candidate=None, requires=(), unavailable: str = "") -> Verdict:
        """Evaluate a claim on a ``Paired`` (more rounds are taken while its CI straddles a bound, up to
        ``max_rounds``) or on two sides (``measure.Series``/``Measurement``); n/a without running
        anything if hardware is absent (the claim's markers, and ``requires``: what its configurations
        need, e.g. ``hardware.config_features``), or when ``unavailable`` names software this run lacks
        (e.g. the native core where it is not built). Under the canary an enforced local gate's candidate is
        made worse first; every local claim's sensitivity is recorded."""
        claim = self.claims.get(claim_id)
        if claim is None:
            raise KeyError(f"no claim {claim_id!r} is loaded (known: {', '.join(sorted(self.claims)) or 'none'})")
        missing = self.missing([*claim.markers, *requires])
        if unavailable:
            verdict = not_applicable(claim, {})
            verdict.reason = unavailable
        elif missing:
            verdict = not_applicable(claim, missing)
            if set(missing) - set(claim.markers):
                verdict.reason += f" (its configurations need {', '.join(sorted(set(requires)))})"
        else:
            injected = self.canary if self.canary and self.is_gate(claim) else 0.0
            if isinstance(baseline, Paired) and claim.kind == "absolute":
                baseline, candidate = None, baseline.sides()[1]
            if baseline is None or claim.kind == "absolute":     # the candidate alone
                verdict = evaluate(claim, None, candidate, inject_regression=injected)
            else:
                paired = as_paired(claim, baseline, candidate)
                verdict = settle(claim, paired, max_rounds=self.round_budget(paired.rounds),
                                 inject_regression=injected)
                if claim.is_local:
                    verdict.sensitivity = sensitivity(claim, *paired.sides())
        self.verdicts.append(verdict.to_json())
        return verdict

    def round_budget(self, first_rounds: int) -> int:
        """How many rounds a comparison may grow to: ``--hpcnet-max-rounds``, or three times the rounds it
        started with (a paper-scale test that runs 3 rounds of 10 GB jobs must not grow to 90)."""
        return self.max_rounds if self.max_rounds is not None else 3 * first_rounds

    def canary_missed(self) -> list[str]:
        """Under the canary: the enforced local gates that did not FAIL with the regression injected
        (not evaluated at all counts too, so a gate left out of the canary run cannot hide; a gate n/a here,
        whose verdict says what this run lacks, is not one the canary could trip)."""
        caught = {v["claim_id"] for v in self.verdicts if v.get("injected") and v["outcome"] == "fail"}
        absent = {v["claim_id"] for v in self.verdicts if v["outcome"] == "n/a"}
        return sorted(c.id for c in self.claims.values() if self.is_gate(c) and c.id not in caught | absent)

    def is_gate(self, claim: Claim) -> bool:
        """An enforced local claim: this project's own regression gate, which the canary must trip."""
        return claim.is_local and claim.enforced

    def record_skip(self, path: Path, reason: str) -> None:
        """A test of ``path`` was skipped: claims of its suite left unevaluated say why."""
        self.skips.setdefault(str(Path(path).resolve()), []).append(reason)

    def worker_output(self) -> dict:
        return {"measurements": [m.to_json() for m in self.measurements], "verdicts": self.verdicts,
                "collected": sorted(map(str, self.collected_paths)), "skips": self.skips,
                "owned": sorted(self.owned_claims), "fabric_notes": self.fabric_notes}

    def merge(self, output: dict) -> None:
        self.measurements += [Measurement.from_json(m) for m in output["measurements"]]
        self.verdicts += output["verdicts"]
        self.collected_paths.update(Path(p) for p in output["collected"])
        self.owned_claims.update(output.get("owned", ()))
        for claim_id, reasons in output.get("fabric_notes", {}).items():
            self.fabric_notes.setdefault(claim_id, []).extend(reasons)
        for path, reasons in output.get("skips", {}).items():
            self.skips.setdefault(path, []).extend(reasons)

    def _judge_the_rest(self) -> list[dict]:
        """Verdicts on the loaded claims no test judged, from what the run measured.

        Considered: every claim the user gave (``--hpcnet-claims``, the inventory's claims files), every
        claim of a suite that ran, and every claim whose metric the run measured. Each is n/a when its
        hardware is absent; judged with ``evaluate`` on the paired samples the run recorded
        (``claims.measured_sides``) when there are some; else 'not evaluated' with what was missing and the
        skip reasons of its suite's tests (a local gate that silently did not run is as bad as one that
        cannot fail).
        """
        done = {v["claim_id"] for v in self.verdicts}
        measured = {m.metric for m in self.measurements}
        out = []
        for claim in self.claims.values():
            if claim.id in done:
                continue
            suite = Path(claim.file).parent
            ran = any(p == suite or suite in p.parents for p in self.collected_paths)
            if not (ran or claim.metric in measured or not self._shipped(claim)):
                continue
            missing = self.missing(claim.markers)
            if missing:
                out.append(not_applicable(claim, missing).to_json())
                continue
            if claim.id in self.owned_claims:
                out.append(not_evaluated(claim, "its own test did not judge it in this run (deselected, "
                                                "skipped, or failed before the claim)").to_json())
                continue
            try:
                baseline, candidate = measured_sides(claim, self.measurements)
            except NotMeasured as e:
                needs = self.missing(hardware.config_features(*claim.configs()))
                if needs:
                    verdict = not_applicable(claim, needs)
                    verdict.reason += f" (its configurations need {', '.join(sorted(needs))})"
                    out.append(verdict.to_json())
                    continue
                reasons = sorted({r for path, rs in self.skips.items() if suite in Path(path).parents
                                  for r in rs}) if self._shipped(claim) else []
                why = f"not measured in this run: {e}" + \
                    (f"; skipped tests of {suite.name}: " + "; ".join(reasons[:3]) if reasons else "")
                out.append(not_evaluated(claim, why).to_json())
                continue
            injected = self.canary if self.canary and self.is_gate(claim) else 0.0
            try:
                verdict = evaluate(claim, baseline, candidate, inject_regression=injected)
                if claim.is_local and baseline is not None:
                    verdict.sensitivity = sensitivity(claim, baseline, candidate)
            except ValueError as e:
                out.append(not_evaluated(claim, f"its measurements cannot be judged: {e}").to_json())
                continue
            _, recorded = measured_pair(claim, self.measurements)
            verdict.reason += f" (judged at the end of the run from the samples {recorded.test or 'the run'} " \
                              "recorded)"
            short = claim.below_scale(recorded.params)
            if short:
                verdict.enforced = False
                verdict.reason += f"; reported, not enforced: below the published scale ({short})"
            out.append(verdict.to_json())
            self.late_verdicts.append(verdict)
        return out

    def _shipped(self, claim: Claim) -> bool:
        """A claim from a suite's own claims.toml (not a file the user or the inventory gave)."""
        return claim.file not in self.user_claim_files

    def late_failures(self) -> list[Verdict]:
        """Claims judged at the end of the run that fail the run: an enforced fail (a warn under
        ``--hpcnet-strict-warn``), unless verdicts are only reported or the canary injected it."""
        if not self.enforce_verdicts:
            return []
        bad = ("fail", "warn") if self.strict_warn else ("fail",)
        return [v for v in self.late_verdicts if v.enforced and not v.injected and v.outcome in bad]

    def measure_fabric(self, claim_id: str, test: str | None = None) -> list[str]:
        """The fabric's ceiling for a claim with ``fabric = ...``: its native tools on the cluster's first
        two nodes, recorded as ``fabric.*`` measurements (once per quantity and network in a run).
        Returns why a side could not be measured (also kept for the claim's verdict)."""
        from .fabric.ceiling import baseline_net
        from .fabric.probe import measure_fabric
        claim = self.claims[claim_id]
        if not claim.fabric:
            raise ConfigError(f"claim {claim_id!r} names no fabric quantity (fabric = \"latency\" | \"bandwidth\")",
                              "fabric ceiling")
        key = (claim.fabric, baseline_net(claim))
        if key not in self._fabric_done:
            measurements, why = measure_fabric(self.launchers, self.cluster.nodes, claim.fabric, key[1])
            for m in measurements:
                m.test = test
                self.record(m)
            self._fabric_done[key] = why
        self.fabric_notes[claim_id] = list(self._fabric_done[key])
        return self.fabric_notes[claim_id]

    def finish(self) -> RunRecord:
        self.verdicts += self._judge_the_rest()
        from .fabric.ceiling import attach_ceilings
        attach_ceilings(self.verdicts, self.measurements, self.claims, self.fabric_notes)
        probes = self.probes_json()
        nodes = [{"name": n.name, "host": n.host, "addresses": n.addresses, "launcher": n.launcher,
                  **probes[n.name]} for n in self.cluster.nodes]
        controller = {"addresses": dict(self.cluster.controller), "source": self.cluster.controller_source}
        prov = provenance(cluster={"source": self.cluster.source, "name": self.cluster.name, "nodes": nodes,
                                   "controller": controller},
                          target=self.target.describe(), cwd=self.rootdir, args=self.args)
        prov["rounds"] = self.rounds
        prov["max_rounds"] = self.max_rounds
        if self.canary:
            prov["canary"] = self.canary
        return RunRecord(run_id=new_run_id(), provenance=prov, measurements=self.measurements,
                         verdicts=self.verdicts)

    def import_to_asv(self, record_path: Path) -> tuple[bool, str]:
        """Add the written run record to the asv project ``--hpcnet-asv`` names: (done, line to print)."""
        from .asv_import import import_records
        try:
            result = import_records(self.asv_dir, [record_path])
        except (HpcnetError, OSError) as e:
            return False, f"pytest-hpcnet: could not add the run to the asv project {self.asv_dir}: {e}"
        return True, (f"hpcnet asv: added to {self.asv_dir} ({result.runs} run(s), {result.benchmarks} "
                      f"benchmark(s)); cd {self.asv_dir} && asv publish")

    def close(self) -> None:
        try:
            if self._workloads is not None:
                self._workloads.close()
        finally:
            self._workloads = None
            self.launchers.close()
        shutil.rmtree(self._tmp, ignore_errors=True)
