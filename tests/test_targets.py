"""The target registry and the target seam: a taken name is refused, third-party targets come in through
the ``pytest_hpcnet.targets`` entry point group or the ``pytest_hpcnet_targets`` hook, and the
conformance suites run on such a target unchanged, skipping what it does not offer with its name."""

from __future__ import annotations

import shutil
import textwrap
import tomllib
from pathlib import Path

import pytest

from pytest_hpcnet import targets as registry
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.targets import TARGETS, WorkloadMissing, Workloads
from pytest_hpcnet.targets.reference import ReferenceTarget

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "tests" / "data" / "example_target_plugin"
CONFORMANCE = REPO / "suites" / "mapreduce" / "test_conformance.py"
GOLDEN_CASES = len(tomllib.loads((REPO / "fixtures" / "golden" / "teragen.toml").read_text())["case"])


class _Face:
    def configurations(self):
        return {}

    def describe(self):
        return {"name": self.name}

    def workloads(self, cluster, launchers, workdir):
        return Workloads(self, cluster, launchers, workdir)


def test_a_second_target_under_a_taken_name_is_refused_naming_both():
    class Clash(_Face):
        name = "reference"

    with pytest.raises(ConfigError, match=r"target name 'reference' is taken by "
                                          r"pytest_hpcnet\.targets\.reference\.ReferenceTarget; refusing .*Clash"):
        registry.register(Clash)
    assert registry.register(ReferenceTarget) is ReferenceTarget      # the same class again: no-op
    assert TARGETS["reference"] is ReferenceTarget


def test_a_target_without_a_name_or_workloads_is_refused():
    class Nameless(_Face):
        name = ""

    class NoWorkloads:
        name = "half"

        def configurations(self):
            return {}

    with pytest.raises(ConfigError, match="non-empty string class attribute 'name'"):
        registry.register(Nameless)
    with pytest.raises(ConfigError, match=r"target 'half' .* lacks describe\(\), workloads\(\)"):
        registry.register(NoWorkloads)
    assert "half" not in TARGETS


def test_a_workload_the_target_lacks_says_which_target_and_workload(tmp_path):
    class Bare(_Face):
        name = "bare"

    w = Bare().workloads(None, None, tmp_path)
    assert not w.offers("terasort") and w.name == "bare"
    with pytest.raises(WorkloadMissing, match=r"^target 'bare' offers no 'terasort' workload$"):
        w.terasort("in", "out")
    with pytest.raises(WorkloadMissing, match="offers no 'dfsio' workload"):
        w.dfsio(["-write"], res_file=tmp_path / "res")
    with pytest.raises(WorkloadMissing, match=r"offers no 'crosscheck' workload \(it keeps no per-job record\)"):
        w.crosscheck(["a", "b"], 2, ("teragen", 10))


def test_crosscheck_refuses_a_target_without_per_job_records_in_one_line(capsys):
    from pytest_hpcnet.cli import main as hpcnet_main

    class Bare(_Face):
        name = "bare-crosscheck"

    registry.register(Bare)
    try:
        assert hpcnet_main(["crosscheck", "--target", "bare-crosscheck", "--config", "a", "--config", "b",
                            "--", "teragen", "1M"]) == 2
    finally:
        registry.unregister(Bare)
    err = capsys.readouterr().err
    assert err == ("hpcnet crosscheck: --target: target 'bare-crosscheck' offers no 'crosscheck' workload "
                   "(it keeps no per-job record)\n")


