"""TestDFSIO conformance: formulas, the printed block and result file, every test type, read-back
verification, bad options, and what happens when a datanode dies mid-write.

``test_write_then_read_blocks_on_the_target`` is written against the ``target`` fixture and runs on
every target (the reference block store; Hadoop's TestDFSIO on MiniDFS under ``--hpcnet-target
hadoop``); the others drive the reference implementation directly and skip under another target.
Sizes are tiny (CI is a 2-core box); block sizes are scaled down so files span several blocks.
"""

import re

import pytest

from pytest_hpcnet.cli import main as hpcnet_main
from pytest_hpcnet.reference.dfs.errors import DfsError, DfsWriteError
from pytest_hpcnet.workloads.dfsio import (DfsioError, DfsioResult, FsTarget, TaskResult,
                                           parse_dfsio_args, run_dfsio)

MB = 1 << 20
BLOCK = 512 * 1024
LABELS = ["----- TestDFSIO ----- : ", "            Date & time: ", "        Number of files: ",
          " Total MBytes processed: ", "      Throughput mb/sec: ", " Average IO rate mb/sec: ",
          "  IO rate std deviation: ", "     Test exec time sec: "]
NUMBER = r"(\d+(\.\d{1,2})?|\.\d{1,2})"


def dfsio(args, tmp_path):
    return parse_dfsio_args([*args, "-resFile", str(tmp_path / "TestDFSIO_results.log")])


def posix(workdirs, fsync="none"):
    return FsTarget("posix", root="local", fsync=fsync, node_dirs=workdirs)


def test_formulas_hand_computed_example():
    # Rates 32 and 16 MB/s; 128 MB over 6 task-seconds.
    r = DfsioResult("read", [TaskResult("a", 64 * MB, 2000.0), TaskResult("b", 64 * MB, 4000.0)], 4500.0)
    block = r.block()
    assert " Total MBytes processed: 128\n" in block
    assert "      Throughput mb/sec: 21.33\n" in block
    assert " Average IO rate mb/sec: 24\n" in block
    assert "  IO rate std deviation: 8\n" in block
    assert "     Test exec time sec: 4.5\n" in block


def test_write_then_read_blocks_on_the_target(target, tmp_path):
    """The block the target's TestDFSIO prints has the layout and figures Hadoop 3.4's does (labels,
    ``#.##`` numbers, files x size MB), the result file is appended per run, write then read complete."""
    res = tmp_path / "TestDFSIO_results.log"
    for kind in ("-write", "-read"):
        result = target.dfsio([kind, "-nrFiles", "3", "-size", "1MB"], res_file=res)
        assert result.records == 3 and result.details["total_mb"] == 3
    blocks = [b for b in res.read_text().split("\n\n") if b.strip()]
    assert len(blocks) == 2
    for block, kind in zip(blocks, ("write", "read")):
        lines = block.strip("\n").split("\n")
        assert len(lines) == 8
        for line, label in zip(lines, LABELS):
            assert line.startswith(label), line
        assert lines[0] == f"----- TestDFSIO ----- : {kind}"
        assert lines[2].endswith(": 3") and lines[3].endswith(": 3")
        for line in lines[4:8]:
            assert re.fullmatch(NUMBER, line.split(": ", 1)[1]), line


