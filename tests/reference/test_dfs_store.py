"""The block store as processes: pipeline writes, verified reads, datanode failure, garbage."""

import os
import socket
import struct
import time

import pytest

from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.pool import Launchers
from pytest_hpcnet.reference import auth, native
from pytest_hpcnet.reference.dfs.blockfiles import SYNC_BEHIND
from pytest_hpcnet.reference.dfs.errors import ChecksumError, DfsError, DfsWriteError
from pytest_hpcnet.reference.dfs.store import BlockStore
from pytest_hpcnet.reference.transport import get_transport

KB = 1024
BLOCK = 256 * KB          # scaled down from 128 MB so a small file spans several blocks


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    return local_cluster(3, tmp_path_factory.mktemp("dfs-cluster"))


@pytest.fixture(scope="module")
def launchers(cluster, tmp_path_factory):
    with Launchers(cluster, tmp_path_factory.mktemp("dfs-logs")) as ls:
        yield ls


# (transport, datanode impls): native and Python datanodes, alone and mixed in one pipeline (a native
# head forwarding to a Python stage and the reverse; node order is pipeline order for a local writer)
STORES = {
    "tcp-native": ("tcp", "native"),
    "tcp-python": ("tcp", "python"),
    "tcp-mixed": ("tcp", {"node0": "native", "node1": "python", "node2": "native"}),
    "shm": ("shm", "python"),
}


@pytest.fixture(scope="module", params=list(STORES))
def store(request, launchers, cluster, tmp_path_factory):
    transport, impl = STORES[request.param]
    if "native" in str(impl) and not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    root = tmp_path_factory.mktemp(f"dfs-{request.param}")
    with BlockStore(launchers, cluster, transport=transport, impl=impl,
                    dirs={n.name: root / n.name for n in cluster.nodes}).start() as st:
        yield st


@pytest.fixture
def client(store):
    impl = "python" if "native" not in store.impls.values() else None   # the Python store: a Python writer
    with store.client(replication=3, block_size=BLOCK, packet_size=16 * KB, impl=impl) as c:
        yield c


def _write(client, path, data, piece=100_000, **kw):
    with client.create(path, **kw) as out:
        for i in range(0, len(data), piece):
            out.write(data[i:i + piece])
    return out


def test_round_trip_pread_truncate_append(client):
    data = os.urandom(3 * BLOCK + 12345)
    _write(client, "/t/f", data)
    info = client.meta("get", path="/t/f")
    assert info["length"] == len(data) and len(info["blocks"]) == 4
    assert all(len(b["locations"]) == 3 for b in info["blocks"])
    assert client.open("/t/f").read() == data
    src = client.open("/t/f")
    assert src.pread(BLOCK - 10, 20) == data[BLOCK - 10:BLOCK + 10]    # across a block boundary
    assert src.pread(len(data) - 5, 100) == data[-5:] and src.pread(len(data), 10) == b""
    client.truncate("/t/f", BLOCK + 1000)
    assert client.open("/t/f").read() == data[:BLOCK + 1000]
    with client.append("/t/f") as out:
        out.write(b"tail")
    assert client.open("/t/f").read() == data[:BLOCK + 1000] + b"tail"
    _write(client, "/t/empty", b"")
    assert client.open("/t/empty").read() == b""
    assert client.delete("/t", recursive=True) == 2 and not client.exists("/t/f")


def _replica_files(store, block_id):
    return [d / "data" / f"blk_{block_id}" for d in store.dirs.values()
            if (d / "data" / f"blk_{block_id}").exists()]


def test_flipped_byte_on_disk_is_caught_and_other_replica_serves(store, client):
    data = os.urandom(BLOCK)
    _write(client, "/c/one", data, replication=1)
    block = client.meta("get", path="/c/one")["blocks"][0]
    (path,) = _replica_files(store, block["id"])
    raw = bytearray(path.read_bytes())
    raw[70_000] ^= 0x40
    path.write_bytes(raw)
    with pytest.raises(ChecksumError, match=rf"block {block['id']} .*chunk at byte 69632"):
        client.open("/c/one").read()
    _write(client, "/c/two", data, replication=2)
    block = client.meta("get", path="/c/two")["blocks"][0]
    first, second = _replica_files(store, block["id"])
    raw = bytearray(first.read_bytes())
    raw[5] ^= 0x01
    first.write_bytes(raw)
    assert client.open("/c/two").read() == data          # verified, from the good replica