def _install(site: Path) -> None:
    """The example plugin as an installer leaves it: its module plus a dist-info whose entry_points.txt
    holds what its pyproject.toml declares."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    shutil.copy(EXAMPLE / "example_hpcnet_target.py", site)
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
             for group, eps in project["entry-points"].items()]
    (info / "entry_points.txt").write_text("\n".join(lines))


def test_entry_points_register_a_third_party_target(tmp_path, monkeypatch):
    _install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = registry.load_entry_points()
        assert [cls.name for cls in found] == ["example"]
        assert registry.load_target("example").describe() == {"name": "example", "version": "1.0"}
    finally:
        for cls in list(TARGETS.values()):
            if cls.__module__ == "example_hpcnet_target":
                registry.unregister(cls)


def test_an_entry_point_whose_name_differs_from_the_targets_is_refused(tmp_path, monkeypatch):
    _install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from importlib import metadata
    (ep,) = [ep for ep in metadata.entry_points(group=registry.ENTRY_POINT_GROUP) if ep.name == "example"]
    renamed = metadata.EntryPoint("reference", ep.value, ep.group)
    with pytest.raises(ConfigError, match=r"entry point reference = example_hpcnet_target:ExampleTarget .*names "
                                          r"target 'example'; the entry point's name must be the target's name"):
        registry.load_entry_points([renamed])
    broken = metadata.EntryPoint("broken", "example_hpcnet_target:Missing", ep.group)
    with pytest.raises(ConfigError, match=r"entry point broken = .*cannot load: AttributeError"):
        registry.load_entry_points([broken])
    assert TARGETS["reference"] is ReferenceTarget


def test_the_example_plugin_runs_the_mapreduce_conformance_suite(pytester, tmp_path, monkeypatch):
    """Installed like a package, the example target is found through its entry point by
    ``--hpcnet-target example``: the suite's TeraGen checks pass on it, and every test needing a
    workload it lacks skips naming the target and that workload."""
    site = tmp_path / "site"
    site.mkdir()
    _install(site)
    monkeypatch.setenv("PYTHONPATH", f"{site}:{REPO}")
    result = pytester.runpytest_subprocess(str(CONFORMANCE), "-p", "no:cacheprovider", "-rs",
                                           "--hpcnet-target", "example", f"--hpcnet-report={tmp_path / 'report'}",
                                           timeout=240)
    result.assert_outcomes(passed=GOLDEN_CASES, skipped=5)
    result.stdout.fnmatch_lines(["*target example 1.0*"])
    for workload in ("terasort", "teravalidate", "randomwriter"):
        result.stdout.fnmatch_lines([f"SKIPPED *target 'example' offers no '{workload}' workload*"])


def test_the_hookspec_example_target_runs_as_pasted(pytester, tmp_path):
    """hookspec.py's example conftest, pasted unchanged, adds a target ``--hpcnet-target`` can name."""
    from pytest_hpcnet import hookspec
    doc = hookspec.pytest_hpcnet_targets.__doc__
    example = doc.split("Example::", 1)[1].split("\n\n    A package", 1)[0]
    pytester.makeconftest(textwrap.dedent(example))
    pytester.makepyfile('''
def test_teragen(target, tmp_path):
    result = target.teragen(10, tmp_path / "gen", maps=2)
    assert result.records == 10 and (tmp_path / "gen" / "part-m-00001").exists()


def test_sort(target, tmp_path):
    target.sort(tmp_path / "in", tmp_path / "out")
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "--hpcnet-target", "tiny",
                                           f"--hpcnet-report={tmp_path / 'report'}", timeout=240)
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED *target 'tiny' offers no 'sort' workload*"])


def test_a_hook_target_clashing_with_a_built_in_one_is_a_usage_error(pytester, tmp_path):
    pytester.makeconftest('''
from pytest_hpcnet.targets.reference import ReferenceTarget


class Clash(ReferenceTarget):
    name = "hadoop"


def pytest_hpcnet_targets():
    return [Clash]
''')
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--hpcnet-report={tmp_path / 'report'}",
                                           timeout=240)
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*pytest-hpcnet: *target name 'hadoop' is taken by "
                                 "pytest_hpcnet.targets.hadoop.target.HadoopTarget; refusing conftest.Clash*"])


# -- the ozone target (its jobs run in suites/crosscheck/test_ozone.py, on netns hosts) ----------------

def test_the_ozone_target_names_seed_002s_three_set_ups_and_refuses_others_in_one_line():
    from pytest_hpcnet.targets.ozone.target import OzoneTarget
    t = registry.load_target("ozone")
    assert isinstance(t, OzoneTarget)
    assert sorted(t.configurations()) == ["fs=hdfs", "fs=ozone,layout=FILE_PER_BLOCK", "fs=ozone,layout=FILE_PER_CHUNK"]
    assert t.settings("fs=ozone") == {"fs": "ozone", "layout": "FILE_PER_BLOCK"}
    assert t.settings("layout=FILE_PER_CHUNK,fs=ozone") == {"fs": "ozone", "layout": "FILE_PER_CHUNK"}
    for bad, why in (("fs=ozone,layout=FILE_PER_BLK", "did you mean 'FILE_PER_BLOCK'"),
                     ("fs=hdfs,layout=FILE_PER_BLOCK", "a layout is Ozone's"),
                     ("fs=s3", "unknown fs 's3'")):
        with pytest.raises(ConfigError, match=why) as info:
            t.workloads(None, None, Path("/nonexistent")).check_config(bad)
        assert "\n" not in str(info.value)


def test_seed_002s_claims_refuse_an_unknown_layout_at_load(tmp_path):
    from pytest_hpcnet.claims import load_claims
    from pytest_hpcnet.vocabulary import Vocabulary
    text = (REPO / "suites" / "crosscheck" / "claims.toml").read_text().replace(
        "layout=FILE_PER_CHUNK", "layout=FILE_PER_CHUCK", 1)
    (tmp_path / "claims.toml").write_text(text)
    vocabulary = Vocabulary(targets=registry.shipped_vocabularies())
    with pytest.raises(ConfigError, match="unknown layout 'FILE_PER_CHUCK'"):
        for claim in load_claims([tmp_path / "claims.toml"]).values():      # as a run loads them
            vocabulary.check_claim(claim)


def test_the_ozone_target_without_its_jars_says_how_to_fetch_them(tmp_path):
    from pytest_hpcnet.targets.hadoop.runtime import HadoopUnavailable
    from pytest_hpcnet.targets.ozone.target import OzoneTarget
    t = OzoneTarget(env={"HPCNET_OZONE_JARS": str(tmp_path), "PATH": "/usr/bin:/bin"})
    with pytest.raises(HadoopUnavailable, match="Ozone jars missing in .*make ozone-jars"):
        t.runtime()
    assert "make ozone-jars" in t.describe()["unavailable"]


def test_a_client_jar_beside_hadoops_goes_on_the_classpath_and_into_hadoop_classpath(tmp_path):
    from pytest_hpcnet.targets.hadoop.runtime import HadoopRuntime
    rt = HadoopRuntime(java="/usr/bin/java", jar_dir=tmp_path, extra_jars=("/x/ozone-filesystem-hadoop3.jar",))
    assert rt.classpath("/conf").split(":") == ["/conf", f"{tmp_path}/*", "/x/ozone-filesystem-hadoop3.jar"]
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    rt = HadoopRuntime(java="/usr/bin/java", hadoop_home=home, extra_jars=("/x/fs.jar",))
    assert rt.program_env("teragen", "/conf")["HADOOP_CLASSPATH"].endswith("/x/fs.jar")
