"""pytest wiring: options, markers, fixtures, xdist plumbing, terminal summary. Logic lives elsewhere."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from . import hookspec, options
from .cluster import launcher as launcher_registry
from .cluster.reaper import interrupt_on_signals
from .errors import HpcnetError
from .hardware import FEATURES
from .measure import Measurement, Paired
from .report.terminal import (choose_tables, fabric_table, measurements_summary, measurements_table,
                              verdicts_summary, verdicts_table)
from .session import HpcnetSession
from . import targets as target_registry
from .targets import NotOffered
from .targets.hadoop.budget import TEST_S as HADOOP_TEST_S

_KEY = pytest.StashKey[HpcnetSession]()
_RESTORE = pytest.StashKey[object]()
_HOOK_LAUNCHERS = pytest.StashKey[list]()
_HOOK_TARGETS = pytest.StashKey[list]()


class ClaimWarning(UserWarning):
    """A claim's confidence interval straddles its bound, or sits inside the warn band."""


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser):
    group = parser.getgroup("hpcnet", "pytest-hpcnet: big-data stacks on fast networks")
    for s in options.SETTINGS:
        shape = {"action": "store_const", "const": "yes"} if s.switch else \
            {"action": "append" if s.many else "store", "metavar": s.name.upper()}
        group.addoption(s.flag, dest=f"hpcnet_{s.name}", default=[] if s.many else None, **shape,
                        help=f"{s.help} (env {s.env}, ini {s.ini}; default: {s.default_text})".replace("%", "%%"))
        parser.addini(s.ini, help=s.help, type="linelist" if s.many else "string", default=None)


def _settings(config) -> dict:
    ini_file = str(config.inipath) if config.inipath else None
    out = {}
    for s in options.SETTINGS:
        ini = config.getini(s.ini)
        out[s.name] = options.resolve(s, getattr(config.option, f"hpcnet_{s.name}"), ini_value=ini or None,
                                      ini_file=ini_file)
    return out


# Markers that are not hardware features: what else a test needs.
OTHER_MARKERS = {
    "hadoop": "needs Apache Hadoop: Java and the jars of targets/hadoop (skipped with the reason otherwise)",
    "slow": "takes minutes rather than seconds (deselect with -m 'not slow')",
    "slurm": "needs a real Slurm on this box (slurmctld, slurmd, munge; skipped with the reason otherwise)",
}