def test_sequential_reads_in_any_pieces_go_on_from_the_same_byte_on_another_replica(store, client):
    """read()/readinto() in pieces of any size across packets and blocks; a replica whose third 1 MiB
    packet fails its checksum mid-stream is dropped and the read goes on from the same byte on the
    other replica (the native client streams each block from one request)."""
    big = 3 << 20                                        # three read packets a block
    data = os.urandom(2 * big + 3000)
    _write(client, "/s/f", data, replication=2, block_size=big)
    src = client.open("/s/f")
    got = bytearray()
    for n in (1, 511, 70_000, big, 5):
        got += src.read(n)
    got += src.read()
    assert got == data and src.read(10) == b""
    block = client.meta("get", path="/s/f")["blocks"][0]
    first = block["locations"][0]["name"]                # the replica a reader without a node tries first
    path = store.dirs[first] / "data" / f"blk_{block['id']}"
    raw = bytearray(path.read_bytes())
    raw[(5 << 19) + 7] ^= 0x20                           # 2.5 MiB in: the third packet
    path.write_bytes(raw)
    src, got, buf = client.open("/s/f"), bytearray(), bytearray(100_000)
    while n := src.readinto(buf):
        got += buf[:n]
    src.close()
    assert got == data
    if src._sequential is not None:                     # the native stream met the bad packet mid-block
        assert [f"block {block['id']} on datanode {first}: checksum mismatch in the chunk at byte "
                f"{5 << 19} (CRC32C per 512 bytes)"] == list(map(str, src._sequential.failed[block["id"]]))


