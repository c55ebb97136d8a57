"""The filesystems DFSIO tasks run against, behind one small interface.

- ``PosixFs``: a directory (node-local disk, or a shared/Lustre-like mount). ``fsync`` policy:
  ``none`` (leave it to the page cache), ``close`` (fsync once before close, like ``dd
  conv=fsync``), ``every-buffer`` (fsync after each -bufferSize write). The policy is part of the
  reported configuration because it changes what the throughput means.
- ``BlockFs``: the reference block store through ``DfsClient``.

Files live where TestDFSIO puts them: ``<base>/io_data/test_io_<i>``.
"""

from __future__ import annotations

import bz2
import os
import shutil
import zlib
from pathlib import Path

from ...errors import ConfigError

FSYNC_POLICIES = ("none", "close", "every-buffer")
DATA_DIR = "io_data"
BLOCKSTORE_BASE = "/benchmarks/TestDFSIO"


def file_name(i: int) -> str:
    return f"test_io_{i}"


class PosixWriter:
    def __init__(self, path: Path, fsync: str, append: bool):
        # Never through a symlink planted in the data dir; a new file is made new (O_EXCL) after the
        # old one (or whatever sits at its name) is removed, so a write cannot land in another file.
        if append:
            flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        self.fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
        self.fsync = fsync

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        if self.fsync == "every-buffer":
            os.fsync(self.fd)

    def close(self) -> None:
        try:
            if self.fsync in ("close", "every-buffer"):
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


class PosixReader:
    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def read(self, n: int) -> bytes:
        return os.read(self.fd, n)

    def readinto(self, buf) -> int:
        return os.readv(self.fd, [buf])

    def pread(self, pos: int, n: int) -> bytes:
        return os.pread(self.fd, n, pos)

    def close(self) -> None:
        os.close(self.fd)


class PosixFs:
    def __init__(self, root: str | Path, fsync: str = "none"):
        if fsync not in FSYNC_POLICIES:
            raise ConfigError(f"unknown fsync policy {fsync!r}; choose one of {', '.join(FSYNC_POLICIES)}",
                              "--fsync")
        self.root, self.fsync = Path(root), fsync
        self.data = self.root / DATA_DIR

    def create(self, name: str) -> PosixWriter:
        self.data.mkdir(parents=True, exist_ok=True)
        return PosixWriter(self.data / name, self.fsync, append=False)

    def append(self, name: str) -> PosixWriter:
        if not (self.data / name).exists():
            raise FileNotFoundError(f"{self.data / name}: no such file to append to")
        return PosixWriter(self.data / name, self.fsync, append=True)

    def open(self, name: str) -> PosixReader:
        return PosixReader(self.data / name)

    def size(self, name: str) -> int:
        return (self.data / name).stat().st_size

    def truncate(self, name: str, length: int) -> None:
        size = self.size(name)
        if length > size:
            raise ValueError(f"{self.data / name}: cannot truncate {size} bytes to a larger {length}")
        os.truncate(self.data / name, length)

    def clean(self) -> None:
        shutil.rmtree(self.data, ignore_errors=True)

    def close(self) -> None:
        pass


class BlockFs:
    def __init__(self, spec: dict, node: str | None = None):
        from ...reference.dfs.store import client_from_spec
        self.client = client_from_spec(spec, node)

    def _path(self, name: str) -> str:
        return f"{BLOCKSTORE_BASE}/{DATA_DIR}/{name}"

    def create(self, name: str):
        return self.client.create(self._path(name), overwrite=True)

    def append(self, name: str):
        return self.client.append(self._path(name))

    def open(self, name: str):
        return self.client.open(self._path(name))

    def size(self, name: str) -> int:
        return self.client.size(self._path(name))

    def truncate(self, name: str, length: int) -> None:
        self.client.truncate(self._path(name), length)

    def clean(self) -> None:
        self.client.delete(BLOCKSTORE_BASE, recursive=True)

    def close(self) -> None:
        self.client.close()


def open_fs(spec: dict, node: str | None = None):
    if spec["kind"] == "posix":
        return PosixFs(spec["root"], spec.get("fsync", "none"))
    if spec["kind"] == "blockstore":
        return BlockFs(spec, node)
    raise ConfigError(f"unknown filesystem kind {spec['kind']!r}", "--fs")


# -- compression (Hadoop's -compression codec class; ours are the standard library's) ---------------
def _compressor(codec: str):
    if codec == "zlib":
        return zlib.compressobj()
    if codec == "gzip":
        return zlib.compressobj(wbits=31)
    return bz2.BZ2Compressor()


def _decompressor(codec: str):
    if codec == "zlib":
        return zlib.decompressobj()
    if codec == "gzip":
        return zlib.decompressobj(wbits=31)
    return bz2.BZ2Decompressor()


class CompressedWriter:
    def __init__(self, inner, codec: str):
        self.inner, self.comp = inner, _compressor(codec)

    def write(self, data) -> None:
        out = self.comp.compress(data)
        if out:
            self.inner.write(out)

    def close(self) -> None:
        try:
            self.inner.write(self.comp.flush())
        finally:
            self.inner.close()


class DecompressedReader:
    def __init__(self, inner, codec: str, chunk: int):
        self.inner, self.dec, self.chunk = inner, _decompressor(codec), chunk
        self.pending = bytearray()
        self.eof = False

    def read(self, n: int) -> bytes:
        while len(self.pending) < n and not self.eof:
            raw = self.inner.read(self.chunk)
            if not raw:
                self.eof = True
                break
            self.pending += self.dec.decompress(raw)
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    def close(self) -> None:
        self.inner.close()
