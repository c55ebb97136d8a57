"""Named engine configurations: parsing, canonical names, and clear errors for bad combinations."""

import pytest

from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference.mapreduce.engine.config import EngineConfig, check_runnable, parse_config


def test_defaults_and_canonical_name():
    assert parse_config("") == EngineConfig()
    assert parse_config("shuffle=direct, intermediate=shared,transport=shm").name == \
        "transport=shm,intermediate=shared,shuffle=direct,net=eth"
    assert parse_config(parse_config("transport=shm").name) == parse_config("transport=shm")


@pytest.mark.parametrize("text,message", [
    ("shuffle=direct", "shuffle=direct .* needs intermediate=shared"),
    ("transport=udp", "transport='udp' is not one of tcp, shm, verbs"),
    ("colour=red", "unknown key 'colour'"),
    ("transport=tcp,transport=shm", "'transport' is given twice"),
    ("transport", "'transport' in 'transport' is not key=value"),
    ("intermediate=", "is not key=value"),
])
def test_bad_configurations_name_the_text(text, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_config(text, where="claims.toml: claim 'x' baseline")
    assert str(info.value).startswith("claims.toml: claim 'x' baseline: ")


def test_runnable_checks(tmp_path):
    cluster = local_cluster(2, tmp_path)
    check_runnable(parse_config("transport=shm,intermediate=shared,shuffle=direct"), cluster)
    check_runnable(parse_config("transport=verbs"), cluster)   # whether nodes have RDMA: their workers say
    with pytest.raises(ConfigError, match=r"net=ib but node\(s\) node0, node1 have no 'ib' address"):
        check_runnable(parse_config("net=ib"), cluster)
    no_shared = cluster.__class__(name="x", nodes=cluster.nodes, source="x", shared=None)
    with pytest.raises(ConfigError, match="needs a shared dir"):
        check_runnable(parse_config("intermediate=shared"), no_shared)
