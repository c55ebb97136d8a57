"""The client end of a block's replication pipeline, and the output stream that drives it.

``DfsOutputStream`` cuts what is written into packets (``PACKET_SIZE`` data bytes, a CRC of the
client's checksum type per ``bpc`` bytes) and blocks (``block_size``). Each block goes down one pipeline of datanodes; up to
``WINDOW`` packets are in flight and kept until acknowledged. When a datanode fails (an error ack
names its pipeline index, or the head of the pipeline itself is gone) the stream bumps the block's
generation stamp at the metadata service, restarts the pipeline on the surviving nodes at the last
acknowledged offset, and resends the unacknowledged packets. With no survivor left the write fails
with ``DfsWriteError`` and the file stays under construction (unreadable), never silently short.
"""

from __future__ import annotations

import collections
import threading

from .. import auth
from ..native import core
from ...timeouts import scaled
from ..transport import TransportError
from .errors import DfsWriteError, ProtocolError
from .native import endpoint
from .wire import MAX_MESSAGE, chunk_crcs, decode, encode

# Packets in flight per pipeline (HDFS's dfs.client.write.max-packets-in-flight, 80 there). 8 x 64 KiB
# rather than 16: the native store at replication 3 then wrote 547 MiB/s at 2.74 CPU ms per MiB against
# 432 at 3.61 with 16, windows taking turns in one process over 8 rounds of 128 MiB on a 2-core host
# (r1 unchanged: 1838 against 1827 MiB/s; 12 and 32 behaved like 16; `python benchmarks/bench_blockstore.py
# --windows 16` compares them). A window still covers a LAN fabric's bandwidth-delay product: 512 KiB is
# 40 us at 100 Gb/s.
WINDOW = 8
ACK_TIMEOUT = 60.0


class _PipelineFailure(Exception):
    def __init__(self, bad: int, reason: str):
        self.bad, self.reason = bad, reason
        super().__init__(reason)


class _Pipeline:
    def __init__(self, client, block: dict, targets: list[dict], offset: int, gen: int, pending=()):
        self.client, self.block, self.targets, self.gen = client, block, targets, gen
        self.acked = offset                              # bytes of the block every node has
        self.unacked = collections.deque(pending)        # (seq, end offset, header, crcs, data)
        self.cond = threading.Condition()
        self.failure: _PipelineFailure | None = None
        self.conn = None
        self._reader = None

    def start(self) -> None:
        """Connect, set the pipeline up and resend what the previous pipeline left unacknowledged."""
        self._setup()
        self._reader = threading.Thread(target=self._read_acks, daemon=True)
        self._reader.start()
        for _, _, header, crcs, data in list(self.unacked):
            self._send(header, crcs, data)

    def _setup(self) -> None:
        head, rest = self.targets[0], self.targets[1:]
        try:
            self.conn = auth.connect(self.client.transport, head["address"], timeout=scaled(10.0))
            self.conn.send(encode({"op": "write_block", "block": self.block["id"], "gen": self.gen,
                                   "offset": self.acked, "bpc": self.client.bpc, "index": 0,
                                   "checksum": self.client.checksum,
                                   "targets": [t["address"] for t in rest]}))
            ack = self._recv_ack(timeout=30.0)
        except TransportError as e:
            raise _PipelineFailure(0, f"datanode {head['name']} at {head['address']}: {e}") from None
        if ack.get("status") != "ok":
            raise _PipelineFailure(int(ack.get("bad", 0)), ack.get("reason", "pipeline setup failed"))

    def pending(self) -> list:
        """The packets not acknowledged: (seq, end offset, header, crcs, data), oldest first."""
        with self.cond:
            return list(self.unacked)

    def _recv_ack(self, timeout: float) -> dict:
        msg = self.conn.recv(timeout=timeout, max_length=MAX_MESSAGE)
        try:
            ack, _ = decode(msg.view)
        finally:
            msg.release()
        return ack

    def _read_acks(self) -> None:
        failure = None
        try:
            while True:
                ack = self._recv_ack(ACK_TIMEOUT)
                if ack.get("status") != "ok":
                    failure = _PipelineFailure(int(ack.get("bad", 0)), ack.get("reason", "error ack"))
                    return
                with self.cond:
                    if not self.unacked or self.unacked[0][0] != ack.get("seq"):
                        failure = _PipelineFailure(0, f"unexpected ack {ack.get('seq')}")
                        return
                    _, end, header, _, _ = self.unacked.popleft()
                    self.acked = end
                    self.cond.notify_all()
                    if header["last"]:
                        return
        except (TransportError, ProtocolError) as e:
            failure = _PipelineFailure(0, f"datanode {self.targets[0]['name']}: {e}")
        finally:
            with self.cond:
                if failure is not None and self.failure is None:
                    self.failure = failure
                self.cond.notify_all()

    def _failed(self, error: Exception) -> _PipelineFailure:
        """The failure to act on: what the ack reader heard (an error ack names the bad node) wins
        over our own send error, which can only say that the connection broke."""
        if self._reader is not None:
            self._reader.join(ACK_TIMEOUT)
        return self.failure or _PipelineFailure(0, f"datanode {self.targets[0]['name']}: {error}")

    def _send(self, header, crcs, data) -> None:
        try:
            self.conn.send(encode(header, crcs, data))
        except TransportError as e:
            raise self._failed(e) from None

    def send(self, header: dict, data: bytes) -> None:
        crcs = chunk_crcs(data, self.client.bpc, self.client.checksum)
        with self.cond:
            timed_out = not self.cond.wait_for(lambda: len(self.unacked) < WINDOW or self.failure,
                                               ACK_TIMEOUT)
            # Queued before any failure is raised, so a recovery resends this packet too.
            self.unacked.append((header["seq"], header["offset"] + len(data), header, crcs, data))
            if timed_out:
                raise _PipelineFailure(0, "no acknowledgement within the timeout")
            if self.failure:
                raise self.failure
        self._send(header, crcs, data)

    def drain(self) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: not self.unacked or self.failure, ACK_TIMEOUT):
                raise _PipelineFailure(0, "no acknowledgement within the timeout")
            if self.failure and self.unacked:
                raise self.failure

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self._reader is not None:
            self._reader.join(ACK_TIMEOUT)


