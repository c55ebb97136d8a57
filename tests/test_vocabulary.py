"""Everything a claim or an inventory names is checked: metrics, configuration keys and values, markers
and features, each refused in one line with "did you mean" (issue 19: ``rpc.echo.latency``,
``transprot=tcp`` and ``ib_qrd`` passed without a word)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from pytest_hpcnet import vocabulary
from pytest_hpcnet.claims import Claim, load_claims
from pytest_hpcnet.cluster import load_cluster
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.targets import load_target, vocabulary_of
from pytest_hpcnet.vocabulary import Vocabulary, parse_name

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = vocabulary_of(load_target("reference"))


def _reference() -> Vocabulary:
    return Vocabulary(targets=[REFERENCE])


def _claim(**kw) -> Claim:
    fields = dict(id="c", statement="s", metric="rpc.echo.rtt", baseline="transport=tcp,net=ib",
                  candidate="transport=verbs", kind="ratio", direction="lower", max=1.0, source="t", file="mine.toml")
    fields.update(kw)
    return Claim(**fields)


def test_every_shipped_claim_uses_known_names():
    from pytest_hpcnet.targets import shipped_vocabularies
    v = Vocabulary(targets=shipped_vocabularies())
    claims = load_claims(sorted(ROOT.glob("suites/*/claims.toml")))
    assert claims
    for claim in claims.values():
        v.check_claim(claim)


def test_the_registry_holds_the_metric_names_the_code_defines():
    from pytest_hpcnet.workloads.qjump import scenarios
    from pytest_hpcnet.workloads import mapreduce, rpc, socket_floor
    defined = {rpc.LATENCY_METRIC, rpc.INTERLEAVED_METRIC, rpc.THROUGHPUT_METRIC, rpc.PEAK_THROUGHPUT_METRIC,
               *socket_floor.METRICS.values(), *(f"{scenarios.METRIC}.{s}" for s in scenarios.STATS),
               *(mapreduce.metric(job) for job in mapreduce.JOBS), mapreduce.MERGE_METRIC}
    assert defined <= vocabulary.METRICS


@pytest.mark.parametrize("kw, match", [
    ({"metric": "rpc.echo.latency"}, "unknown metric 'rpc.echo.latency' (did you mean 'rpc.echo.rtt'?)"),
    ({"baseline": "transprot=tcp"}, "unknown configuration key 'transprot' in 'transprot=tcp' (did you mean "
                                    "'transport'?)"),
    ({"candidate": "transport=verb"}, "unknown transport 'verb' in 'transport=verb' (did you mean 'verbs'?)"),
    ({"candidate": "posx,fsync=none"}, "unknown configuration part 'posx' in 'posx,fsync=none' (did you mean "
                                       "'posix'?)"),
    ({"candidate": "replication=two"}, "replication must be a whole number"),
    ({"markers": ["ib_qrd"]}, "mine.toml: claim 'c': markers: unknown hardware feature 'ib_qrd' "
                              "(did you mean 'ib_qdr'?"),
])
def test_unknown_names_are_refused_with_a_suggestion(kw, match):
    with pytest.raises(ConfigError, match=re.escape(match)) as e:
        _reference().check_claim(_claim(**kw))
    assert "\n" not in str(e.value) and str(e.value).startswith("mine.toml: claim 'c'")


def test_a_files_vocabulary_declares_its_own_metrics_and_configurations(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(textwrap.dedent("""
        [vocabulary]
        metrics = ["my.app.time"]
        configs = ["slow", "cache=on", "cache=off"]

        [[claim]]
        id = "mine"
        statement = "s"
        metric = "my.app.time"
        baseline = "slow,cache=off"
        candidate = "cache=on,transport=shm"
        kind = "ratio"
        direction = "lower"
        max = 1.0
        source = "me"
    """))
    declared: dict = {}
    claims = load_claims([path], vocabulary=declared)
    v = Vocabulary(**declared, targets=[REFERENCE])
    v.check_claim(claims["mine"])
    with pytest.raises(ConfigError, match="unknown cache 'of'.*did you mean 'off'"):
        v.check_config("cache=of", "x")
    path.write_text('[vocabulary]\nmetric = ["x"]\n')
    with pytest.raises(ConfigError, match="unknown key.*metric in \\[vocabulary\\]"):
        load_claims([path])


def test_the_targets_configurations_are_known():
    v = Vocabulary(targets=[REFERENCE, vocabulary_of(load_target("hadoop"))])
    v.check_config("uber=off", "x")
    v.check_config("uber=off,sort.mb=64", "x")
    with pytest.raises(ConfigError, match=re.escape("unknown sort.mb '32' in 'sort.mb=32' (known: 16, 64)")):
        v.check_config("sort.mb=32", "x")


def test_each_target_owns_its_vocabulary():
    """Keys, values and meanings come from the target that names them: the reference's engine keys are
    the engine's own (engine.config.KEYS), its configurations are made from its vocabulary, and the
    Hadoop target's parts are its configurations' names."""
    from pytest_hpcnet.reference.mapreduce.engine import config as engine_config
    for key, spec in engine_config.KEYS.items():
        assert REFERENCE.keys[key] is spec and engine_config.CHOICES[key] == spec.values
    assert all(spec.meaning for spec in REFERENCE.keys.values()) and all(REFERENCE.words.values())
    for name in load_target("reference").configurations():
        ((key, value),) = parse_name(name, "x")
        assert value in REFERENCE.keys[key].values
    hadoop = vocabulary_of(load_target("hadoop"))
    assert hadoop.keys["sort.mb"].values == ("16", "64") and "mapreduce.task.io.sort.mb=16" in \
        hadoop.keys["sort.mb"].meaning
    assert set(hadoop.words) == {"default"}


def test_configuration_names_are_parsed_by_one_parser():
    assert parse_name("transport=shm, posix", "x") == [("transport", "shm"), ("posix", None)]
    assert parse_name("", "x") == []
    for bad, message in [("a=1,,b=2", "has an empty part"), ("intermediate=", "is not key=value"),
                         ("=tcp", "is not key=value")]:
        with pytest.raises(ConfigError, match=message):
            parse_name(bad, "x")
    from pytest_hpcnet.reference.mapreduce.engine.config import parse_config
    with pytest.raises(ConfigError, match="has an empty part"):
        parse_config("transport=tcp,,net=ib")
    with pytest.raises(ConfigError, match="has an empty part"):
        load_target("hadoop").defines("uber=off,,default")


def test_a_config_value_naming_an_unknown_value_is_refused_with_the_known_ones(capsys):
    from pytest_hpcnet.cli import main as hpcnet_main
    hadoop = load_target("hadoop")
    assert hadoop.defines("uber=off,sort.mb=64") == {"mapreduce.job.ubertask.enable": "false",
                                                     "mapreduce.task.io.sort.mb": "64"}
    assert hpcnet_main(["crosscheck", "--config", "default", "--config", "sort.mb=32", "--", "teragen", "1G"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--config: unknown Hadoop configuration 'sort.mb=32': sort.mb '32' is not " \
        "one of 16, 64 (known: default, sort.mb=16, sort.mb=64, uber=off, or -Dkey=value)" in err


@pytest.mark.parametrize("target, baseline, candidate, message", [
    ("reference", "transport=tcp", "transport=carrier",
     "unknown transport 'carrier' in 'transport=carrier' (known: shm, tcp, verbs)"),
    ("hadoop", "default", "sort.mb=32", "unknown sort.mb '32' in 'sort.mb=32' (known: 16, 64)"),
])
def test_a_claims_file_naming_an_unknown_value_is_refused_at_load(pytester, run_hpcnet, target, baseline,
                                                                  candidate, message):
    """At load, before any test: the file, the claim id, and the values the run's targets know."""
    (pytester.path / "mine.toml").write_text(textwrap.dedent(f"""
        [[claim]]
        id = "mine"
        statement = "s"
        metric = "mapreduce.terasort.job_time"
        baseline = "{baseline}"
        candidate = "{candidate}"
        kind = "ratio"
        direction = "lower"
        max = 1.0
        source = "me"
    """))
    pytester.makepyfile("def test_x(): pass")
    result = run_hpcnet("--hpcnet-claims=mine.toml", f"--hpcnet-target={target}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*mine.toml: claim 'mine': {message}*"])
    assert "Traceback" not in result.stderr.str()