def pytest_configure(config):
    for name, description in FEATURES.items():
        config.addinivalue_line("markers", f"{name}: needs hardware feature '{name}' on every node ({description})")
    for name, description in OTHER_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    if config.option.help or config.option.showfixtures or getattr(config.option, "markers", False):
        return
    workerinput = getattr(config, "workerinput", None)
    try:
        config.stash[_HOOK_LAUNCHERS] = launcher_registry.register_from_hook(config.hook.pytest_hpcnet_launchers())
        config.stash[_HOOK_TARGETS] = target_registry.register_from_hook(config.hook.pytest_hpcnet_targets())
        session = HpcnetSession(_settings(config), rootdir=config.rootpath, args=list(config.args),
                                worker_probes=workerinput.get("hpcnet_probes") if workerinput else None)
    except HpcnetError as e:
        raise pytest.UsageError(f"pytest-hpcnet: {e}") from None
    config.stash[_KEY] = session
    # SIGTERM and SIGHUP end the run like Ctrl-C: every launched process and namespace is torn down
    config.stash[_RESTORE] = interrupt_on_signals()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Probe the nodes once, before the header and collection: a failed probe stops the run in one line
    (``--hpcnet-probe-errors=warn`` runs on, the node having only its declared features)."""
    config = session.config
    hs = config.stash.get(_KEY, None)
    if hs is None or hasattr(config, "workerinput"):
        return
    failures = hs.probe_failures()
    if failures and hs.probe_errors == "error":
        more = f" (and {len(failures) - 1} more node(s))" if len(failures) > 1 else ""
        raise pytest.UsageError(f"pytest-hpcnet: hardware probe failed on {failures[0]}{more}; "
                                "--hpcnet-probe-errors=warn runs on without that node's probed features")
    hs.probe_warnings = [f"hpcnet: WARNING hardware probe failed on {line} (--hpcnet-probe-errors=warn)"
                         for line in failures]


def pytest_report_header(config):
    hs = config.stash.get(_KEY, None)
    if hs is None or hasattr(config, "workerinput"):
        return None
    return hs.header() + getattr(hs, "probe_warnings", [])


def pytest_unconfigure(config):
    session = config.stash.get(_KEY, None)
    try:
        if session is not None:
            session.close()
    finally:
        config.stash.get(_RESTORE, lambda: None)()
        for cls in config.stash.get(_HOOK_LAUNCHERS, []):
            launcher_registry.unregister(cls)
        for cls in config.stash.get(_HOOK_TARGETS, []):
            target_registry.unregister(cls)


def _session(config) -> HpcnetSession:
    try:
        return config.stash[_KEY]
    except KeyError:
        raise pytest.UsageError("pytest-hpcnet is not configured in this run") from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.excinfo is not None and call.excinfo.errisinstance(NotOffered) and report.failed:
        # what the target does not offer (a workload, or running here at all) skips, saying so
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1, f"Skipped: {call.excinfo.value}")
    hs = item.config.stash.get(_KEY, None)
    if hs is not None and report.skipped and report.when in ("setup", "call"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        hs.record_skip(Path(item.path), reason.removeprefix("Skipped: "))
    return report


def pytest_itemcollected(item):
    # A test parametrized by claim id owns that claim: only it judges it (so a deselected paper-claim
    # test leaves its claim 'not evaluated', never judged from another claim's measurements).
    hs = item.config.stash.get(_KEY, None)
    callspec = getattr(item, "callspec", None)
    if hs is not None and callspec is not None:
        hs.owned_claims.update(v for v in callspec.params.values() if isinstance(v, str) and v in hs.claims)


def pytest_collection_modifyitems(session, config, items):
    hs = config.stash.get(_KEY, None)
    if hs is None:
        return
    timeouts = config.pluginmanager.hasplugin("timeout")
    target_timeout = getattr(hs.target, "test_timeout", None)
    for item in items:
        hs.collected_paths.add(Path(item.path).resolve())
        required = [m.name for m in item.iter_markers() if m.name in FEATURES]
        if required and (reason := hs.skip_reason(required)):
            item.add_marker(pytest.mark.skip(reason=reason))
        # A Hadoop test's budget holds on a loaded box and may include the MiniCluster's start-up; a
        # test driving the run's target gets the budget that target declares (if it declares one).
        if timeouts and item.get_closest_marker("timeout") is None:
            if item.get_closest_marker("hadoop"):
                item.add_marker(pytest.mark.timeout(HADOOP_TEST_S))
            elif target_timeout and "target" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.timeout(target_timeout))


def pytest_generate_tests(metafunc):
    """A test asking for ``target_config`` runs once per configuration the target samples for
    conformance (the reference: four engine configurations; Hadoop: its default)."""
    if "target_config" in metafunc.fixturenames:
        hs = metafunc.config.stash.get(_KEY, None)
        configs = hs.workloads.sample_configs() if hs is not None else [""]
        metafunc.parametrize("target_config", configs, ids=[c or "default" for c in configs])


# -- xdist: probes go out to workers, results come back (optional hooks: xdist may be absent) --------
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["hpcnet_probes"] = _session(node.config).probes_json()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {}).get("hpcnet")
    if output:
        _session(node.config).merge(output)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    hs = config.stash.get(_KEY, None)
    if hs is None or config.option.collectonly:
        return
    if hasattr(config, "workerinput"):
        config.workeroutput["hpcnet"] = hs.worker_output()
        return
    record = hs.finish()
    if late := hs.late_failures():
        # claims judged here, from what the tests recorded, fail the run as a test's claim fails its test
        hs.late_report = [f"{v.message()}{' (--hpcnet-strict-warn)' if v.outcome == 'warn' else ''}"
                          for v in late]
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if hs.canary and (missed := hs.canary_missed()):
        hs.canary_report = (f"canary: {len(missed)} enforced local gate(s) did not FAIL with "
                            f"{hs.canary:.0%} injected: {', '.join(missed)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not (record.measurements or record.verdicts):
        return  # nothing measured (e.g. the plugin's own unit tests): no record to keep
    config.hook.pytest_hpcnet_record(config=config, record=record)
    try:
        hs.record_path = record.write(hs.report_dir)
    except OSError as e:
        hs.record_error = f"pytest-hpcnet: cannot write the run record into {hs.report_dir}: {e.strerror or e}"
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        return
    if hs.asv_dir is not None:
        imported, hs.asv_line = hs.import_to_asv(hs.record_path)
        if not imported:   # the record is kept; the run says the history has a gap
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    hs = config.stash.get(_KEY, None)
    if hs is not None and getattr(hs, "record_error", None):
        terminalreporter.write_line(hs.record_error, red=True, bold=True)
    if hs is None or hasattr(config, "workerinput") or not getattr(hs, "record_path", None):
        return
    tr = terminalreporter
    tables = choose_tables(hs.tables, config.option.verbose)
    if tables == "summary":
        tr.write_sep("=", "hpcnet")
        tr.write_line(measurements_summary(hs.measurements))
    elif hs.measurements:
        tr.write_sep("=", "hpcnet measurements")
        tr.write_line(measurements_table(hs.measurements, tables))
    if hs.verdicts:
        if tables != "summary":
            tr.write_sep("=", "hpcnet claims")
            tr.write_line(verdicts_table(hs.verdicts, tables))
            if fabric := fabric_table(hs.verdicts):
                tr.write_sep("=", "hpcnet fabric ceilings (native tools beside each RDMA claim)")
                tr.write_line(fabric)
        for line in verdicts_summary(hs.verdicts):
            tr.write_line(line)
    tr.write_line(f"hpcnet run record: {hs.record_path}")
    if getattr(hs, "asv_line", None):
        tr.write_line(hs.asv_line, red=not hs.asv_line.startswith("hpcnet asv: added"))
    for line in getattr(hs, "late_report", ()):
        tr.write_line(f"claim failed the run: {line}", red=True, bold=True)
    if getattr(hs, "canary_report", None):
        tr.write_line(hs.canary_report, red=True, bold=True)


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def hpcnet(request) -> HpcnetSession:
    """The run's HpcnetSession (cluster, target, claims, probes)."""
    return _session(request.config)