class _NativePipeline(_Pipeline):
    """The same pipeline with its per-packet work in the native core (``core.PacketWriter``): packets
    are built, checksummed and sent, and acknowledgements read, without the GIL. Setup and recovery
    are the Python pipeline's; a failure is raised at the next call after the native side saw it."""

    writer = None

    def start(self) -> None:
        self._setup()
        if getattr(self.conn, "_carry", b""):    # acks for packets not sent yet: not a datanode we know
            raise _PipelineFailure(0, f"datanode {self.targets[0]['name']} sent more than the setup ack")
        self.writer = core.PacketWriter(endpoint(self.conn), self.client.bpc, self.client.checksum,
                                        self.acked, f"datanode {self.targets[0]['name']}", WINDOW, ACK_TIMEOUT)
        for _, _, header, _, data in list(self.unacked):
            self.writer.send_packet(header["seq"], header["offset"], data, header["last"])
        self.unacked.clear()
        self._check()

    def _check(self) -> None:
        failure = self.writer.failure()
        if failure is not None:
            raise _PipelineFailure(int(failure[0]), failure[1])

    def pending(self) -> list:
        return self.writer.unacked() if self.writer is not None else list(self.unacked)

    def send(self, header: dict, data: bytes) -> None:
        self.writer.send_packet(header["seq"], header["offset"], data, header["last"])
        self._check()

    def send_many(self, seq: int, offset: int, data) -> None:
        """Whole packets of ``packet_size`` bytes, none of them the block's last."""
        self.writer.send_packets(seq, offset, data, self.client.packet_size)
        self._check()

    def drain(self) -> None:
        if not self.writer.drain(ACK_TIMEOUT):
            raise _PipelineFailure(0, "no acknowledgement within the timeout")
        self._check()
        self.acked = self.writer.acked

    def close(self) -> None:
        if self.writer is not None:
            self.acked = self.writer.acked
            self.writer.close()
        if self.conn is not None:
            self.conn.close()


def pipeline_class(impl: str):
    return _NativePipeline if impl == "native" else _Pipeline