def test_an_inventory_feature_is_checked(tmp_path):
    inv = tmp_path / "c.toml"
    inv.write_text('[cluster]\nname = "c"\nworkdir = "/tmp/w"\nfeatures = ["ib_qrd"]\n'
                   '[[nodes]]\nname = "a"\nhost = "127.0.0.1"\n')
    with pytest.raises(ConfigError, match="unknown hardware feature 'ib_qrd' \\(did you mean 'ib_qdr'") as e:
        load_cluster(str(inv), root=tmp_path / "root", where="--hpcnet-cluster")
    assert "\n" not in str(e.value)


def test_a_misspelled_metric_in_a_users_claims_file_stops_the_run(pytester, run_hpcnet):
    (pytester.path / "mine.toml").write_text(textwrap.dedent("""
        [[claim]]
        id = "mine"
        statement = "s"
        metric = "rpc.echo.latency"
        baseline = "transport=tcp"
        candidate = "transport=shm"
        kind = "ratio"
        direction = "lower"
        max = 1.0
        source = "me"
    """))
    pytester.makepyfile("def test_x(): pass")
    result = run_hpcnet("--hpcnet-claims=mine.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*mine.toml: claim 'mine': unknown metric 'rpc.echo.latency' (did you mean "
                                 "'rpc.echo.rtt*"])
    assert "Traceback" not in result.stderr.str()


def test_the_readmes_claims_examples_use_known_names(tmp_path):
    """Each ```toml block of the README with a [[claim]] loads and passes the name checks."""
    blocks = re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    claim_blocks = [b for b in blocks if "[[claim]]" in b]
    assert len(claim_blocks) >= 2
    for i, text in enumerate(claim_blocks):
        path = tmp_path / f"readme{i}.toml"
        path.write_text(text)
        for claim in load_claims([path]).values():
            _reference().check_claim(claim)
