"""How a datanode keeps blocks on disk: ``blk_<id>`` holds the data, ``blk_<id>.meta`` a small header
(magic, generation stamp, bytes per checksum) followed by one big-endian CRC per chunk. The magic names
the checksum type: ``HPCC`` CRC-32C, ``HPCB`` CRC-32 (the first format, before CRC-32C)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from pathlib import Path

from .errors import DfsError, NoSuchFile
from . import checksums

_META = struct.Struct(">4sQI")
META_BASE = _META.size      # where a meta file's checksums start
MAGICS = {"crc32c": b"HPCC", "crc32": b"HPCB"}
KIND_OF_MAGIC = {m: k for k, m in MAGICS.items()}
SYNC_BEHIND = 8 << 20          # a replica synced on close starts writeback every so many bytes
_SYNC_FILE_RANGE_WRITE = 2     # <linux/fs.h>: start writeback of the range's dirty pages, do not wait
_libc = ctypes.CDLL(None, use_errno=True)
_libc.sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Queue the writeback of a file range's dirty pages without waiting for it (``sync_file_range``
    with SYNC_FILE_RANGE_WRITE, which Python's os module lacks); a failure only means none starts."""
    _libc.sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


class BlockDir:
    """A datanode's replicas under ``root``. ``sync_on_close`` is HDFS's ``dfs.datanode.synconclose``:
    a replica is made final only once its data, its checksums and its new names are on the disk
    (``fsync`` of both files, then of the directory after the renames). Off, as in HDFS, a final
    replica may still sit in the page cache: a crash of the host, not of the datanode, can lose it.
    A replica that will be synced also starts its writeback every ``SYNC_BEHIND`` bytes as it is
    written (HDFS's dfs.datanode.sync.behind.writes), so the sync on close finds little left to do:
    in ``bench_blockstore.py --size-mb 128 --fsync``, three runs each taking turns with and without
    it, a native replication-1 write ran at 973-1156 MiB/s (run medians) against 783-938 without."""

    def __init__(self, root: Path, sync_on_close: bool = False):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.sync_on_close = bool(sync_on_close)

    def data_path(self, block_id: int) -> Path:
        return self.root / f"blk_{int(block_id)}"

    def meta_path(self, block_id: int) -> Path:
        return self.root / f"blk_{int(block_id)}.meta"

    def header(self, block_id: int) -> tuple[int, int]:
        """(generation stamp, bytes per checksum) of a stored block."""
        return self.info(block_id)[:2]

    def checksum(self, block_id: int) -> str:
        """The checksum type of a stored block."""
        return self.info(block_id)[2]

    def info(self, block_id: int) -> tuple[int, int, str]:
        """(generation stamp, bytes per checksum, checksum type) of a stored block."""
        try:
            with open_nofollow(self.meta_path(block_id)) as f:
                magic, gen, bpc = _META.unpack(f.read(_META.size))
        except FileNotFoundError:
            raise NoSuchFile(f"block {block_id} is not stored here") from None
        except struct.error:
            raise DfsError(f"block {block_id}: meta file is truncated") from None
        if magic not in KIND_OF_MAGIC:
            raise DfsError(f"block {block_id}: meta file has a bad magic number")
        return gen, bpc, KIND_OF_MAGIC[magic]

    def length(self, block_id: int) -> int:
        try:
            return os.stat(self.data_path(block_id), follow_symlinks=False).st_size
        except FileNotFoundError:
            raise NoSuchFile(f"block {block_id} is not stored here") from None

    # -- replicas being written ----------------------------------------------------------------------
    def tmp_paths(self, block_id: int) -> tuple[Path, Path]:
        """Where a replica under construction lives until ``BlockWriter.finish`` renames it into place."""
        return (self.root / f".blk_{int(block_id)}.tmp", self.root / f".blk_{int(block_id)}.meta.tmp")

    def open_writer(self, block_id: int, gen: int, bpc: int, offset: int,
                    checksum: str = checksums.DEFAULT) -> "BlockWriter":
        return BlockWriter(self, block_id, gen, bpc, offset, checksum=checksum)

    def remove_tmp(self, block_id: int) -> None:
        for p in self.tmp_paths(block_id):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def clean_tmp(self) -> int:
        """Remove every replica left under construction (a datanode restart: nobody resumes them)."""
        n = 0
        for p in self.root.glob(".blk_*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                n += 1
        return n

    def stored_gen(self, block_id: int) -> int | None:
        """Generation stamp of the finalized replica, or None if there is none."""
        try:
            return self.header(block_id)[0]
        except NoSuchFile:
            return None

    def read(self, block_id: int, offset: int, length: int, packet: int):
        """Yield (start, data, crcs) of the packets covering [offset, offset+length), starts aligned
        to chunks, each at most ``packet`` bytes of whole chunks (the native core's
        ``serve_block_read`` frames a reply the same way)."""
        _, bpc = self.header(block_id)
        end = offset + length
        packet = max(bpc, packet - packet % bpc)
        with self.open_range(block_id, offset, length) as (data, meta, size):
            pos = offset - offset % bpc
            while pos < end:
                n_chunks = (min(packet, end - pos) + bpc - 1) // bpc
                n = min(n_chunks * bpc, size - pos)      # whole chunks, so the CRCs cover them
                crcs = os.pread(meta.fileno(), 4 * n_chunks, META_BASE + 4 * (pos // bpc))
                if len(crcs) != 4 * n_chunks:
                    raise DfsError(f"block {block_id}: stored checksums are short at {pos}")
                buf = os.pread(data.fileno(), n, pos)
                if len(buf) != n:
                    raise DfsError(f"block {block_id}: stored data is short at {pos}")
                yield pos, buf, crcs
                pos += n

    @contextlib.contextmanager
    def open_range(self, block_id: int, offset: int, length: int):
        """The stored replica's open data and meta files and its length, for a read of ``length``
        bytes at ``offset`` checked to lie inside it (DfsError otherwise). Its checksums start at
        ``META_BASE`` in the meta file."""
        with contextlib.ExitStack() as files:
            try:
                data = files.enter_context(open_nofollow(self.data_path(block_id)))
                meta = files.enter_context(open_nofollow(self.meta_path(block_id)))
            except FileNotFoundError:
                raise NoSuchFile(f"block {block_id} is not stored here") from None
            size = os.fstat(data.fileno()).st_size
            if offset < 0 or length < 0 or offset + length > size:
                raise DfsError(f"block {block_id}: read of {length} bytes at {offset} is outside its "
                               f"{size} bytes")
            yield data, meta, size

    def truncate(self, block_id: int, length: int) -> None:
        """Cut a finalized replica to ``length`` bytes: the prefix is copied to a new replica that
        replaces the old one atomically (never cut in place: a reader sees the old or the new)."""
        gen, bpc, kind = self.info(block_id)
        size = self.length(block_id)
        if not 0 <= length <= size:
            raise DfsError(f"block {block_id}: cannot truncate {size} bytes to {length}")
        full = length - length % bpc
        writer = BlockWriter(self, block_id, gen, bpc, full, replace_gen=gen, checksum=kind)
        try:
            if length % bpc:
                with open_nofollow(self.data_path(block_id)) as f:
                    tail = os.pread(f.fileno(), length % bpc, full)
                writer.write(tail, checksums.chunk_sums(tail, bpc, kind))
            writer.finish()
        finally:
            writer.abandon()

    def delete(self, block_id: int) -> bool:
        found = False
        for p in (self.data_path(block_id), self.meta_path(block_id)):
            try:
                p.unlink()
                found = True
            except FileNotFoundError:
                pass
        return found


def open_nofollow(path: Path, flags: int = os.O_RDONLY, mode: int = 0o600):
    """Open a data file without following a symlink planted in its place (``O_NOFOLLOW``)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    return os.fdopen(fd, "rb" if flags == os.O_RDONLY else "r+b", buffering=0)


class BlockWriter:
    """Writes a new replica of a block under a temporary name, from ``offset`` on; ``finish()`` renames
    it into place once complete. Nothing is written before the whole request checks out.

    A new write (offset 0) starts an empty replica. A pipeline recovery or an append (offset > 0, a
    newer generation stamp) continues the replica under construction, or copies the first ``offset``
    bytes of the finalized one, so a finalized replica is never changed in place: it is replaced
    atomically by a newer generation, and an older or equal generation is refused.

    Unbuffered: a packet is in the OS when ``write`` returns, so an acknowledgement never covers bytes
    still sitting in a user-space buffer of a pipeline that is being torn down."""

    MAX_BPC = 64 * 1024

    def __init__(self, bdir: BlockDir, block_id: int, gen: int, bpc: int, offset: int,
                 replace_gen: int | None = None, checksum: str = checksums.DEFAULT):
        self.checksum = checksums.check_kind(checksum)
        magic = MAGICS[checksum]
        if isinstance(block_id, bool) or not isinstance(block_id, int) or block_id < 0:
            raise DfsError(f"bad block id {block_id!r}")
        if not 1 <= gen < 1 << 63 or not 1 <= bpc <= self.MAX_BPC or offset < 0:
            raise DfsError(f"block {block_id}: bad write request (gen {gen}, bytes per checksum {bpc}, "
                           f"offset {offset})")
        if offset % bpc:
            raise DfsError(f"block {block_id}: pipeline restart at {offset}, not a chunk boundary")
        self.bdir, self.block_id, self.gen, self.bpc = bdir, block_id, gen, bpc
        self.sync_behind = SYNC_BEHIND if bdir.sync_on_close else 0   # bytes; 0: leave it to the kernel
        self.data = self.meta = None
        self.finished = False
        stored = bdir.stored_gen(block_id)
        if stored is not None and stored >= gen and replace_gen != stored:
            raise DfsError(f"block {block_id}: a finalized replica of generation {stored} is stored; "
                           f"refusing generation {gen}")
        tdata, tmeta = bdir.tmp_paths(block_id)
        source = None        # where the first ``offset`` bytes come from
        if replace_gen is not None:              # a truncate: always from the finalized replica
            source = "final" if offset else None
        elif offset:
            source = self._resume_source(offset, stored)
        if source == "tmp":                       # continue the replica under construction
            self.data = open_nofollow(tdata, os.O_RDWR)
            self.meta = open_nofollow(tmeta, os.O_RDWR)
            self.data.truncate(offset)
            self.meta.truncate(_META.size + 4 * (offset // bpc))
        else:
            bdir.remove_tmp(block_id)             # a dead pipeline's leftovers (older generation)
            new = os.O_RDWR | os.O_CREAT | os.O_EXCL
            self.data = open_nofollow(tdata, new)
            self.meta = open_nofollow(tmeta, new)
            self.meta.write(_META.pack(magic, gen, bpc))
            if source == "final":                 # copy the prefix of the finalized replica
                _, old_bpc, old_kind = bdir.info(block_id)
                if (old_bpc, old_kind) != (bpc, checksum):
                    raise DfsError(f"block {block_id}: stored with {old_kind} per {old_bpc} bytes, "
                                   f"not {checksum} per {bpc}")
                with open_nofollow(bdir.data_path(block_id)) as d, open_nofollow(bdir.meta_path(block_id)) as m:
                    _copy(d.fileno(), self.data.fileno(), 0, offset)
                    _copy(m.fileno(), self.meta.fileno(), _META.size, 4 * (offset // bpc))
        self.meta.seek(0)
        self.meta.write(_META.pack(magic, gen, bpc))
        self.meta.seek(0, os.SEEK_END)
        self.data.seek(offset)
        self.length = self.synced_to = offset

    def _resume_source(self, offset: int, stored: int | None) -> str:
        tdata, tmeta = self.bdir.tmp_paths(self.block_id)
        try:
            with open_nofollow(tmeta) as m:
                magic, tgen, tbpc = _META.unpack(m.read(_META.size))
            have = os.stat(tdata, follow_symlinks=False).st_size
            if magic == MAGICS[self.checksum] and tbpc == self.bpc and tgen < self.gen and have >= offset:
                return "tmp"
        except (OSError, struct.error):
            pass
        have = self.bdir.length(self.block_id) if stored is not None else 0
        if stored is None or have < offset:
            raise DfsError(f"block {self.block_id}: has {have} bytes, cannot resume at {offset}")
        return "final"

    def write(self, data, crcs) -> None:
        self.data.write(data)
        self.meta.write(crcs)
        self.length += len(data)
        if self.sync_behind and self.length - self.synced_to >= self.sync_behind:
            start_writeback(self.data.fileno(), self.synced_to, self.length - self.synced_to)
            self.synced_to = self.length

    def finish(self) -> None:
        """The replica is complete (every packet was verified as it arrived): rename it into place,
        the meta file last, so a newer generation replaces an older one as a whole. With the block
        directory's ``sync_on_close`` the files reach the disk before the renames, and the renames
        before this returns (the last ack leaves after it)."""
        tdata, tmeta = self.bdir.tmp_paths(self.block_id)
        sync = self.bdir.sync_on_close
        for f in (self.data, self.meta):
            if sync:
                os.fsync(f.fileno())
            f.close()
        os.rename(tdata, self.bdir.data_path(self.block_id))
        os.rename(tmeta, self.bdir.meta_path(self.block_id))
        if sync:
            fd = os.open(self.bdir.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.finished = True

    def close(self) -> None:
        """Stop writing; an unfinished replica stays under its temporary name (a pipeline recovery
        may continue it; it is never served)."""
        for f in (self.data, self.meta):
            if f is not None and not f.closed:
                f.close()

    def abandon(self) -> None:
        """Stop writing and remove an unfinished replica."""
        self.close()
        if not self.finished:
            self.bdir.remove_tmp(self.block_id)


def _copy(src: int, dst: int, offset: int, length: int) -> None:
    done = 0
    while done < length:
        chunk = os.pread(src, min(1 << 20, length - done), offset + done)
        if not chunk:
            raise DfsError("stored replica is shorter than its length")
        os.write(dst, chunk)
        done += len(chunk)
