"""The datanode packet pipeline in the native core against the Python one: the checksums agree, the
two interoperate in one pipeline both ways, a corrupt chunk is caught and reported in one line, and
hostile packets after a valid write request do not take a datanode down."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import zlib
from pathlib import Path

import pytest

from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference import auth, native
from pytest_hpcnet.reference.dfs import checksums
from pytest_hpcnet.reference.dfs.errors import ChecksumError, DfsError
from pytest_hpcnet.reference.dfs.native import resolve_impl
from pytest_hpcnet.reference.dfs.store import BlockStore
from pytest_hpcnet.reference.dfs.wire import decode, encode
from pytest_hpcnet.reference.transport import get_transport
from pytest_hpcnet.reference.transport.verbs import native as native_verbs
from pytest_hpcnet.workloads.dfsio.pipeline_cost import pipeline_cpu_ms_per_mb, pipeline_on_one_core

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason=native.WHY_NOT)
KB = 1024
BLOCK = 256 * KB


# -- checksums -------------------------------------------------------------------------------------

def test_crc32c_reference_check_value_and_known_vectors():
    assert checksums.crc32c(b"123456789") == 0xE3069283
    assert checksums.crc32c(bytes(32)) == 0x8A9136AA           # RFC 3720 B.4: 32 bytes of zeros
    assert checksums.crc32c(b"\xff" * 32) == 0x62A8AB43        # ... and of ones


@needs_native
@pytest.mark.parametrize("kind", checksums.KINDS)
@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 4096, 65536 + 7])
def test_native_and_python_checksums_agree(kind, size):
    data = os.urandom(size)
    native_sums = checksums.chunk_sums(memoryview(bytearray(data)), 512, kind)
    assert native_sums == checksums.chunk_sums(data, 512, kind, impl="python")
    assert len(native_sums) == 4 * -(-size // 512)
    if kind == "crc32" and size:
        assert native_sums[:4] == zlib.crc32(data[:512]).to_bytes(4, "big")


@needs_native
@pytest.mark.parametrize("size", [0, 7, 512, 1300, 65536 + 3])
def test_the_crc32c_instruction_floor_computes_the_same_sums(size):
    """The checksum gate's floor does the work the path does: the XOR of every chunk's CRC32C."""
    from pytest_hpcnet.workloads.dfsio.pipeline_cost import checksum_path
    if not native.core.crc32c_instruction_floor_available():
        pytest.skip("no SSE4.2 crc32 instruction on this CPU")
    data = os.urandom(size)
    sums = checksums.chunk_sums(data, 512, "crc32c", impl="python")
    want = 0
    for i in range(0, len(sums), 4):
        want ^= int.from_bytes(sums[i:i + 4], "big")
    assert checksum_path("crc32c", "floor")(memoryview(data)) == want
    with pytest.raises(ValueError, match="computes CRC32C, not crc32"):
        checksum_path("crc32", "floor")
    with pytest.raises(ValueError, match="bytes per checksum must be positive"):
        native.core.crc32c_instruction_floor(data, 0)


@needs_native
@pytest.mark.parametrize("which", ["write", "read"])
def test_the_block_floors_run_through_and_keep_nothing(tmp_path, which):
    """bench_blockstore.py's floors: every byte through a verifying loopback pipeline (into the
    directory, to one receiver or a chain of three, or out of a replica the read floor writes there
    first), figures for both sides, and no file left behind; bad input is one line each."""
    floor = getattr(native.core, f"block_{which}_floor")
    seconds, sender, receiver = floor(str(tmp_path), 3 * 65536 + 1000)
    assert seconds > 0 and sender >= 0 and receiver >= 0
    assert list(tmp_path.iterdir()) == []
    floor(str(tmp_path), 5000, 1024, 512, "crc32")
    if which == "write":     # three receivers in a chain, as the datanodes of a replication-3 pipeline
        seconds, sender, receivers = floor(str(tmp_path), 3 * 65536 + 1000, replicas=3)
        assert seconds > 0 and sender >= 0 and receivers >= 0
        assert list(tmp_path.iterdir()) == []
        for replicas in (0, 17):
            with pytest.raises(ValueError, match=f"takes 1 to 16 replicas, not {replicas}"):
                floor(str(tmp_path), 1000, replicas=replicas)
    for args, error, match in [((str(tmp_path), 0), ValueError, "needs bytes"),
                               ((str(tmp_path), 10, 0), ValueError, "needs bytes"),
                               ((str(tmp_path), 10, 700), ValueError, "packet of whole chunks"),
                               ((str(tmp_path), 10, 512, 0), ValueError, "bytes per checksum must be positive"),
                               ((str(tmp_path), 10, 512, 512, "md5"), ValueError, "unknown checksum type"),
                               ((str(tmp_path / "gone"), 10), OSError, f"the block-{which} floor: .*gone.*No such file")]:
        with pytest.raises(error, match=match) as e:
            floor(*args)
        assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("impl", [None, "python"])
def test_verify_names_the_first_bad_chunk_in_one_line(impl):
    if impl is None and not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    data = bytearray(os.urandom(2000))
    sums = checksums.chunk_sums(data, 512, "crc32c", impl=impl)
    checksums.verify(data, sums, 512, "block 9", 1024, "crc32c", impl=impl)
    data[1500] ^= 1
    with pytest.raises(ChecksumError) as e:
        checksums.verify(data, sums, 512, "block 9", 1024, "crc32c", impl=impl)
    assert str(e.value) == "block 9: checksum mismatch in the chunk at byte 2048 (CRC32C per 512 bytes)"
    with pytest.raises(ChecksumError, match="12 checksum bytes for 2000 data bytes"):
        checksums.verify(data, sums[:12], 512, "block 9", 0, "crc32c", impl=impl)
    with pytest.raises(ChecksumError):                         # CRC32 sums are not CRC32C sums
        checksums.verify(bytes(data), checksums.chunk_sums(bytes(data), 512, "crc32", impl=impl), 512,
                         "b", 0, "crc32c", impl=impl)


@needs_native
def test_a_read_into_a_read_only_buffer_is_refused_in_one_line():
    with socket.create_server(("127.0.0.1", 0)) as listener:   # a tcp socket, as the reader takes
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    try:
        for into in (b"\0" * 16, memoryview(bytearray(32))[::2]):
            with pytest.raises(ValueError, match="^into must be a writable contiguous buffer$"):
                native.core.read_block_into(a.fileno(), into, 0, "block 1 on d1", 1.0)
            with pytest.raises(ValueError, match="^into must be a writable contiguous buffer$"):
                native.core.BlockReader(a.fileno(), 0, "block 1 on d1", 1.0).readinto(into)
    finally:
        a.close()
        b.close()


def test_impl_choice_is_checked():
    assert resolve_impl("python", "tcp") == "python"
    assert resolve_impl(None, "shm") == "python"
    with pytest.raises(ConfigError, match="unknown implementation"):
        resolve_impl("fortran", "tcp")
    if native.AVAILABLE:
        assert resolve_impl(None, "tcp") == "native"
        with pytest.raises(ConfigError, match="speaks tcp and verbs, not shm"):
            resolve_impl("native", "shm")
        why = native_verbs.unavailable()
        if why is None:   # where the native verbs end runs (the guest), verbs is native's too
            assert resolve_impl(None, "verbs") == "native"
        else:             # elsewhere verbs stays Python's, and asking for native says why
            assert resolve_impl(None, "verbs") == "python"
            with pytest.raises(ConfigError, match="the native verbs end cannot run here"):
                resolve_impl("native", "verbs")


# -- datanodes as processes --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return local_cluster(2, tmp_path_factory.mktemp("dfs-native-cluster"))


@pytest.fixture(scope="module")
def launchers(cluster, tmp_path_factory):
    with Launchers(cluster, tmp_path_factory.mktemp("dfs-native-logs")) as ls:
        yield ls


PIPELINES = {"native-native": ("native", "native"), "native-python": ("native", "python"),
             "python-native": ("python", "native"), "python-python": ("python", "python")}


@pytest.fixture(scope="module", params=list(PIPELINES))
def store(request, launchers, cluster, tmp_path_factory):
    """Two datanodes, head (node0) and tail (node1) of every pipeline a writer on node0 starts."""
    head, tail = PIPELINES[request.param]
    if "native" in (head, tail) and not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    root = tmp_path_factory.mktemp(f"dfs-{request.param}")
    with BlockStore(launchers, cluster, transport="tcp", impl={"node0": head, "node1": tail},
                    dirs={n.name: root / n.name for n in cluster.nodes}).start() as st:
        yield st


@pytest.mark.parametrize("writer", ["native", "python"])
@pytest.mark.parametrize("kind", checksums.KINDS)
def test_native_and_python_stages_interoperate(store, kind, writer):
    """Every writer (the client's pipeline end) with every head and tail, both checksum types."""
    if writer == "native" and not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    data = os.urandom(2 * BLOCK + 5000)
    with store.client(replication=2, block_size=BLOCK, packet_size=16 * KB, node="node0",
                      checksum=kind, impl=writer) as c:
        with c.create(f"/x/{kind}") as out:
            for i in range(0, len(data), 70_000):   # pieces across packet and block boundaries
                out.write(data[i:i + 70_000])
            out.write(data[:0])
        info = c.meta("get", path=f"/x/{kind}")
        assert [loc["name"] for loc in info["blocks"][0]["locations"]] == ["node0", "node1"]
        assert c.open(f"/x/{kind}").read() == data
        assert [b["length"] for b in info["blocks"]] == [BLOCK, BLOCK, 5000]
        for loc in info["blocks"][0]["locations"]:        # each replica read alone, verified
            assert c.read_block(loc, info["blocks"][0], 0, BLOCK) == data[:BLOCK]
        with c.create(f"/x/{kind}-exact") as out:         # one write of exactly two blocks
            out.write(data[:2 * BLOCK])
        assert c.open(f"/x/{kind}-exact").read() == data[:2 * BLOCK]
        assert [b["length"] for b in c.meta("get", path=f"/x/{kind}-exact")["blocks"]] == [BLOCK, BLOCK]
    magic = {"crc32c": b"HPCC", "crc32": b"HPCB"}[kind]
    block = info["blocks"][-1]["id"]
    for name in ("node0", "node1"):
        meta = (store.dirs[name] / "data" / f"blk_{block}.meta").read_bytes()
        assert meta[:4] == magic and len(meta) == 16 + 4 * -(-5000 // 512)


def _setup(address, block: int, kind: str = "crc32c"):
    conn = auth.connect(get_transport("tcp"), address, timeout=10)
    conn.send(encode({"op": "write_block", "block": block, "gen": 1, "offset": 0, "bpc": 512, "index": 0,
                      "targets": [], "checksum": kind}), timeout=10)
    ack = _recv(conn)
    assert ack == {"op": "ack", "seq": -1, "status": "ok"}, ack
    return conn


def _recv(conn, timeout=10.0) -> dict:
    msg = conn.recv(timeout=timeout)
    try:
        return decode(msg.view)[0]
    finally:
        msg.release()


def _packet(seq, offset, data, last, kind="crc32c", sums=None):
    sums = checksums.chunk_sums(data, 512, kind) if sums is None else sums
    return encode({"op": "packet", "seq": seq, "offset": offset, "len": len(data), "last": last}, sums, data)


def _address(store, name="node0"):
    with store.client() as c:
        return tuple(c.meta("datanodes")["datanodes"][name])


def _alive_and_serving(store):
    assert all(p.poll() is None for p in store.datanodes.values())
    data = os.urandom(40_000)
    with store.client(replication=2, block_size=BLOCK, node="node0") as c:
        with c.create("/alive") as out:
            out.write(data)
        assert c.open("/alive").read() == data


def test_a_corrupt_chunk_is_detected_and_reported_in_one_line(store):
    address = _address(store)
    conn = _setup(address, 770001)
    good = os.urandom(1024)
    conn.send(_packet(0, 0, good, False))
    assert _recv(conn) == {"op": "ack", "seq": 0, "status": "ok"}
    bad = bytearray(os.urandom(2048))
    sums = checksums.chunk_sums(bad, 512)
    bad[1300] ^= 0x10                                    # in the chunk at byte 1024 + 1024
    conn.send(_packet(1, 1024, bytes(bad), True, sums=sums))
    ack = _recv(conn)
    conn.close()
    assert ack["status"] == "error" and ack["bad"] == 0
    assert ack["reason"] == ("datanode node0 block 770001: checksum mismatch in the chunk at byte 2048 "
                             "(CRC32C per 512 bytes)")
    data_dir = store.dirs["node0"] / "data"
    deadline = time.monotonic() + 10                      # dropped as the stream ends, just after the ack
    while list(data_dir.glob("*770001*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(data_dir.glob("*770001*"))            # the replica was dropped, no partial file
    _alive_and_serving(store)


def test_a_replica_short_of_its_checksums_fails_a_read_in_one_line_and_the_datanode_serves_on(store):
    """A stored replica whose meta file lost its tail: the datanode sends the packets it has checksums
    for, then an error naming where they ran out; the reader raises it in one line, and the datanode
    still serves the part it can (native and Python datanodes alike)."""
    data = os.urandom(3 << 20)
    with store.client(replication=1, block_size=4 << 20, node="node0") as c:
        with c.create("/short-meta") as out:
            out.write(data)
        block = c.meta("get", path="/short-meta")["blocks"][0]
        loc = block["locations"][0]
        meta = store.dirs[loc["name"]] / "data" / f"blk_{block['id']}.meta"
        with open(meta, "r+b") as f:
            f.truncate(16 + 4 * ((3 << 19) // 512))       # checksums for the first 1.5 MiB only
        with pytest.raises(DfsError, match=rf"datanode {loc['name']}: DfsError: block {block['id']}: stored "
                                           r"checksums are short at 1048576") as e:
            c.read_block(loc, block, 0, len(data))     # 1 MiB read packets: the second has none
        assert "\n" not in str(e.value)
        assert c.read_block(loc, block, 1000, 1 << 20) == data[1000:1000 + (1 << 20)]
    _alive_and_serving(store)


def _frame(parts) -> bytes:
    body = b"".join(parts)
    return struct.pack(">I", len(body)) + body


HOSTILE = {
    "huge length": struct.pack(">I", 0xFFFFFFF0) + b"x" * 16,
    "header not JSON": struct.pack(">I", 7) + struct.pack(">I", 3) + b"{x]",
    "header longer than the message": struct.pack(">I", 8) + struct.pack(">I", 1000) + b"{}{}",
    "another op": _frame(encode({"op": "read_block", "seq": 0, "len": 0})),
    "len beyond the payload": _frame(encode({"op": "packet", "seq": 0, "offset": 0, "len": 99}, b"abc")),
    "negative len": _frame(encode({"op": "packet", "seq": 0, "offset": 0, "len": -4}, b"abcd")),
    "seq not a number": _frame(encode({"op": "packet", "seq": "one", "offset": 0, "len": 0})),
    "wrong checksum count": _frame(encode({"op": "packet", "seq": 0, "offset": 0, "len": 600}, bytes(604))),
}


@pytest.mark.parametrize("what", list(HOSTILE))
def test_hostile_packets_end_the_stream_not_the_datanode(store, what):
    conn = _setup(_address(store), 770100 + list(HOSTILE).index(what))
    conn.send_raw(HOSTILE[what])
    with pytest.raises(Exception):                        # no ok ack: an error ack, then the close
        while True:
            reply = _recv(conn, timeout=10)
            assert reply.get("status") != "ok", reply
    conn.close()
    _alive_and_serving(store)


def test_a_packet_out_of_place_is_refused(store):
    conn = _setup(_address(store), 770200)
    conn.send(_packet(0, 512, b"x" * 10, True))           # the replica has 0 bytes, not 512
    with pytest.raises(Exception):
        while True:
            assert _recv(conn).get("status") != "ok"
    conn.close()
    assert not list((store.dirs["node0"] / "data").glob("blk_770200*"))
    _alive_and_serving(store)


def _threads(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="this platform cannot pin threads to a CPU")
def test_a_pipeline_is_pinned_to_one_cpu_and_let_go_after(store, monkeypatch):
    """The CPU-time gate's pinning: this thread and every datanode thread on one CPU inside the block,
    each datanode's CPUs given back after; nothing pinned where a datanode is not a process here."""
    with store.client(replication=2, block_size=BLOCK, packet_size=16 * KB, node="node0") as c:
        replies = [c._dn_request({"name": n, "address": a}, {"op": "cpu"})
                   for n, a in c.meta("datanodes")["datanodes"].items()]
        pids = [int(r["process"].split(":")[1]) for r in replies]
        before = {pid: os.sched_getaffinity(pid) for pid in pids}
        mine = os.sched_getaffinity(0)
        with pipeline_on_one_core(c) as pinned:
            assert pinned
            cpu = os.sched_getaffinity(0)
            assert len(cpu) == 1
            assert pipeline_cpu_ms_per_mb(c, "/pinned", 1, 2) > 0
            for pid in pids:
                assert {frozenset(os.sched_getaffinity(t)) for t in _threads(pid)} == {frozenset(cpu)}
        assert os.sched_getaffinity(0) == mine
        for pid in pids:
            assert {frozenset(os.sched_getaffinity(t)) for t in _threads(pid)} == {frozenset(before[pid])}

        real = c._dn_request
        monkeypatch.setattr(c, "_dn_request", lambda node, header: {**real(node, header), "process": "elsewhere:1:1"})
        with pipeline_on_one_core(c) as pinned:
            assert not pinned and os.sched_getaffinity(0) == mine
