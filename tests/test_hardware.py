"""The hardware probe: canned trees give exactly their features, the rules behind them, cluster probing."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_hpcnet import cli, hardware
from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.launcher import LocalLauncher
from pytest_hpcnet.errors import ConfigError

TREES = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"

EXPECTED = {
    "qdr-westmere": {"ib", "ib_qdr", "rdma", "ipoib", "x86_64", "lustre"},
    "edr-power8": {"ib", "edr", "rdma", "ipoib", "ppc64le", "power8"},
    "roce": {"roce", "rdma", "eth_100g", "x86_64"},
    "plain-eth": {"eth_10g", "x86_64", "kvm"},
}


@pytest.fixture
def launcher(tmp_path):
    started = LocalLauncher(tmp_path / "logs")
    yield started
    started.close()


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def ib_port(dev="mlx4_0", port=1, rate="40 Gb/sec (4X QDR)", link="InfiniBand", state="4: ACTIVE"):
    base = f"sys/class/infiniband/{dev}/ports/{port}"
    return {f"{base}/rate": rate + "\n", f"{base}/link_layer": link + "\n", f"{base}/state": state + "\n"}


def netdev(name, type_, speed=None, physical=True, operstate="up"):
    base = f"sys/class/net/{name}"
    files = {f"{base}/type": f"{type_}\n", f"{base}/operstate": operstate + "\n"}
    if speed is not None:
        files[f"{base}/speed"] = f"{speed}\n"
    if physical:
        files[f"{base}/device/vendor"] = "0x15b3\n"
    return files


# --- canned trees ------------------------------------------------------------------------------------

@pytest.mark.parametrize("tree", sorted(EXPECTED))
def test_each_canned_tree_gives_exactly_its_features(tree):
    assert hardware.probe(TREES / tree) == EXPECTED[tree]


def test_every_tree_in_the_fixtures_dir_is_covered():
    assert {p.name for p in TREES.iterdir() if p.is_dir()} == set(EXPECTED)


def test_catalogue_names_every_feature_the_probe_can_give():
    required = {"ib", "ib_sdr", "ib_ddr", "ib_qdr", "ib_fdr", "edr", "hdr", "ndr", "roce", "rdma", "ipoib",
                "eth_10g", "eth_25g", "eth_40g", "eth_100g", "x86_64", "aarch64", "ppc64le", "power8",
                "power9", "lustre", "netns", "kvm"}
    assert required <= set(hardware.FEATURES)
    assert all(isinstance(d, str) and d and "\n" not in d for d in hardware.FEATURES.values())
    for features in EXPECTED.values():
        assert features <= set(hardware.FEATURES)


def test_describe_westmere_facts():
    facts = hardware.describe(TREES / "qdr-westmere")
    assert facts["cpu"]["model"] == "Intel(R) Xeon(R) CPU E5630 @ 2.53GHz"
    assert (facts["cpu"]["logical_cpus"], facts["cpu"]["cores"], facts["cpu"]["sockets"]) == (8, 8, 2)
    assert 23 * 2**30 < facts["memory_bytes"] < 24 * 2**30 + 1
    assert facts["lustre_mounts"] == [{"source": "192.168.10.1@o2ib:/lustre", "mountpoint": "/lustre"}]
    [port] = facts["rdma_ports"]
    assert (port["device"], port["port"], port["gbps"], port["lanes"], port["lane_speed"], port["state"]) == (
        "mlx4_0", "1", 40.0, 4, "QDR", "ACTIVE")
    json.dumps(facts)  # the facts travel as JSON


def test_describe_power8_lists_the_down_port_and_machine():
    facts = hardware.describe(TREES / "edr-power8")
    assert {(p["device"], p["state"]) for p in facts["rdma_ports"]} == {("mlx5_0", "ACTIVE"), ("mlx5_1", "DOWN")}
    assert facts["cpu"]["arch"] == "ppc64le" and facts["cpu"]["power_generation"] == 8
    assert facts["cpu"]["machine"] == "PowerNV 8335-GTA"
    assert 250 * 2**30 < facts["memory_bytes"] <= 256 * 2**30


# --- the rules, on small trees ----------------------------------------------------------------------

@pytest.mark.parametrize("state", ["1: DOWN", "2: INIT", "3: ARMED"])
def test_a_port_that_is_not_active_gives_no_fabric_feature(tmp_path, state):
    assert hardware.probe(write_tree(tmp_path, ib_port(state=state))) == frozenset()


@pytest.mark.parametrize("rate, cls", [
    ("10 Gb/sec (4X SDR)", "ib_sdr"), ("20 Gb/sec (4X DDR)", "ib_ddr"), ("56 Gb/sec (4X FDR)", "ib_fdr"),
    ("200 Gb/sec (4X HDR)", "hdr"), ("100 Gb/sec (2X HDR)", "hdr"), ("400 Gb/sec (4X NDR)", "ndr"),
    ("40 Gb/sec (4X FDR10)", None), ("garbage", None),
])
def test_ib_speed_class_comes_from_the_lane_speed_word(tmp_path, rate, cls):
    expected = {"ib", "rdma"} | ({cls} if cls else set())
    assert hardware.probe(write_tree(tmp_path, ib_port(rate=rate))) == expected


def test_roce_port_gets_no_ib_speed_class(tmp_path):
    tree = write_tree(tmp_path, ib_port(dev="rxe0", rate="10 Gb/sec (1X QDR)", link="Ethernet"))
    assert hardware.probe(tree) == {"roce", "rdma"}


@pytest.mark.parametrize("speed, physical, expected", [
    (25000, True, {"eth_25g"}), (40000, True, {"eth_40g"}), (100000, True, {"eth_100g"}),
    (10000, True, {"eth_10g"}), (10000, False, set()),  # veth claims 10000 Mb/s
    (1000, True, set()), (50000, True, set()), (-1, True, set()), (None, True, set()),
])
def test_ethernet_speed_classes_are_exact_and_physical_only(tmp_path, speed, physical, expected):
    assert hardware.probe(write_tree(tmp_path, netdev("eth0", 1, speed, physical))) == expected


def test_ipoib_needs_type_32_and_not_down(tmp_path):
    assert hardware.probe(write_tree(tmp_path / "up", netdev("ib0", 32))) == {"ipoib"}
    assert hardware.probe(write_tree(tmp_path / "down", netdev("ib0", 32, operstate="down"))) == set()
    assert hardware.probe(write_tree(tmp_path / "lo", netdev("lo", 772, 10000))) == set()


@pytest.mark.parametrize("cpuinfo, expected", [
    ("processor\t: 0\ncpu\t\t: POWER9, altivec supported\n\nplatform\t: PowerNV\n", {"ppc64le", "power9"}),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\n",
     {"aarch64"}),
    ("processor\t: 0\nCPU architecture: 7\n", set()),  # 32-bit ARM
    ("processor\t: 0\nmodel name\t: Intel(R) Pentium(R) M\nflags\t\t: fpu sse sse2\n", set()),  # no lm
    ("", set()),
])
def test_cpu_arch_and_model_from_cpuinfo(tmp_path, cpuinfo, expected):
    assert hardware.probe(write_tree(tmp_path, {"proc/cpuinfo": cpuinfo})) == expected


def test_lustre_mount_points_are_unescaped_and_other_types_ignored(tmp_path):
    mounts = ("mds@o2ib:/fs /mnt/my\\040lustre lustre rw 0 0\n"
              "server:/export /mnt/nfs nfs4 rw 0 0\n")
    tree = write_tree(tmp_path, {"proc/mounts": mounts})
    assert hardware.describe(tree)["lustre_mounts"] == [{"source": "mds@o2ib:/fs", "mountpoint": "/mnt/my lustre"}]
    assert hardware.probe(tree) == {"lustre"}


def test_empty_tree_has_no_features(tmp_path):
    assert hardware.probe(tmp_path) == frozenset()


def test_real_root_probe_gives_only_catalogued_names():
    # Whatever this machine has, the probe must not invent names the plugin has no marker for.
    assert hardware.probe(Path("/")) <= set(hardware.FEATURES)


# --- the command a node runs --------------------------------------------------------------------------

def test_module_prints_features_and_facts_as_json():
    out = subprocess.run([sys.executable, "-m", "pytest_hpcnet.hardware", "--root", str(TREES / "roce")],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    doc = json.loads(out)
    assert set(doc["features"]) == EXPECTED["roce"]
    assert doc["facts"]["rdma_ports"][0]["link_layer"] == "Ethernet"


def test_module_rejects_a_missing_root(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest_hpcnet.hardware", "--root", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a directory" in done.stderr and done.stdout == ""


# --- probing a cluster ---------------------------------------------------------------------------------

def test_probe_cluster_returns_each_nodes_features(tmp_path, launcher):
    cluster = local_cluster(2, tmp_path / "c", sysroot=TREES / "qdr-westmere")
    declared = replace(cluster.nodes[1], features=frozenset({"netns"}))
    cluster = replace(cluster, nodes=(cluster.nodes[0], declared))
    probes = hardware.probe_cluster(cluster, launcher, timeout=60)
    assert list(probes) == ["node0", "node1"]
    assert probes["node0"].error is None and probes["node0"].features == EXPECTED["qdr-westmere"]
    assert probes["node1"].features == EXPECTED["qdr-westmere"] | {"netns"}
    assert probes["node1"].declared == {"netns"}
    assert probes["node0"].facts["cpu"]["logical_cpus"] == 8
    assert launcher.live_pids() == []


def test_a_node_whose_probe_cannot_start_gets_an_error_and_declared_features(tmp_path, launcher):
    cluster = local_cluster(2, tmp_path / "c", sysroot=TREES / "plain-eth", features={"lustre"})
    probes = hardware.probe_cluster(cluster, launcher, python=str(tmp_path / "no-such-python"))
    for name, probe in probes.items():
        assert probe.error.startswith(f"{name}: cannot start")
        assert probe.features == {"lustre"}


def test_a_probe_that_exits_nonzero_names_the_node(tmp_path, launcher):
    cluster = local_cluster(2, tmp_path / "c", sysroot=TREES / "roce")
    broken = replace(cluster.nodes[1], sysroot=tmp_path / "missing-tree")
    probes = hardware.probe_cluster(replace(cluster, nodes=(cluster.nodes[0], broken)), launcher)
    assert probes["node0"].error is None and probes["node0"].features == EXPECTED["roce"]
    assert probes["node1"].error.startswith("node1: hardware probe exited with status 2")
    assert "not a directory" in probes["node1"].error
    assert probes["node1"].features == frozenset()


def fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


def test_a_probe_past_the_deadline_is_killed_and_reported(tmp_path, launcher):
    cluster = local_cluster(1, tmp_path / "c")
    probes = hardware.probe_cluster(cluster, launcher, timeout=0.5, python=fake_python(tmp_path, "exec sleep 30"))
    assert probes["node0"].error == "node0: hardware probe did not finish in 0.5s"
    assert launcher.live_pids() == []


@pytest.mark.parametrize("output", ["not json", '{"features": "ib", "facts": {}}', '{"facts": {}}',
                                    '{"features": [1], "facts": {}}', '{"features": [], "facts": []}'])
def test_unreadable_probe_output_is_an_error_not_a_crash(tmp_path, launcher, output):
    cluster = local_cluster(1, tmp_path / "c")
    python = fake_python(tmp_path, f"cat <<'EOF'\n{output}\nEOF")
    probes = hardware.probe_cluster(cluster, launcher, python=python)
    assert probes["node0"].error.startswith("node0: hardware probe printed unreadable output")


def test_missing_lists_the_nodes_lacking_each_feature():
    probes = {"node0": hardware.NodeProbe("node0", frozenset({"ib", "ib_qdr"})),
              "node1": hardware.NodeProbe("node1", frozenset({"ib"})),
              "node2": hardware.NodeProbe("node2", frozenset())}
    lacking = hardware.missing(["ib_qdr", "ib", "ib_qdr"], probes)
    assert lacking == {"ib": ["node2"], "ib_qdr": ["node1", "node2"]}
    assert hardware.missing(["ib"], {"node0": probes["node0"]}) == {}
    assert hardware.skip_reason({"ib_qdr": ["node1", "node2"]}) == "requires ib_qdr, missing on node1, node2"


def test_unknown_feature_names_are_a_config_error_naming_where():
    assert hardware.check_feature_names(["ib_qdr", "lustre"], "--hpcnet-assume") == {"ib_qdr", "lustre"}
    with pytest.raises(ConfigError) as err:
        hardware.check_feature_names(["ib_qdr", "qdr"], "inventory.toml, [cluster], field 'features'")
    message = str(err.value)
    assert message.startswith("inventory.toml, [cluster], field 'features': unknown hardware feature 'qdr'")
    assert "did you mean 'ib_qdr'" in message


# --- hpcnet probe ---------------------------------------------------------------------------------------

def test_hpcnet_probe_prints_a_table_with_the_features(capsys):
    assert cli.main(["probe", "--root", str(TREES / "edr-power8")]) == 0
    out = capsys.readouterr().out
    header, _, row = out.splitlines()[:3]
    assert header.split()[:3] == ["node", "arch", "cpu"] and "probe error" in header
    assert row.startswith("node0") and "ppc64le" in row and "POWER8" in row
    assert " ".join(sorted(EXPECTED["edr-power8"])) in row


def test_hpcnet_probe_json_on_two_nodes(capsys):
    assert cli.main(["probe", "--cluster", "local:2", "--root", str(TREES / "qdr-westmere"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {name: set(p["features"]) for name, p in doc.items()} == {
        "node0": EXPECTED["qdr-westmere"], "node1": EXPECTED["qdr-westmere"]}
    assert doc["node0"]["error"] is None


def test_hpcnet_probe_bad_root_is_one_line_and_status_2(tmp_path, capsys):
    assert cli.main(["probe", "--root", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpcnet probe: --root: ") and "not a directory" in err