def test_write_block_layout_and_result_file(launchers, cluster, workdirs, tmp_path, measure):
    opts = dfsio(["-write", "-nrFiles", str(2 * len(cluster.nodes)), "-size", "512KB"], tmp_path)
    result = run_dfsio(opts, posix(workdirs, "close"), launchers, cluster)
    measure.record(*result.measurements("fs=posix:local,fsync=close"))
    block = result.block()
    lines = block.split("\n")
    assert len(lines) == 10 and lines[-2:] == ["", ""]          # 8 lines, an empty line, newline
    for line, label in zip(lines, LABELS):
        assert line.startswith(label)
    assert lines[0] == "----- TestDFSIO ----- : write"
    assert re.fullmatch(r"\w{3} \w{3} \d\d \d\d:\d\d:\d\d \S+ \d{4}", lines[1][len(LABELS[1]):])
    assert lines[2] == f"        Number of files: {2 * len(cluster.nodes)}"
    assert lines[3] == f" Total MBytes processed: {len(cluster.nodes)}"
    for line in lines[4:8]:
        assert re.fullmatch(NUMBER, line.split(": ", 1)[1])
    assert (tmp_path / "TestDFSIO_results.log").read_text() == block
    assert {t.node for t in result.tasks} == set(cluster.names)   # spread over every node
    assert all(t.size == 512 * 1024 for t in result.tasks)
    assert result.config == {"fs": "posix:local", "fsync": "close"}
    again = run_dfsio(opts.with_(test_type="read"), posix(workdirs), launchers, cluster, verify=True)
    assert (tmp_path / "TestDFSIO_results.log").read_text() == block + again.block()   # appended


def test_read_back_verification_catches_a_flipped_byte(launchers, cluster, workdirs, tmp_path):
    opts = dfsio(["-write", "-nrFiles", "1", "-size", "256KB", "-bufferSize", "65536"], tmp_path)
    run_dfsio(opts, posix(workdirs), launchers, cluster)
    path = workdirs[cluster.nodes[0].name] / "io_data" / "test_io_0"
    raw = bytearray(path.read_bytes())
    raw[100_000] ^= 0x01
    path.write_bytes(raw)
    with pytest.raises(DfsioError, match=r"test_io_0 on node0 failed: .*byte 100000 is 0x"):
        run_dfsio(opts.with_(test_type="read"), posix(workdirs), launchers, cluster, verify=True)


def test_every_test_type_on_the_block_store(launchers, cluster, blockstore, tmp_path):
    target = FsTarget("blockstore", store=blockstore.spec(replication=min(2, len(cluster.nodes)),
                                                          block_size=BLOCK))
    n = len(cluster.nodes)

    def run(*args, **kw):
        return run_dfsio(dfsio(["-nrFiles", str(n), *args], tmp_path), target, launchers, cluster, seed=1, **kw)

    assert {t.size for t in run("-write", "-size", "1200KB").tasks} == {1200 * 1024}
    assert {t.size for t in run("-read", "-size", "1200KB", verify=True).tasks} == {1200 * 1024}
    rnd = run("-read", "-random", "-size", "600KB", "-bufferSize", "100000", verify=True)
    assert all(t.size >= 600 * 1024 for t in rnd.tasks) and rnd.test_type == "random read"
    back = run("-read", "-backward", "-size", "1200KB", "-bufferSize", "100000", verify=True)
    assert all(t.size >= 1200 * 1024 for t in back.tasks)
    # skip read: 0, then +bufferSize+skipSize: reads at 0, 300000, 600000, 900000, 1200000 (short).
    skip = run("-read", "-skip", "-skipSize", "200000B", "-bufferSize", "100000", "-size", "10MB", verify=True)
    assert {t.size for t in skip.tasks} == {4 * 100000 + (1200 * 1024 - 1200000)}
    assert {t.size for t in run("-append", "-size", "100KB").tasks} == {100 * 1024}
    assert {t.size for t in run("-truncate", "-size", "1000KB").tasks} == {300 * 1024}
    assert run("-clean") is None
    client = blockstore.client()
    assert client.listing("/benchmarks/TestDFSIO") == []
    client.close()


def test_compression_round_trip(launchers, cluster, workdirs, tmp_path):
    for codec in ("zlib", "gzip", "bz2"):
        w = run_dfsio(dfsio(["-write", "-size", "300KB", "-compression", codec], tmp_path), posix(workdirs),
                      launchers, cluster)
        r = run_dfsio(dfsio(["-read", "-size", "300KB", "-compression", codec], tmp_path), posix(workdirs),
                      launchers, cluster, verify=True)
        assert w.tasks[0].size == r.tasks[0].size == 300 * 1024
        on_disk = (workdirs[cluster.nodes[0].name] / "io_data" / "test_io_0").stat().st_size
        assert on_disk < 300 * 1024 // 10                      # the pattern compresses well
        assert w.config["compression"] == codec