class DfsOutputStream:
    def __init__(self, client, path: str, replication: int, block_size: int):
        self.client, self.path = client, path
        self.replication, self.block_size = replication, block_size
        self.packet = bytearray(client.packet_size)
        self.fill = 0
        self.block = None          # the block being written: {"id", "gen"}
        self.sent = 0              # bytes of the block handed to the pipeline
        self.seq = 0
        self.pipeline: _Pipeline | None = None
        self.failures: list[tuple[str, str]] = []   # (datanode, reason) the pipeline recovered from
        self.closed = False
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        off = 0
        while off < len(view):
            if self.block is None:
                self._new_block()
            if self.fill == 0 and isinstance(self.pipeline, _NativePipeline):
                # whole packets straight from the caller's buffer (never the block's last packet)
                ps = self.client.packet_size
                whole = min(len(view) - off, self.block_size - self.sent - 1) // ps * ps
                if whole:
                    seq, sent = self.seq, self.sent
                    self.seq += whole // ps     # queued even if the pipeline fails: recovery resends them
                    self.sent += whole
                    self._guarded(lambda: self.pipeline.send_many(seq, sent, view[off:off + whole]))
                    off += whole
                    continue
            n = min(len(view) - off, self.client.packet_size - self.fill,
                    self.block_size - self.sent - self.fill)
            self.packet[self.fill:self.fill + n] = view[off:off + n]
            self.fill += n
            off += n
            if self.sent + self.fill == self.block_size:
                self._end_block()
            elif self.fill == len(self.packet):
                self._flush_packet(last=False)
        self.size += len(view)
        return len(view)

    def close(self) -> None:
        if self.closed:
            return
        if self.block is not None:
            self._end_block()
        self.client.meta("complete", path=self.path)
        self.closed = True

    def abort(self) -> None:
        """Drop the connections without completing the file (it stays under construction)."""
        if self.pipeline is not None:
            self.pipeline.close()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- blocks and packets ------------------------------------------------------------------------
    def _new_block(self) -> None:
        # Datanodes this stream saw fail are not offered again (the service has no heartbeats).
        reply = self.client.meta("add_block", path=self.path, writer=self.client.node,
                                 exclude=sorted({name for name, _ in self.failures}))
        self.block, self.sent = reply["block"], 0
        self.pipeline = pipeline_class(self.client.pipeline_impl)(self.client, self.block, reply["targets"], 0,
                                                                  self.block["gen"])
        self._guarded(self.pipeline.start)

    def _flush_packet(self, last: bool) -> None:
        header = {"op": "packet", "seq": self.seq, "offset": self.sent, "len": self.fill, "last": last}
        data = bytes(self.packet[:self.fill])
        self.seq += 1
        self.sent += self.fill
        self.fill = 0
        self._guarded(lambda: self.pipeline.send(header, data))

    def _end_block(self) -> None:
        self._flush_packet(last=True)
        self._guarded(lambda: self.pipeline.drain(), again=lambda: self.pipeline.drain())
        p = self.pipeline
        if p.acked != self.sent:     # an invariant, checked because a miss would be a short file
            raise DfsWriteError(f"{self.path}: block {self.block['id']}: {p.acked} bytes acknowledged "
                                f"of {self.sent} sent; not committing a short block")
        self.client.meta("commit_block", path=self.path, block=self.block["id"], gen=p.gen,
                         length=self.sent, locations=[t["name"] for t in p.targets])
        p.close()
        self.block, self.pipeline = None, None

    def _guarded(self, action, again=None) -> None:
        """Run ``action``; after a recovery run ``again`` on the new pipeline (a drain must wait
        for the new pipeline's acks too), or nothing (a packet that was being sent is pending and
        the recovery resent it)."""
        while True:
            try:
                return action()
            except _PipelineFailure as failure:
                self._recover(failure)
                if again is None:
                    return None
                action = again

    def _recover(self, failure: _PipelineFailure) -> None:
        while True:
            old = self.pipeline
            old.close()
            bad = old.targets[failure.bad] if 0 <= failure.bad < len(old.targets) else old.targets[0]
            self.failures.append((bad["name"], failure.reason))
            survivors = [t for t in old.targets if t is not bad]
            if not survivors:
                tried = "; ".join(f"{n}: {r}" for n, r in self.failures)
                raise DfsWriteError(f"{self.path}: block {self.block['id']}: no datanode left in the "
                                    f"pipeline after failures ({tried}); the file is left unclosed")
            gen = self.client.meta("bump_gen", path=self.path, block=self.block["id"])["gen"]
            pending = old.pending()
            self.pipeline = pipeline_class(self.client.pipeline_impl)(self.client, self.block, survivors,
                                                                      old.acked, gen, pending)
            try:
                self.pipeline.start()
                return
            except _PipelineFailure as again:
                failure = again
