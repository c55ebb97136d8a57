"""The metadata service's state: files, their blocks and replica locations, and the datanodes.

Pure logic (no sockets) so it can be unit-tested; ``metaservice`` serves it. Every mutation is
persisted (JSON, written to a temporary file and renamed) so a restarted store finds its files.
A file under construction is not readable: a writer that fails leaves it unclosed, never short.
Appends start a new block (the previous last block may be shorter than the block size).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from .errors import DfsError, NoSuchFile

MAX_REPLICATION = 3


class Namespace:
    def __init__(self, state_file: Path | None = None):
        self.state_file = Path(state_file) if state_file else None
        self.files: dict[str, dict] = {}
        self.next_block = 1
        self.datanodes: dict[str, list] = {}     # name -> [host, port] (live registry, not persisted)
        self._rotation = itertools.count()
        if self.state_file and self.state_file.exists():
            state = json.loads(self.state_file.read_text())
            self.files, self.next_block = state["files"], state["next_block"]

    def _save(self) -> None:
        if not self.state_file:
            return
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"files": self.files, "next_block": self.next_block}))
        os.replace(tmp, self.state_file)

    def _file(self, path: str) -> dict:
        try:
            return self.files[path]
        except KeyError:
            raise NoSuchFile(f"{path}: no such file") from None

    def _located(self, block: dict) -> dict:
        locs = [{"name": n, "address": self.datanodes[n]} for n in block["locations"] if n in self.datanodes]
        return {**block, "locations": locs}

    # -- operations (each returns a JSON-able dict) ---------------------------------------------
    def register(self, name: str, address) -> dict:
        self.datanodes[name] = list(address)
        return {}

    def create(self, path: str, replication: int, block_size: int, overwrite: bool) -> dict:
        if not 1 <= int(replication) <= MAX_REPLICATION:
            raise DfsError(f"{path}: replication must be 1..{MAX_REPLICATION}, got {replication}")
        if int(block_size) <= 0:
            raise DfsError(f"{path}: block size must be positive, got {block_size}")
        old = self.files.get(path)
        if old is not None and not overwrite:
            raise DfsError(f"{path}: file exists")
        self.files[path] = {"replication": int(replication), "block_size": int(block_size),
                            "blocks": [], "closed": False}
        self._save()
        return {"dropped": [self._located(b) for b in old["blocks"]] if old else []}

    def append(self, path: str) -> dict:
        f = self._file(path)
        if not f["closed"]:
            raise DfsError(f"{path}: file is still open for writing")
        f["closed"] = False
        self._save()
        return {"replication": f["replication"], "block_size": f["block_size"]}

    def add_block(self, path: str, writer: str | None, exclude=()) -> dict:
        f = self._file(path)
        if f["closed"]:
            raise DfsError(f"{path}: file is not open for writing")
        targets = self.place(f["replication"], writer, exclude)
        block = {"id": self.next_block, "gen": 1, "length": 0, "locations": []}
        self.next_block += 1
        f["blocks"].append(block)
        self._save()
        return {"block": block, "targets": [{"name": n, "address": self.datanodes[n]} for n in targets]}

    def place(self, replication: int, writer: str | None, exclude=()) -> list[str]:
        """First replica on the writer's own node if it runs a datanode (HDFS's rule), the rest
        rotating over the other live datanodes so files spread evenly."""
        live = sorted(n for n in self.datanodes if n not in set(exclude))
        if not live:
            raise DfsError("no live datanode to place a block on")
        chosen = [writer] if writer in live else []
        others = [n for n in live if n not in chosen]
        if others:
            start = next(self._rotation) % len(others)
            others = others[start:] + others[:start]
        return (chosen + others)[:replication]

    def bump_gen(self, path: str, block_id: int) -> dict:
        block = self._block(path, block_id)
        block["gen"] += 1
        self._save()
        return {"gen": block["gen"]}

    def _block(self, path: str, block_id: int) -> dict:
        for b in self._file(path)["blocks"]:
            if b["id"] == block_id:
                return b
        raise DfsError(f"{path}: has no block {block_id}")

    def commit_block(self, path: str, block_id: int, gen: int, length: int, locations) -> dict:
        block = self._block(path, block_id)
        if gen != block["gen"]:
            raise DfsError(f"{path}: block {block_id} generation {gen} is stale (current {block['gen']})")
        if not locations:
            raise DfsError(f"{path}: block {block_id} committed with no replica")
        block["length"], block["locations"] = int(length), list(locations)
        self._save()
        return {}

    def complete(self, path: str) -> dict:
        f = self._file(path)
        f["blocks"] = [b for b in f["blocks"] if b["locations"]]   # a block allocated but never written
        f["closed"] = True
        self._save()
        return {}

    def get(self, path: str) -> dict:
        f = self._file(path)
        if not f["closed"]:
            raise DfsError(f"{path}: file is under construction (its writer did not close it)")
        return {"length": sum(b["length"] for b in f["blocks"]),
                "blocks": [self._located(b) for b in f["blocks"]]}

    def truncate(self, path: str, length: int) -> dict:
        """New length; returns the blocks to delete and the block to cut (with its new length)."""
        f = self._file(path)
        if not f["closed"]:
            raise DfsError(f"{path}: file is under construction")
        total = sum(b["length"] for b in f["blocks"])
        if not 0 <= length <= total:
            raise DfsError(f"{path}: cannot truncate a {total}-byte file to {length} bytes")
        keep, drop, cut, pos = [], [], None, 0
        for b in f["blocks"]:
            start, pos = pos, pos + b["length"]
            if start >= length:
                drop.append(self._located(b))
                continue
            if pos > length:
                b["length"] = length - start
                cut = self._located(b)
            keep.append(b)
        f["blocks"] = keep
        self._save()
        return {"drop": drop, "cut": cut}

    def delete(self, path: str, recursive: bool) -> dict:
        prefix = path.rstrip("/") + "/"
        victims = [p for p in self.files if p == path or (recursive and p.startswith(prefix))]
        dropped = []
        for p in victims:
            dropped += [self._located(b) for b in self.files.pop(p)["blocks"]]
        self._save()
        return {"deleted": len(victims), "dropped": dropped}

    def listing(self, prefix: str) -> dict:
        prefix = prefix.rstrip("/") + "/"
        return {"files": sorted(p for p in self.files if p.startswith(prefix))}
