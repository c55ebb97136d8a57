"""Sequential reads of one file through the native client: one ``read_block`` request per block, from
the stream's position to the block's end, on a connection of its own, its bytes handed out as the
caller asks for them (``core.BlockReader``). HDFS's block reader serves a sequential read the same
way; one request per ``read`` call would cost a round trip and a datanode request per buffer.

A replica that fails mid-block -- a checksum mismatch, a refusal, a broken connection -- is dropped
for the rest of the stream, and the read goes on from the same byte on the next replica; when none is
left the read raises ``ChecksumError`` (if any replica failed its checksums) or ``DfsError``, naming
the block and every replica's failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import auth
from ..native import core
from ..transport import TransportError
from .errors import DfsError, unreadable
from .native import endpoint, read_failure
from .wire import encode

READ_PACKET = 1 << 20        # data bytes per packet the datanode sends a reader


@dataclass
class _Open:
    start: int               # the block's first byte in the file
    stop: int                # one past its last
    block: dict
    loc: dict
    conn: object
    reader: object

    def at(self) -> int:
        return self.start + self.reader.position


class SequentialReads:
    def __init__(self, client, path: str, blocks: list[tuple[int, dict]]):
        self.client, self.path, self.blocks = client, path, blocks
        self.current: _Open | None = None
        self.failed: dict[int, list[DfsError]] = {}  # block id -> its replicas' failures, in order
        self.dropped: set[tuple[int, str]] = set()  # (block id, datanode) that failed this stream

    def readinto(self, pos: int, view: memoryview, end: int) -> int:
        """Fill ``view`` from file offset ``pos`` (not past ``end``); returns how many bytes."""
        filled = 0
        want = min(len(view), end - pos)
        while filled < want:
            at = pos + filled
            cur = self.current
            if cur is None or cur.at() != at:      # (a finished block is closed below)
                self.close()
                cur = self.current = self._open(at)
            n, failure = cur.reader.readinto(view[filled:want])
            filled += n
            if failure is None and n == 0 and cur.at() < cur.stop:
                failure = ("refused", f"block {cur.block['id']} on datanode {cur.loc['name']} ended "
                                      f"{cur.stop - cur.at()} bytes early")
            if failure is not None:
                self._drop(cur, *failure)
            elif cur.at() >= cur.stop:      # the block is done: take its end, so the datanode's
                cur.reader.finish()           # reply is read whole before the connection closes
                self.close()
        return filled

    def _open(self, at: int) -> _Open:
        start, block = next((s, b) for s, b in self.blocks if s <= at < s + int(b["length"]))
        stop = start + int(block["length"])
        if not block["locations"]:
            raise DfsError(f"{self.path}: block {block['id']} has no live replica")
        locs = sorted((loc for loc in block["locations"] if (block["id"], loc["name"]) not in self.dropped),
                      key=lambda loc: loc["name"] != self.client.node)
        errors = self.failed.setdefault(block["id"], [])
        for loc in locs:
            label = f"block {block['id']} on datanode {loc['name']}"
            conn = None
            try:
                conn = auth.connect(self.client.transport, tuple(loc["address"]), timeout=self.client.timeout)
                conn.send(encode({"op": "read_block", "block": block["id"], "offset": at - start,
                                  "length": stop - at, "packet": max(self.client.packet_size, READ_PACKET)}),
                          timeout=self.client.timeout)
                reader = core.BlockReader(endpoint(conn), at - start, label, self.client.timeout)
            except (TransportError, OSError) as e:
                if conn is not None:
                    conn.close()
                self.dropped.add((block["id"], loc["name"]))
                errors.append(DfsError(f"datanode {loc['name']}: read of block {block['id']} failed: {e}"))
                continue
            return _Open(start, stop, block, loc, conn, reader)
        raise unreadable(self.path, block["id"], errors)

    def _drop(self, cur: _Open, kind: str, reason: str) -> None:
        """Stop reading ``cur``'s replica for the rest of the stream (the connection is out of step)."""
        self.dropped.add((cur.block["id"], cur.loc["name"]))
        self.failed.setdefault(cur.block["id"], []).append(read_failure(kind, reason, cur.loc["name"], cur.block["id"]))
        self.close()

    def close(self) -> None:
        if self.current is not None:
            self.current.conn.close()
            self.current = None
