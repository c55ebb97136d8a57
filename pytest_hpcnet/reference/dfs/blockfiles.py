"""How a datanode keeps blocks on disk: ``blk_<id>`` holds the data, ``blk_<id>.meta`` a small header
(magic, generation stamp, bytes per checksum) followed by one big-endian CRC-32 per chunk."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from .errors import DfsError, NoSuchFile
from .wire import chunk_crcs

_META = struct.Struct(">4sQI")
MAGIC = b"HPCB"


class BlockDir:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def data_path(self, block_id: int) -> Path:
        return self.root / f"blk_{int(block_id)}"

    def meta_path(self, block_id: int) -> Path:
        return self.root / f"blk_{int(block_id)}.meta"

    def header(self, block_id: int) -> tuple[int, int]:
        """(generation stamp, bytes per checksum) of a stored block."""
        try:
            with open(self.meta_path(block_id), "rb") as f:
                magic, gen, bpc = _META.unpack(f.read(_META.size))
        except FileNotFoundError:
            raise NoSuchFile(f"block {block_id} is not stored here") from None
        except struct.error:
            raise DfsError(f"block {block_id}: meta file is truncated") from None
        if magic != MAGIC:
            raise DfsError(f"block {block_id}: meta file has a bad magic number")
        return gen, bpc

    def length(self, block_id: int) -> int:
        try:
            return self.data_path(block_id).stat().st_size
        except FileNotFoundError:
            raise NoSuchFile(f"block {block_id} is not stored here") from None

    def open_writer(self, block_id: int, gen: int, bpc: int, offset: int) -> "BlockWriter":
        return BlockWriter(self, block_id, gen, bpc, offset)

    def read(self, block_id: int, offset: int, length: int, packet: int):
        """Yield (start, data, crcs) covering [offset, offset+length), starts aligned to chunks."""
        _, bpc = self.header(block_id)
        size = self.length(block_id)
        if offset < 0 or length < 0 or offset + length > size:
            raise DfsError(f"block {block_id}: read of {length} bytes at {offset} is outside its "
                           f"{size} bytes")
        start = offset - offset % bpc
        end = offset + length
        packet = max(bpc, packet - packet % bpc)
        with open(self.data_path(block_id), "rb") as data, open(self.meta_path(block_id), "rb") as meta:
            pos = start
            while pos < end:
                n = min(packet, end - pos)
                n_chunks = (n + bpc - 1) // bpc
                n = min(n_chunks * bpc, size - pos)      # whole chunks, so the CRCs cover them
                buf = os.pread(data.fileno(), n, pos)
                crcs = os.pread(meta.fileno(), 4 * n_chunks, _META.size + 4 * (pos // bpc))
                if len(buf) != n or len(crcs) != 4 * n_chunks:
                    raise DfsError(f"block {block_id}: stored data or checksums are short at {pos}")
                yield pos, buf, crcs
                pos += n

    def truncate(self, block_id: int, length: int) -> None:
        gen, bpc = self.header(block_id)
        size = self.length(block_id)
        if length > size:
            raise DfsError(f"block {block_id}: cannot truncate {size} bytes to {length}")
        full = length // bpc
        tail = b""
        if length % bpc:
            with open(self.data_path(block_id), "rb") as f:
                tail = chunk_crcs(os.pread(f.fileno(), length % bpc, full * bpc), bpc)
        os.truncate(self.data_path(block_id), length)
        with open(self.meta_path(block_id), "r+b") as f:
            f.truncate(_META.size + 4 * full)
            f.seek(0, os.SEEK_END)
            f.write(tail)

    def delete(self, block_id: int) -> bool:
        found = False
        for p in (self.data_path(block_id), self.meta_path(block_id)):
            try:
                p.unlink()
                found = True
            except FileNotFoundError:
                pass
        return found


class BlockWriter:
    """Appends packets (data + their CRCs) to a block, from ``offset`` on (a recovery restarts there).

    Unbuffered: a packet is in the OS when ``write`` returns, so an acknowledgement never covers bytes
    still sitting in a user-space buffer of a pipeline that is being torn down."""

    def __init__(self, bdir: BlockDir, block_id: int, gen: int, bpc: int, offset: int):
        self.block_id, self.bpc = block_id, bpc
        if offset % bpc:
            raise DfsError(f"block {block_id}: pipeline restart at {offset}, not a chunk boundary")
        dpath, mpath = bdir.data_path(block_id), bdir.meta_path(block_id)
        if offset == 0:
            self.data = open(dpath, "wb", buffering=0)
            self.meta = open(mpath, "wb", buffering=0)
        else:
            have = bdir.length(block_id)
            if have < offset:
                raise DfsError(f"block {block_id}: has {have} bytes, cannot resume at {offset}")
            self.data = open(dpath, "r+b", buffering=0)
            self.meta = open(mpath, "r+b", buffering=0)
            self.data.truncate(offset)
            self.meta.truncate(_META.size + 4 * (offset // bpc))
            self.data.seek(offset)
        self.meta.seek(0)
        self.meta.write(_META.pack(MAGIC, gen, bpc))
        self.meta.seek(0, os.SEEK_END)
        self.length = offset

    def write(self, data, crcs) -> None:
        self.data.write(data)
        self.meta.write(crcs)
        self.length += len(data)

    def close(self, fsync: bool = False) -> None:
        for f in (self.data, self.meta):
            if not f.closed:
                if fsync:
                    os.fsync(f.fileno())
                f.close()