def test_datanode_killed_mid_write_pipeline_recovers(launchers, cluster, tmp_path):
    with BlockStore(launchers, cluster, transport="tcp",
                    dirs={n.name: tmp_path / n.name for n in cluster.nodes}).start() as st, \
            st.client(replication=3, block_size=BLOCK, packet_size=16 * KB) as c:
        data = os.urandom(2 * BLOCK)
        out, victim = st.write_killing(c, "/k/f", data, BLOCK // 2, position=1)   # the middle
        assert [name for name, _ in out.failures] == [victim]
        blocks = c.meta("get", path="/k/f")["blocks"]
        assert all(victim not in [loc["name"] for loc in b["locations"]] for b in blocks)
        assert all(len(b["locations"]) == 2 for b in blocks)
        assert c.open("/k/f").read() == data              # read-back after recovery verifies
        # The head of the pipeline dies too: the last survivor carries on.
        out, head = st.write_killing(c, "/k/g", data, 1000, position=0)
        assert head in [name for name, _ in out.failures]
        assert c.open("/k/g").read() == data


def test_last_datanode_killed_fails_cleanly_never_short(launchers, cluster, tmp_path):
    with BlockStore(launchers, cluster, transport="shm",
                    dirs={n.name: tmp_path / n.name for n in cluster.nodes}).start() as st, \
            st.client(replication=1, block_size=BLOCK, packet_size=16 * KB) as c:
        out = c.create("/k/f")
        out.write(b"x" * 50_000)
        st.kill_datanode(out.pipeline.targets[0]["name"])
        with pytest.raises(DfsWriteError, match="no datanode left in the pipeline.*left unclosed"):
            out.write(b"y" * BLOCK)
            out.close()
        out.abort()
        with pytest.raises(DfsError, match="under construction"):
            c.open("/k/f")


def _until_eof(sock) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_garbage_on_a_datanode_connection_is_dropped_and_logged(store, client):
    name, proc = next(iter(store.datanodes.items()))
    address = client.meta("datanodes")["datanodes"][name]
    if store.transport == "tcp":
        with socket.create_connection(tuple(address), timeout=5) as s:   # a stranger: refused unserved
            s.sendall(b"\xff\xff\xff\xffGET / HTTP/1.1\r\n\r\n")
            assert _until_eof(s).startswith(auth.MAGIC)       # the challenge, then the door shuts
        conn = auth.connect(get_transport("tcp"), address, timeout=5)   # authenticated garbage
        conn.send_raw(b"\xff\xff\xff\xffGET / HTTP/1.1\r\n\r\n")
        with pytest.raises(Exception):
            conn.recv(timeout=5)
        conn.close()
    conn = auth.connect(get_transport(store.transport), address, timeout=5)
    conn.send([struct.pack(">I", 3) + b"{x]"])             # a frame whose header is not JSON
    with pytest.raises(Exception):
        conn.recv(timeout=5)
    conn.close()
    deadline = time.monotonic() + 5
    while "header is not JSON" not in proc.output()[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    log = proc.output()[1]
    assert "header is not JSON" in log
    if store.transport == "tcp":
        assert "exceeds the limit" in log and "refused" in log
    assert proc.poll() is None
    meta = auth.connect(get_transport("tcp"), store.meta_address, timeout=5)   # the metadata service too
    meta.send_raw(struct.pack(">I", 5) + b"\x00\x00\x00\x01!")
    with pytest.raises(Exception):
        meta.recv(timeout=5)
    meta.close()
    assert store.meta.poll() is None
    data = os.urandom(20_000)                              # and they keep serving
    _write(client, "/g/f", data)
    assert client.open("/g/f").read() == data


@pytest.mark.parametrize("impl", ["native", "python"])
def test_failure_while_draining_the_last_acks_of_a_block(launchers, cluster, tmp_path, monkeypatch, impl):
    """All of a block's packets are sent, then the tail dies before acknowledging: the recovered
    pipeline must be drained too before the block is committed. (The stream once committed right
    after the resend; on a loaded machine the close then reset the connection and lost packets.
    Whether that shows depends on timing, so the stream now also refuses to commit a block whose
    acknowledged length is short of what it sent.)"""
    from pytest_hpcnet.reference.dfs import pipeline

    if impl == "native" and not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    cls = pipeline.pipeline_class(impl)
    with BlockStore(launchers, cluster, transport="tcp", impl=impl,
                    dirs={n.name: tmp_path / n.name for n in cluster.nodes}).start() as st, \
            st.client(replication=3, block_size=BLOCK, packet_size=16 * KB, impl=impl) as c:
        killed = []
        real_drain = cls.drain

        def drain_after_killing_the_tail(self):
            if not killed:
                killed.append(self.targets[-1]["name"])
                st.kill_datanode(killed[0])
            return real_drain(self)

        monkeypatch.setattr(cls, "drain", drain_after_killing_the_tail)
        data = os.urandom(BLOCK + 5000)
        out = _write(c, "/d/f", data)
        monkeypatch.undo()
        assert c.open("/d/f").read() == data
        first, *rest = c.meta("get", path="/d/f")["blocks"]
        # The block being drained: the pipeline dropped the dead tail -- unless the tail had finished
        # the block and acknowledged it before the kill reached it (seen on a loaded box); then it holds
        # the complete replica and is rightly listed.
        if killed[0] in [loc["name"] for loc in first["locations"]]:
            replica = tmp_path / killed[0] / "data" / f"blk_{first['id']}"
            assert replica.stat().st_size == BLOCK, (out.failures, replica)
        for b in rest:
            assert killed[0] not in [loc["name"] for loc in b["locations"]]


def _cached_prefix(path) -> int:
    """How many bytes from the start of ``path`` are in the page cache after asking the kernel to drop
    its clean pages (a dirty page stays until it is written back): 0 for a file on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            return os.preadv(fd, [bytearray(os.fstat(fd).st_size)], 0, os.RWF_NOWAIT)
        except BlockingIOError:
            return 0
    finally:
        os.close(fd)


@pytest.mark.parametrize("impl", ["native", "python"])
def test_sync_on_close_datanodes_put_every_replica_on_the_disk_before_the_last_ack(launchers, cluster, tmp_path,
                                                                                    impl):
    """With ``sync_on_close`` (HDFS's dfs.datanode.synconclose) a closed file's replicas are on the disk
    when the client's close returns: none of their pages is dirty, so the kernel drops them all. The
    block is larger than SYNC_BEHIND, so its writeback also started while it was written."""
    if impl == "native" and not native.AVAILABLE:
        pytest.skip(native.WHY_NOT)
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(64 * KB))
    with open(probe, "rb+") as f:
        os.fsync(f.fileno())
    try:
        cached = _cached_prefix(probe)
    except OSError as e:        # RWF_NOWAIT unsupported there
        pytest.skip(f"the file system under {tmp_path} cannot say which pages are cached: {e}")
    if cached:
        pytest.skip(f"the file system under {tmp_path} keeps clean pages (tmpfs?): it cannot show a sync")
    data = os.urandom(SYNC_BEHIND + BLOCK + 5000)
    with BlockStore(launchers, cluster, transport="tcp", impl=impl, sync_on_close=True,
                    dirs={n.name: tmp_path / n.name for n in cluster.nodes}).start() as st, \
            st.client(replication=2, block_size=2 * SYNC_BEHIND, impl=impl) as c:
        _write(c, "/s/f", data)
        blocks = c.meta("get", path="/s/f")["blocks"]
        replicas = [tmp_path / loc["name"] / "data" / f"blk_{b['id']}{suffix}"
                    for b in blocks for loc in b["locations"] for suffix in ("", ".meta")]
        assert len(replicas) == 2 * 2
        assert {str(r): _cached_prefix(r) for r in replicas} == {str(r): 0 for r in replicas}
        assert c.open("/s/f").read() == data
