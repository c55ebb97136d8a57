"""The datanode process: stores blocks, serves reads, and is one stage of a replication pipeline.

    python -m pytest_hpcnet.reference.dfs.datanode --dir D --name NODE --transport tcp|shm \
        --meta HOST:PORT [--host H] [--port P]

prints ``listening <host> <port>`` and registers with the metadata service.

Write pipeline (one block): the upstream (client or previous datanode) sends ``write_block`` naming
the downstream targets; this node connects to the next one and passes the request on, and the setup
acknowledgement comes back up once the whole pipeline is connected. Then each ``packet`` (data plus a
CRC per chunk) is forwarded downstream first, verified, and written; a responder thread sends the
packet's acknowledgement upstream only after the downstream node acknowledged it, so an ack at the
client means every node in the pipeline has the bytes. A failure is reported upstream as an error
ack naming the pipeline index of the node at fault (``bad``); the client rebuilds the pipeline from
the survivors and resends what was not acknowledged (``offset`` = bytes acknowledged so far).
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from ...timeouts import scaled
from ..transport import TransportError, get_transport
from .blockfiles import BlockDir
from .errors import ChecksumError, DfsError, ProtocolError
from .server import log, serve_forever
from .wire import MAX_MESSAGE, PACKET_SIZE, decode, decode_request, encode, request, verify_chunks

CONNECT_TIMEOUT = scaled(10.0)
PACKET_TIMEOUT = 60.0     # an upstream that goes quiet this long is treated as gone
BLOCK_LOCK_TIMEOUT = 30.0


class DataNode:
    def __init__(self, name: str, root: Path, transport: str):
        self.name = name
        self.blocks = BlockDir(root)
        self.transport = get_transport(transport)
        self._block_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()

    def _lock_for(self, block_id: int) -> threading.Lock:
        with self._locks_guard:
            return self._block_locks[block_id]

    def handle(self, conn) -> None:
        while True:
            msg = conn.recv(timeout=3600, max_length=MAX_MESSAGE)
            try:
                header, _ = decode_request(msg.view)
            finally:
                msg.release()
            op = header["op"]
            if op == "write_block":
                self.write_block(conn, header)
                return
            if op == "read_block":
                self.read_block(conn, header)
                continue
            try:
                reply = {"status": "ok", **self.simple(op, header)}
            except (DfsError, KeyError, TypeError, ValueError) as e:
                reply = {"status": "error", "reason": f"datanode {self.name}: {e}"}
            conn.send(encode(reply))

    def simple(self, op: str, h: dict) -> dict:
        if op == "ping":
            return {"name": self.name}
        if op == "delete_blocks":
            return {"deleted": sum(self.blocks.delete(int(b)) for b in h["blocks"])}
        if op == "truncate_block":
            with self._lock_for(int(h["block"])):
                self.blocks.truncate(int(h["block"]), int(h["length"]))
            return {}
        if op == "block_info":
            gen, bpc = self.blocks.header(int(h["block"]))
            return {"length": self.blocks.length(int(h["block"])), "gen": gen, "bpc": bpc}
        raise DfsError(f"unknown op {op!r}")

    # -- reads -------------------------------------------------------------------------------------
    def read_block(self, conn, h: dict) -> None:
        try:
            _, bpc = self.blocks.header(int(h["block"]))
            for start, data, crcs in self.blocks.read(int(h["block"]), int(h["offset"]), int(h["length"]),
                                                      int(h.get("packet", PACKET_SIZE))):
                conn.send(encode({"op": "data", "start": start, "len": len(data), "bpc": bpc}, crcs, data))
        except (DfsError, OSError) as e:
            conn.send(encode({"op": "error", "reason": f"datanode {self.name}: {e}"}))
            return
        conn.send(encode({"op": "end"}))

    # -- the write pipeline ------------------------------------------------------------------------
    def write_block(self, up, h: dict) -> None:
        block, index = int(h["block"]), int(h.get("index", 0))
        lock = self._lock_for(block)
        if not lock.acquire(timeout=BLOCK_LOCK_TIMEOUT):   # an earlier pipeline of this block still ends
            up.send(encode(_error(index, f"datanode {self.name}: block {block} is busy")))
            return
        down = None
        try:
            if int(h.get("offset", 0)) or int(h["gen"]) > 1:
                log(f"datanode {self.name}", f"pipeline recovery: block {block} resumes at byte "
                                             f"{h.get('offset', 0)}, generation {h['gen']}")
            try:
                writer = self.blocks.open_writer(block, int(h["gen"]), int(h["bpc"]), int(h.get("offset", 0)))
            except (DfsError, OSError) as e:
                up.send(encode(_error(index, f"datanode {self.name}: {e}")))
                return
            try:
                targets = h.get("targets") or []
                if targets:
                    try:
                        down = self.transport.connect(tuple(targets[0]), timeout=CONNECT_TIMEOUT)
                        reply = request(down, {**h, "targets": targets[1:], "index": index + 1},
                                        timeout=CONNECT_TIMEOUT)
                    except TransportError as e:
                        up.send(encode(_error(index + 1, f"datanode {self.name} cannot reach the next "
                                                         f"datanode {targets[0]}: {e}")))
                        return
                    if reply.get("status") != "ok":
                        up.send(encode(reply))
                        return
                up.send(encode({"op": "ack", "seq": -1, "status": "ok"}))
                self._stream(up, down, writer, index, block)
            finally:
                writer.close()
        finally:
            if down is not None:
                down.close()
            lock.release()

    def _stream(self, up, down, writer, index: int, block: int) -> None:
        acks: queue.Queue = queue.Queue()
        responder = threading.Thread(target=self._respond, args=(up, down, acks, index), daemon=True)
        responder.start()
        forwarding = down is not None
        try:
            while True:
                msg = up.recv(timeout=PACKET_TIMEOUT, max_length=MAX_MESSAGE)
                try:
                    header, payload = decode(msg.view)
                    if header["op"] != "packet":
                        raise ProtocolError(f"expected a packet, got {header['op']!r}")
                    seq, n, last = int(header["seq"]), int(header["len"]), bool(header.get("last"))
                    ncrc = len(payload) - n
                    if forwarding:
                        try:
                            down.send(encode(header, payload))
                        except TransportError as e:
                            acks.put(("error", index + 1, f"datanode {self.name} lost the next datanode: {e}"))
                            return
                    try:
                        verify_chunks(payload[ncrc:], payload[:ncrc], writer.bpc,
                                      f"datanode {self.name} block {block}", writer.length)
                    except ChecksumError as e:
                        acks.put(("error", index, str(e)))
                        return
                    writer.write(payload[ncrc:], payload[:ncrc])
                finally:
                    msg.release()
                if last:
                    writer.close()          # on disk (page cache) before the last ack leaves
                acks.put(("ok", seq, last))
                if last:
                    break
        except (TransportError, ProtocolError, KeyError, ValueError) as e:
            acks.put(("stop", None, str(e)))
            if not isinstance(e, TransportError):
                log(f"datanode {self.name}", f"pipeline for block {block} dropped: {e}")
        finally:
            responder.join(PACKET_TIMEOUT)

    def _respond(self, up, down, acks: queue.Queue, index: int) -> None:
        try:
            while True:
                kind, seq, extra = acks.get()
                if kind == "stop":
                    return
                if kind == "error":
                    up.send(encode(_error(seq, extra)))
                    return
                if down is not None:
                    try:
                        msg = down.recv(timeout=PACKET_TIMEOUT, max_length=MAX_MESSAGE)
                        try:
                            ack, _ = decode(msg.view)
                        finally:
                            msg.release()
                    except (TransportError, ProtocolError) as e:
                        up.send(encode(_error(index + 1, f"datanode {self.name} got no ack from the next "
                                                         f"datanode: {e}")))
                        return
                    if ack.get("status") != "ok":
                        up.send(encode(ack))
                        return
                    if ack.get("seq") != seq:
                        up.send(encode(_error(index + 1, f"ack for packet {ack.get('seq')} while "
                                                         f"expecting {seq}")))
                        return
                up.send(encode({"op": "ack", "seq": seq, "status": "ok"}))
                if extra:      # the last packet
                    return
        except TransportError:
            return             # the upstream is gone; it will not read acks any more
        finally:
            if down is not None:
                down.close()


def _error(bad: int, reason: str) -> dict:
    return {"op": "ack", "seq": -1, "status": "error", "bad": bad, "reason": reason}


def register(meta: tuple[str, int], name: str, address, attempts: int = 50) -> None:
    tcp = get_transport("tcp")
    for i in range(attempts):
        try:
            conn = tcp.connect(meta, timeout=CONNECT_TIMEOUT)
            try:
                reply = request(conn, {"op": "register", "name": name, "address": list(address)})
            finally:
                conn.close()
            if reply.get("status") != "ok":
                raise DfsError(f"metadata service refused datanode {name}: {reply.get('reason')}")
            return
        except TransportError as e:
            err = e
            time.sleep(0.1)
    raise DfsError(f"datanode {name} cannot register with the metadata service at {meta}: {err}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--transport", default="tcp")
    parser.add_argument("--meta", required=True, help="HOST:PORT of the metadata service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    host, _, port = args.meta.rpartition(":")
    node = DataNode(args.name, args.dir, args.transport)
    listener = node.transport.listen(args.host, args.port)
    register((host, int(port)), args.name, listener.address)
    print(f"listening {listener.address[0]} {listener.address[1]}", flush=True)
    serve_forever(listener, node.handle, f"datanode {args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
