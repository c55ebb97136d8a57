"""TOML inventories: the shipped ones load, and every malformed one fails naming file, node and field."""

from pathlib import Path

import pytest

from pytest_hpcnet.cluster import load_cluster
from pytest_hpcnet.cluster.inventory import load_inventory
from pytest_hpcnet.errors import ConfigError

CLUSTERS = Path(__file__).resolve().parent.parent / "fixtures" / "clusters"

GOOD_NODE = '''
[[nodes]]
name = "a"
host = "localhost"
workdir = "work/a"
'''


def write(tmp_path, text, name="inv.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(tmp_path, text) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    message = str(info.value)
    assert str(path) in message, message  # every error names the file
    return message


# --- the shipped inventories ---

def test_local_inventory_is_four_loopback_nodes_with_relative_dirs_resolved():
    cluster = load_inventory(CLUSTERS / "local.toml")
    assert cluster.names == ("node0", "node1", "node2", "node3")
    assert {n.launcher for n in cluster.nodes} == {"local"}
    assert {n.address("eth") for n in cluster.nodes} == {"127.0.0.1"}
    assert cluster.node("node2").workdir == CLUSTERS / "local-work" / "node2"
    assert len({n.workdir for n in cluster.nodes}) == 4
    assert cluster.shared == CLUSTERS / "local-work" / "shared"
    assert all(n.shared == cluster.shared for n in cluster.nodes)


def test_osu_ri_inventory_describes_the_seed_000_testbed():
    cluster = load_inventory(CLUSTERS / "osu-ri.toml")
    assert cluster.name == "osu-ri"
    assert len(cluster.nodes) == 8
    for node in cluster.nodes:
        assert node.launcher == "ssh"
        assert {"ib_qdr", "rdma", "ipoib", "lustre", "x86_64"} <= node.features
        assert set(node.addresses) == {"eth", "ib"}
        assert node.shared == Path("/lustre/hpcnet")
        assert node.extra["ssh"]["user"] == "hpcnet"


def test_openpower_inventory_describes_the_seed_001_testbed():
    cluster = load_inventory(CLUSTERS / "openpower.toml")
    assert len(cluster.nodes) == 6
    assert sum("datanode" in n.name for n in cluster.nodes) == 5
    for node in cluster.nodes:
        assert {"edr", "rdma", "ipoib", "power8", "ppc64le"} <= node.features
        assert "lustre" not in node.features and node.shared is None


def test_load_cluster_accepts_an_inventory_path(tmp_path):
    cluster = load_cluster(str(CLUSTERS / "osu-ri.toml"), root=tmp_path)
    assert cluster.source == str(CLUSTERS / "osu-ri.toml")


# --- defaults and merging ---

def test_cluster_defaults_are_inherited_and_node_values_win(tmp_path):
    path = write(tmp_path, '''
[cluster]
workdir = "/scratch/x"
features = ["rdma"]
sysroot = "canned"
launcher = "ssh"
[cluster.ssh]
user = "alice"
port = 22

[[nodes]]
name = "a"
host = "a.example"
features = ["lustre"]
[nodes.ssh]
port = 2222
identity_file = "keys/id"

[[nodes]]
name = "b"
host = "b.example"
workdir = "/other"
launcher = "local"
''')
    a, b = load_inventory(path).nodes
    assert a.workdir == Path("/scratch/x") and b.workdir == Path("/other")
    assert a.features == {"rdma", "lustre"} and b.features == {"rdma"}
    assert a.sysroot == tmp_path / "canned"
    assert a.addresses == {"eth": "a.example"}  # default: reach the node at its host name
    assert a.extra == {"ssh": {"user": "alice", "port": 2222, "identity_file": tmp_path / "keys" / "id"}}
    assert a.launcher == "ssh" and b.launcher == "local"
    assert load_inventory(path).name == "inv"  # default name: the file's stem


# --- malformed inventories: (text, words the message must contain: node and field) ---

MALFORMED = {
    "missing field": (GOOD_NODE + '''
[[nodes]]
name = "b"
workdir = "w"
''', ["nodes[1] ('b')", "'host'", "missing"]),
    "missing name": ('''
[[nodes]]
host = "localhost"
workdir = "w"
''', ["nodes[0]", "'name'", "missing"]),
    "unknown launcher": (GOOD_NODE + '''
[[nodes]]
name = "b"
host = "localhost"
workdir = "w"
launcher = "telepathy"
''', ["nodes[1] ('b')", "'launcher'", "telepathy", "local"]),
    "unknown launcher in [cluster]": ('[cluster]\nlauncher = "telepathy"\n' + GOOD_NODE,
                                      ["[cluster]", "'launcher'", "telepathy"]),
    "duplicate name": (GOOD_NODE + GOOD_NODE, ["nodes[1] ('a')", "'name'", "duplicate", "nodes[0]"]),
    "unknown key in node": (GOOD_NODE + 'colour = "blue"\n', ["nodes[0] ('a')", "'colour'", "unknown key"]),
    "unknown key in cluster": ('[cluster]\nnodes_count = 3\n' + GOOD_NODE, ["[cluster]", "'nodes_count'"]),
    "unknown top-level key": ('clusterr = 1\n' + GOOD_NODE, ["'clusterr'", "unknown"]),
    "unknown ssh setting": (GOOD_NODE + '[nodes.ssh]\npassword = "hunter2"\n',
                            ["nodes[0] ('a')", "'ssh.password'", "unknown"]),
    "wrong type": (GOOD_NODE.replace('"localhost"', '42'), ["nodes[0] ('a')", "'host'", "string", "42"]),
    "wrong type of features": (GOOD_NODE + 'features = "rdma"\n', ["nodes[0] ('a')", "'features'", "list"]),
    "wrong type of address": (GOOD_NODE + 'addresses = { eth = 10 }\n', ["nodes[0] ('a')", "'addresses'", "eth"]),
    "boolean port": (GOOD_NODE + '[nodes.ssh]\nport = true\n', ["nodes[0] ('a')", "'ssh.port'", "integer"]),
    "node not a table": ('nodes = [1]\n', ["nodes[0]", "table"]),
    "no nodes": ('[cluster]\nname = "x"\n', ["'nodes'", "at least one"]),
    "empty nodes": ('nodes = []\n', ["'nodes'", "at least one"]),
    "single brackets": ('[nodes]\nname = "a"\n', ["'nodes'", "[[nodes]]"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_inventory_names_node_and_field(tmp_path, case):
    text, words = MALFORMED[case]
    message = load_error(tmp_path, text)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_bad_toml_names_file_and_line(tmp_path):
    message = load_error(tmp_path, GOOD_NODE + "\nhost = = 3\n")
    assert "not valid TOML" in message and "line 7" in message


def test_unreadable_inventory_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read inventory"):
        load_inventory(tmp_path / "missing.toml")


def test_error_carries_the_file_in_where(tmp_path):
    path = write(tmp_path, GOOD_NODE + GOOD_NODE)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.where == str(path)


def test_controller_address_comes_from_the_inventory_and_the_record_says_so(tmp_path):
    path = tmp_path / "inv.toml"
    path.write_text('[cluster]\ncontroller = { eth = "10.0.0.100", ib = "192.168.1.100" }\n' + GOOD_NODE)
    cluster = load_inventory(path)
    assert cluster.controller == {"eth": "10.0.0.100", "ib": "192.168.1.100"}
    assert cluster.controller_source == "inventory: [cluster] controller in inv.toml"
    assert all("controller" not in n.extra for n in cluster.nodes)


def test_controller_address_is_derived_from_the_route_to_the_nodes(tmp_path):
    path = tmp_path / "inv.toml"
    path.write_text(GOOD_NODE)          # host = "localhost": this host reaches it from loopback
    cluster = load_inventory(path)
    assert cluster.controller == {"eth": "127.0.0.1"}
    assert cluster.controller_source.startswith("derived: eth: route to localhost")


def test_a_controller_without_addresses_is_refused(tmp_path):
    path = tmp_path / "inv.toml"
    path.write_text('[cluster]\ncontroller = {}\n' + GOOD_NODE)
    with pytest.raises(ConfigError, match=r"\[cluster\], field 'controller'"):
        load_inventory(path)


def test_python_key_is_inherited_and_a_node_may_name_its_own(tmp_path):
    cluster = load_inventory(write(tmp_path, """
        [cluster]
        launcher = "slurm"
        workdir = "/scratch"
        python = "/opt/venv/bin/python"
        [cluster.slurm]
        partition = "batch"
        connect_timeout = 5
        [[nodes]]
        name = "a"
        host = "a.example"
        [[nodes]]
        name = "b"
        host = "b.example"
        python = "/usr/bin/python3.11"
    """))
    assert [n.python for n in cluster.nodes] == ["/opt/venv/bin/python", "/usr/bin/python3.11"]
    assert cluster.nodes[0].extra["slurm"] == {"partition": "batch", "connect_timeout": 5}


def test_slurm_outside_an_allocation_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(ConfigError, match="inside a Slurm allocation"):
        load_cluster("slurm", tmp_path)


def test_node_argv_swaps_the_controllers_interpreter_for_the_nodes():
    import sys
    from pytest_hpcnet.cluster.launcher import node_argv
    from pytest_hpcnet.cluster.model import Node
    node = Node(name="a", host="h", addresses={}, workdir=Path("/w"), python="/opt/py")
    assert node_argv(node, [sys.executable, "-m", "x"]) == ["/opt/py", "-m", "x"]
    assert node_argv(node, ["sh", sys.executable]) == ["sh", sys.executable]
    plain = Node(name="a", host="h", addresses={}, workdir=Path("/w"))
    assert node_argv(plain, [sys.executable]) == [sys.executable]


def test_config_features_of_verbs_configurations():
    from pytest_hpcnet.hardware import config_features
    assert config_features("transport=tcp,net=ib", "transport=verbs,net=ib") == ["pyverbs", "rdma"]
    assert config_features("transport=tcp,net=eth") == []