def test_flipped_byte_in_a_block_store_replica_fails_the_read(launchers, cluster, blockstore, tmp_path):
    target = FsTarget("blockstore", store=blockstore.spec(replication=1, block_size=BLOCK))
    run_dfsio(dfsio(["-write", "-size", "700KB"], tmp_path), target, launchers, cluster)
    (blk,) = [p for d in blockstore.dirs.values() for p in (d / "data").glob("blk_*[0-9]")
              if p.stat().st_size == BLOCK]
    raw = bytearray(blk.read_bytes())
    raw[1234] ^= 0x80
    blk.write_bytes(raw)
    with pytest.raises(DfsioError, match=r"ChecksumError: .*checksum mismatch in the chunk at byte 1024"):
        run_dfsio(dfsio(["-read", "-size", "700KB"], tmp_path), target, launchers, cluster)


def test_datanode_killed_mid_write(cluster, blockstore):
    """With replicas left, the pipeline recovers and the file reads back verified; with none left,
    the write fails with a clear error and the file stays unreadable -- never short or corrupt."""
    if len(cluster.nodes) < 2:
        pytest.skip(f"needs two datanodes, cluster {cluster.source} has {len(cluster.nodes)}")
    data = bytes(range(256)) * (3 * BLOCK // 256)
    client = blockstore.client(replication=min(3, len(cluster.nodes)), block_size=BLOCK)
    try:
        out = client.create("/kill/recovers")
        out.write(data[:BLOCK // 3])
        victim = out.pipeline.targets[-1]["name"]
        blockstore.kill_datanode(victim)
        out.write(data[BLOCK // 3:])
        out.close()
        assert victim in [name for name, _ in out.failures]
        assert client.open("/kill/recovers").read() == data
        for b in client.meta("get", path="/kill/recovers")["blocks"]:
            assert victim not in [loc["name"] for loc in b["locations"]]

        out = client.create("/kill/fails", replication=1)
        out.write(data[:1000])
        blockstore.kill_datanode(out.pipeline.targets[0]["name"])
        with pytest.raises(DfsWriteError, match="no datanode left"):
            out.write(data)
            out.close()
        out.abort()
        with pytest.raises(DfsError, match="under construction"):
            client.open("/kill/fails")
    finally:
        client.close()


@pytest.mark.parametrize("args,message", [
    (["-random"], "hpcnet dfsio: TestDFSIO: -random must follow -read"),
    (["-write", "-size", "12QB"], "hpcnet dfsio: -size: '12QB': unsupported unit 'QB'"),
    (["-write", "-nrFiles", "many"], "hpcnet dfsio: -nrFiles: 'many' is not a whole number"),
    (["-write", "--fs", "posix:relative"], "hpcnet dfsio: --fs: 'posix:relative': the posix directory"),
    (["-write", "--fsync", "maybe", "--fs", "posix:/tmp"], "hpcnet dfsio: --fsync: unknown fsync policy"),
    (["-write", "--replication", "2", "--fs", "posix:/tmp"], "hpcnet dfsio: --replication: applies to --fs blockstore only"),
    (["-write", "--fs", "blockstore", "--transport", "carrier-pigeon"], "hpcnet dfsio: blockstore transport: unknown transport"),
    (["-write", "--bogus"], "hpcnet dfsio: unknown option '--bogus'"),
    (["-write", "--fs"], "hpcnet dfsio: --fs: needs a value"),
    (["-write", "--fs", "blockstore", "--replication", "4"], "hpcnet dfsio: --replication: 4 is outside 1..3"),
])
def test_bad_options_one_line_exit_2(args, message, capsys):
    assert hpcnet_main(["dfsio", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(message) and err.count("\n") == 1
