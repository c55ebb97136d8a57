"""The block store's metadata logic and on-disk block format, without processes."""

import os

import pytest

from pytest_hpcnet.reference.dfs import blockfiles
from pytest_hpcnet.reference.dfs.blockfiles import BlockDir
from pytest_hpcnet.reference.dfs.errors import ChecksumError, DfsError, NoSuchFile, ProtocolError
from pytest_hpcnet.reference.dfs.namespace import Namespace
from pytest_hpcnet.reference.dfs.wire import chunk_crcs, decode, encode, verify_chunks


def _ns(tmp_path, n=4):
    ns = Namespace(tmp_path / "ns.json")
    for i in range(n):
        ns.register(f"node{i}", ["127.0.0.1", 1000 + i])
    return ns


def test_placement_is_local_first_then_rotates_over_the_others(tmp_path):
    ns = _ns(tmp_path)
    firsts = [ns.place(3, "node2", ()) for _ in range(3)]
    assert all(p[0] == "node2" and len(set(p)) == 3 for p in firsts)
    assert len({tuple(p[1:]) for p in firsts}) == 3           # spread, not always the same pair
    assert "node1" not in ns.place(3, "node1", exclude=["node1"])
    assert len(ns.place(3, None, ())) == 3
    assert ns.place(3, None, exclude=["node0", "node1", "node2"]) == ["node3"]   # fewer than asked
    with pytest.raises(DfsError, match="no live datanode"):
        ns.place(1, None, exclude=[f"node{i}" for i in range(4)])


def test_file_lifecycle_and_persistence(tmp_path):
    ns = _ns(tmp_path)
    ns.create("/d/f", 2, 1024, overwrite=False)
    b = ns.add_block("/d/f", "node0")["block"]
    with pytest.raises(DfsError, match="under construction"):
        ns.get("/d/f")                                        # an unclosed file is not readable
    with pytest.raises(DfsError, match="stale"):
        ns.commit_block("/d/f", b["id"], b["gen"] + 1, 1024, ["node0"])
    assert ns.bump_gen("/d/f", b["id"])["gen"] == 2
    ns.commit_block("/d/f", b["id"], 2, 1024, ["node0", "node1"])
    ns.add_block("/d/f", "node0")                             # allocated, never written: dropped
    ns.complete("/d/f")
    again = Namespace(tmp_path / "ns.json")                   # a restarted service sees the file
    again.register("node0", ["127.0.0.1", 1])
    info = again.get("/d/f")
    assert info["length"] == 1024 and len(info["blocks"]) == 1
    assert [loc["name"] for loc in info["blocks"][0]["locations"]] == ["node0"]   # node1 not live
    with pytest.raises(DfsError, match="file exists"):
        again.create("/d/f", 1, 1024, overwrite=False)
    with pytest.raises(NoSuchFile):
        again.get("/nope")
    with pytest.raises(DfsError, match="replication"):
        again.create("/d/g", 4, 1024, overwrite=False)


def test_truncate_plan_cuts_one_block_and_drops_the_rest(tmp_path):
    ns = _ns(tmp_path)
    ns.create("/f", 1, 100, overwrite=True)
    for _ in range(3):
        b = ns.add_block("/f", None)["block"]
        ns.commit_block("/f", b["id"], b["gen"], 100, ["node0"])
    ns.complete("/f")
    plan = ns.truncate("/f", 150)
    assert plan["cut"]["length"] == 50 and [d["id"] for d in plan["drop"]] == [3]
    assert ns.get("/f")["length"] == 150
    assert ns.truncate("/f", 100)["cut"] is None
    with pytest.raises(DfsError, match="cannot truncate"):
        ns.truncate("/f", 101)


def test_delete_recursive_and_listing(tmp_path):
    ns = _ns(tmp_path)
    for p in ("/a/x", "/a/y", "/ab"):
        ns.create(p, 1, 10, overwrite=True)
        ns.complete(p)
    assert ns.listing("/a")["files"] == ["/a/x", "/a/y"]
    assert ns.delete("/a", recursive=True)["deleted"] == 2
    assert ns.listing("/")["files"] == ["/ab"]


def test_block_files_store_crcs_resume_truncate_and_detect_a_flip(tmp_path):
    bd = BlockDir(tmp_path)
    data = bytes(range(256)) * 10                             # 2560 bytes = 5 chunks of 512
    w = bd.open_writer(7, gen=1, bpc=512, offset=0)
    w.write(data[:1024], chunk_crcs(data[:1024]))
    w.finish()
    w = bd.open_writer(7, gen=2, bpc=512, offset=512)         # a pipeline restart at 512
    w.write(data[512:], chunk_crcs(data[512:]))
    w.finish()
    assert bd.header(7) == (2, 512) and bd.length(7) == len(data)
    got = b"".join(d for _, d, c in bd.read(7, 0, len(data), 1024))
    assert got == data
    for start, d, c in bd.read(7, 700, 100, 1024):
        assert start == 512                                   # aligned down to a chunk
        verify_chunks(d, c, 512, "b7", start)
    bd.truncate(7, 1000)
    (start, d, c), = bd.read(7, 0, 1000, 4096)
    verify_chunks(d, c, 512, "b7")                            # the partial last chunk got a new CRC
    raw = bytearray(bd.data_path(7).read_bytes())
    raw[600] ^= 0x01
    bd.data_path(7).write_bytes(raw)
    (start, d, c), = bd.read(7, 0, 1000, 4096)
    with pytest.raises(ChecksumError, match="chunk at byte 512"):
        verify_chunks(d, c, 512, "b7")
    with pytest.raises(DfsError, match="not a chunk boundary"):
        bd.open_writer(7, 3, 512, 100)
    with pytest.raises(DfsError, match="outside"):
        list(bd.read(7, 900, 200, 4096))
    assert bd.delete(7) and not bd.delete(7)


@pytest.mark.parametrize("sync", [False, True])
def test_sync_on_close_starts_writeback_behind_the_writes_and_syncs_both_files_then_the_directory(tmp_path, monkeypatch, sync):
    """HDFS's dfs.datanode.synconclose: the data and meta files are synced while open, under their
    temporary names, and the directory after the renames; off (the default) nothing is synced."""
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    started = []
    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(blockfiles, "SYNC_BEHIND", 1500)
    monkeypatch.setattr(blockfiles, "start_writeback", lambda fd, offset, length: started.append((offset, length)))
    bd = BlockDir(tmp_path, sync_on_close=sync)
    w = bd.open_writer(3, gen=1, bpc=512, offset=0)
    for _ in range(3):
        w.write(b"x" * 1000, chunk_crcs(b"x" * 1000))
    tdata, tmeta = bd.tmp_paths(3)
    w.finish()
    assert synced == ([str(tdata), str(tmeta), str(tmp_path)] if sync else [])
    # writeback starts behind the writes once 1500 bytes are unsynced (HDFS's sync.behind.writes)
    assert started == ([(0, 2000)] if sync else [])
    assert bd.length(3) == 3000 and not tdata.exists()


def test_wire_messages_and_garbage():
    header, payload = decode(memoryview(b"".join(encode({"op": "x", "n": 1}, b"abc"))))
    assert header == {"op": "x", "n": 1} and bytes(payload) == b"abc"
    for junk in (b"", b"\x00\x00\x00\x09{}", b"\x00\x00\x00\x02zz", b"\x00\x00\x00\x02[]"):
        with pytest.raises(ProtocolError):
            decode(memoryview(junk))