@pytest.fixture(scope="session")
def cluster(hpcnet):
    """The cluster under test (``--hpcnet-cluster``): ``.nodes``, each with addresses and dirs."""
    return hpcnet.cluster


@pytest.fixture(scope="session")
def launchers(hpcnet):
    """Start processes on nodes: ``launchers.start(node, argv)``. Everything is killed at the end."""
    return hpcnet.launchers


@pytest.fixture(scope="session")
def target(hpcnet):
    """The stack under test (``--hpcnet-target``): its ``name``, named ``configurations()`` and the
    workloads the suites run on it (``targets.Workloads``: ``target.teragen(rows, outdir)``, ...). A
    workload it lacks, or a stack that cannot run here, skips the test with the reason."""
    return hpcnet.workloads


@pytest.fixture
def workdirs(request, cluster) -> dict:
    """A fresh directory per node for this test: {node name: Path} under each node's work dir."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)[-120:]
    dirs = {}
    for node in cluster.nodes:
        d = Path(node.workdir) / "tests" / safe
        d.mkdir(parents=True, exist_ok=True)
        dirs[node.name] = d
    return dirs


class Recorder:
    """What a test uses to record measurements and run paired rounds (the ``measure`` fixture)."""

    def __init__(self, hs: HpcnetSession, item):
        self._hs, self._item = hs, item
        self.rounds = hs.rounds

    def record(self, *measurements: Measurement) -> None:
        for m in measurements:
            m.test = self._item.nodeid
            self._hs.record(m)
            key = f"hpcnet.{m.metric}[{m.config}]" + "".join(f"[{k}={v}]" for k, v in sorted(m.params.items()))
            self._item.user_properties.append((key, f"{m.value:.6g} {m.unit}"))

    def paired(self, baseline, candidate, *, rounds: int | None = None, warmup: int = 1,
               metric: str = "") -> Paired:
        """Run ``(config name, fn)`` pairs interleaved; each fn returns one sample of ``metric`` per call."""
        from .measure import run_paired
        (bname, bfn), (cname, cfn) = baseline, candidate
        return run_paired(bfn, cfn, rounds=rounds or self.rounds, warmup=warmup,
                          baseline_name=bname, candidate_name=cname, metric=metric)


@pytest.fixture
def measure(request, hpcnet) -> Recorder:
    """Record ``Measurement``s and run paired baseline/candidate rounds (``--hpcnet-rounds``)."""
    return Recorder(hpcnet, request.node)


@pytest.fixture
def fabric_ceiling(request, hpcnet):
    """``fabric_ceiling(claim_id)``: measure what the fabric alone allows for an RDMA claim (perftest vs
    qperf on the cluster's first two nodes), recorded as ``fabric.*`` beside it; returns why a side
    could not be measured (the report says so)."""
    return lambda claim_id: hpcnet.measure_fabric(claim_id, request.node.nodeid)


@pytest.fixture
def claim(request, hpcnet):
    """``claim(id, paired)`` or ``claim(id, baseline, candidate)`` -> Verdict.

    ``paired`` is a ``measure.Paired`` that names its metric (``measure.paired(..., metric=...)``);
    ``baseline`` and ``candidate`` are ``measure.Series`` or ``Measurement``s. Samples of another metric
    or configuration than the claim names fail the test. ``requires``: features the claim's
    configurations need besides its markers (n/a where absent, before anything runs: pass None as
    ``baseline``); ``unavailable``: what this run lacks that the claim needs (software, e.g. the native
    core), n/a with that reason. A failed claim fails the test (it only warns
    for a report-only claim or under ``--hpcnet-verdicts report``); n/a skips it; a warn warns
    (``ClaimWarning``), or fails under ``--hpcnet-strict-warn``. Under ``--hpcnet-canary`` an enforced
    local gate must FAIL, and the test fails if it does not.
    """
    def check(claim_id: str, baseline, candidate=None, *, requires=(), unavailable: str = ""):
        try:
            verdict = hpcnet.check_claim(claim_id, baseline, candidate, requires=requires, unavailable=unavailable)
        except (KeyError, ValueError, TypeError) as e:
            problem = str(e.args[0]) if e.args else str(e)
        else:
            problem = None
        if problem is not None:
            pytest.fail(problem, pytrace=False)
        request.node.user_properties.append((f"hpcnet.claim.{claim_id}", verdict.outcome))
        if verdict.outcome == "n/a":
            pytest.skip(verdict.message())
        if verdict.injected:
            if verdict.outcome != "fail":
                pytest.fail(f"canary: this gate did not fail with {verdict.injected:.0%} injected -- "
                            f"{verdict.message()}", pytrace=False)
            return verdict
        if verdict.outcome == "fail":
            if hpcnet.enforce_verdicts and verdict.enforced:
                pytest.fail(verdict.message(), pytrace=False)
            why = "report-only claim" if not verdict.enforced else "--hpcnet-verdicts report"
            warnings.warn(ClaimWarning(f"{verdict.message()} (not enforced: {why})"))
        if verdict.outcome == "warn":
            if hpcnet.strict_warn and hpcnet.enforce_verdicts and verdict.enforced:
                pytest.fail(f"{verdict.message()} (--hpcnet-strict-warn)", pytrace=False)
            warnings.warn(ClaimWarning(verdict.message()))
        return verdict
    return check
