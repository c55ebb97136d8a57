"""The datanode process: stores blocks, serves reads, and is one stage of a replication pipeline.

    python -m pytest_hpcnet.reference.dfs.datanode --dir D --name NODE --transport tcp|shm \
        --meta HOST:PORT [--host H] [--port P] [--impl native|python]

registers with the metadata service, then announces ``listening on <transport> <host>:<port>``
(``cluster.nodeprogram``) and serves until SIGTERM/SIGINT.

Write pipeline (one block): the upstream (client or previous datanode) sends ``write_block`` naming
the downstream targets; this node connects to the next one and passes the request on, and the setup
acknowledgement comes back up once the whole pipeline is connected. Then each ``packet`` (data plus a
CRC per chunk) is forwarded downstream first, verified, and written; a responder thread sends the
packet's acknowledgement upstream only after the downstream node acknowledged it, so an ack at the
client means every node in the pipeline has the bytes. A failure is reported upstream as an error
ack naming the pipeline index of the node at fault (``bad``); the client rebuilds the pipeline from
the survivors and resends what was not acknowledged (``offset`` = bytes acknowledged so far).

With ``--impl native`` (the default where the native core is installed) over tcp, or over verbs
where the native verbs end runs, the per-packet work -- receive, forward, verify, write, relay acks --
runs in the native core (``native.py``); this module still does what happens once per block. The wire
format is the same, so native and Python datanodes (and native and pyverbs ends) mix in one pipeline.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from .. import auth
from ...cluster.nodeprogram import announce, node_main, serve_until_signalled
from ...cluster.reaper import controller_id
from ...timeouts import scaled
from ..transport import TransportError, get_transport, transport_for
from . import checksums
from . import native as native_dfs
from .blockfiles import BlockDir, BlockWriter
from .errors import ChecksumError, DfsError, ProtocolError
from ..serving import DEFAULT_LIMITS
from .server import log, serve
from .wire import MAX_MESSAGE, PACKET_SIZE, decode, decode_request, encode, request, verify_chunks

CONNECT_TIMEOUT = scaled(10.0)
PACKET_TIMEOUT = 60.0     # an upstream that goes quiet this long is treated as gone
BLOCK_LOCK_TIMEOUT = 30.0
IDLE_TIMEOUT = DEFAULT_LIMITS.idle_timeout   # between requests on a connection
MAX_PACKET = 16 * 1024 * 1024                # largest read packet a client may ask for
RECOVERY_WINDOW = 2 * PACKET_TIMEOUT        # how long an unfinished replica waits for a recovery
MAX_TARGETS = 16                             # downstream datanodes one write request may name


class DataNode:
    def __init__(self, name: str, root: Path, transport: str, meta: tuple[str, int] | None = None,
                 impl: str | None = None, sync_on_close: bool = False):
        self.name = name
        self.impl = native_dfs.resolve_impl(impl, transport)
        self.blocks = BlockDir(root, sync_on_close)
        left = self.blocks.clean_tmp()
        if left:
            log(f"datanode {name}", f"removed {left} replica file(s) a previous run left unfinished")
        self.transport = transport_for(transport, self.impl)
        self.meta = meta
        self._registered: set[tuple[str, int]] = set()
        self._block_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        self._unfinished: dict[int, float] = {}    # block -> when its pipeline ended unfinished
        threading.Thread(target=self._sweep_unfinished, name="unfinished-sweeper", daemon=True).start()

    def _sweep_unfinished(self, every: float = 10.0) -> None:
        """A replica left under construction by a pipeline that ended early is kept for a recovery
        (which continues it) for ``RECOVERY_WINDOW`` seconds, then removed: no partial files stay."""
        while True:
            time.sleep(every)
            now = time.monotonic()
            for block, since in list(self._unfinished.items()):
                if now - since < RECOVERY_WINDOW:
                    continue
                lock = self._lock_for(block)
                if lock.acquire(blocking=False):
                    try:
                        if self._unfinished.get(block) == since:
                            self.blocks.remove_tmp(block)
                            del self._unfinished[block]
                    finally:
                        lock.release()

    def _lock_for(self, block_id: int) -> threading.Lock:
        with self._locks_guard:
            return self._block_locks[block_id]

    def handle(self, conn) -> None:
        while True:
            msg = conn.recv(timeout=IDLE_TIMEOUT, max_length=MAX_MESSAGE)
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
            except Exception as e:      # every failure is an error reply; the connection stays usable
                reply = {"status": "error", "reason": f"datanode {self.name}: {type(e).__name__}: {e}"}
            conn.send(encode(reply))

    def simple(self, op: str, h: dict) -> dict:
        if op == "ping":
            return {"name": self.name, "auth_refused": sum(auth.refused.values())}
        if op == "cpu":       # this process's CPU seconds so far (every thread, exited ones too)
            # and which process it is (boot:pid:start), so a measurement on the same host can pin it
            return {"name": self.name, "impl": self.impl, "cpu_s": time.process_time(),
                    "process": controller_id()}
        if op == "delete_blocks":
            ids = [_block_id(b) for b in h["blocks"]]
            deleted = 0
            for b in ids:
                with self._lock_for(b):
                    deleted += self.blocks.delete(b)
            return {"deleted": deleted}
        if op == "truncate_block":
            block, length = _block_id(h["block"]), _nonneg(h["length"], "length")
            with self._lock_for(block):
                self.blocks.truncate(block, length)
            return {}
        if op == "block_info":
            gen, bpc, kind = self.blocks.info(_block_id(h["block"]))
            return {"length": self.blocks.length(_block_id(h["block"])), "gen": gen, "bpc": bpc,
                    "checksum": kind}
        raise DfsError(f"unknown op {op!r}")

    # -- reads -------------------------------------------------------------------------------------
    def read_block(self, conn, h: dict) -> None:
        try:
            block = _block_id(h["block"])
            offset, length = _nonneg(h["offset"], "offset"), _nonneg(h["length"], "length")
            packet = min(MAX_PACKET, max(1, _nonneg(h.get("packet", PACKET_SIZE), "packet")))
            _, bpc, kind = self.blocks.info(block)
            if self.impl == "native" and native_dfs.serves_reads(conn):    # from the core and the page cache
                with self.blocks.open_range(block, offset, length) as replica:
                    native_dfs.serve_read(conn, replica, offset, length, packet, bpc, kind,
                                          f"block {block}", PACKET_TIMEOUT)
            else:
                for start, data, crcs in self.blocks.read(block, offset, length, packet):
                    conn.send(encode({"op": "data", "start": start, "len": len(data), "bpc": bpc,
                                      "checksum": kind}, crcs, data))
        except TransportError:
            raise
        except Exception as e:
            conn.send(encode({"op": "error", "reason": f"datanode {self.name}: {type(e).__name__}: {e}"}))
            return
        conn.send(encode({"op": "end"}))

    # -- the write pipeline ------------------------------------------------------------------------
    def _check_write(self, h: dict) -> tuple:
        """The whole request, checked before anything touches disk or the network."""
        block, index = _block_id(h["block"]), _nonneg(h.get("index", 0), "index")
        gen, bpc, offset = _nonneg(h["gen"], "gen"), _nonneg(h["bpc"], "bpc"), _nonneg(h.get("offset", 0), "offset")
        if not 1 <= bpc <= BlockWriter.MAX_BPC or offset % bpc or gen < 1:
            raise DfsError(f"bad write request for block {block}: gen {gen}, bytes per checksum {bpc}, "
                           f"offset {offset}")
        checksums.check_kind(h.get("checksum", checksums.DEFAULT))
        targets = h.get("targets") or []
        if not isinstance(targets, list) or len(targets) > MAX_TARGETS:
            raise DfsError(f"targets must be a list of at most {MAX_TARGETS} [host, port] pairs")
        targets = [_address(t) for t in targets]
        unknown = [t for t in targets if t not in self._registered_datanodes(refresh=False)]
        if unknown and [t for t in targets if t not in self._registered_datanodes(refresh=True)]:
            raise DfsError(f"refusing to forward to {unknown[0][0]}:{unknown[0][1]}: not a datanode the "
                           f"metadata service registered")
        return block, index, gen, bpc, offset, targets

    def _registered_datanodes(self, refresh: bool) -> set:
        if refresh and self.meta is not None:
            try:
                conn = auth.connect(get_transport("tcp"), self.meta, timeout=CONNECT_TIMEOUT)
                try:
                    reply = request(conn, {"op": "datanodes"}, timeout=CONNECT_TIMEOUT)
                finally:
                    conn.close()
                self._registered = {_address(a) for a in reply.get("datanodes", {}).values()}
            except (TransportError, DfsError, ValueError, TypeError, AttributeError) as e:
                log(f"datanode {self.name}", f"cannot ask the metadata service for datanodes: {e}")
        return self._registered

    def write_block(self, up, h: dict) -> None:
        index = h.get("index", 0) if isinstance(h.get("index", 0), int) else 0
        try:
            block, index, gen, bpc, offset, targets = self._check_write(h)
        except (DfsError, KeyError, TypeError, ValueError) as e:
            up.send(encode(_error(index, f"datanode {self.name}: {type(e).__name__}: {e}")))
            return
        lock = self._lock_for(block)
        if not lock.acquire(timeout=BLOCK_LOCK_TIMEOUT):   # an earlier pipeline of this block still ends
            up.send(encode(_error(index, f"datanode {self.name}: block {block} is busy")))
            return
        down = writer = None
        try:
            if offset or gen > 1:
                log(f"datanode {self.name}", f"pipeline recovery: block {block} resumes at byte "
                                             f"{offset}, generation {gen}")
            if targets:            # the pipeline first: a failure there leaves no file behind
                try:
                    down = auth.connect(self.transport, targets[0], timeout=CONNECT_TIMEOUT)
                    reply = request(down, {**h, "targets": [list(t) for t in targets[1:]], "index": index + 1},
                                    timeout=CONNECT_TIMEOUT)
                except (TransportError, DfsError) as e:
                    up.send(encode(_error(index + 1, f"datanode {self.name} cannot reach the next "
                                                     f"datanode {targets[0]}: {e}")))
                    return
                if reply.get("status") != "ok":
                    up.send(encode(reply))
                    return
            try:
                writer = self.blocks.open_writer(block, gen, bpc, offset,
                                                 h.get("checksum", checksums.DEFAULT))
            except Exception as e:
                up.send(encode(_error(index, f"datanode {self.name}: {type(e).__name__}: {e}")))
                return
            up.send(encode({"op": "ack", "seq": -1, "status": "ok"}))
            if self.impl == "native":
                native_dfs.stream(up, down, writer, index, f"datanode {self.name} block {block}",
                                  PACKET_TIMEOUT, lambda m: log(f"datanode {self.name}", m))
            else:
                self._stream(up, down, writer, index, block)
        finally:
            if writer is not None:
                writer.close()     # unfinished: stays under its temporary name for a recovery
                if writer.finished:
                    self._unfinished.pop(block, None)
                else:
                    self._unfinished[block] = time.monotonic()
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
                    if not 0 <= n <= len(payload):
                        raise ProtocolError(f"packet length {n} is impossible in a {len(payload)}-byte payload")
                    if header.get("offset", writer.length) != writer.length:
                        raise ProtocolError(f"packet {seq} starts at byte {header.get('offset')}, the "
                                            f"replica has {writer.length}")
                    ncrc = len(payload) - n
                    if forwarding:
                        try:
                            down.send(encode(header, payload))
                        except TransportError as e:
                            acks.put(("error", index + 1, f"datanode {self.name} lost the next datanode: {e}"))
                            return
                    try:
                        verify_chunks(payload[ncrc:], payload[:ncrc], writer.bpc,
                                      f"datanode {self.name} block {block}", writer.length, writer.checksum)
                    except ChecksumError as e:
                        writer.abandon()            # dropped before the error goes up
                        acks.put(("error", index, str(e)))
                        return
                    writer.write(payload[ncrc:], payload[:ncrc])
                finally:
                    msg.release()
                if last:
                    writer.finish()         # final (renamed; synced if so set) before the last ack leaves
                acks.put(("ok", seq, last))
                if last:
                    break
        except Exception as e:
            acks.put(("stop", None, str(e)))
            if not isinstance(e, TransportError):
                log(f"datanode {self.name}", f"pipeline for block {block} dropped: {type(e).__name__}: {e}")
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


def _nonneg(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise DfsError(f"{what} must be a non-negative integer, got {str(value)[:40]!r}")
    return value


def _block_id(value) -> int:
    return _nonneg(value, "block id")


def _address(value) -> tuple[str, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2 or not isinstance(value[0], str)
            or isinstance(value[1], bool) or not isinstance(value[1], int) or not 0 < value[1] < 65536):
        raise DfsError(f"bad datanode address {str(value)[:60]!r}")
    return value[0], value[1]


def _error(bad: int, reason: str) -> dict:
    return {"op": "ack", "seq": -1, "status": "error", "bad": bad, "reason": reason}


def register(meta: tuple[str, int], name: str, address, attempts: int = 50) -> None:
    tcp = get_transport("tcp")
    for i in range(attempts):
        try:
            conn = auth.connect(tcp, meta, timeout=CONNECT_TIMEOUT)
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
    parser.add_argument("--impl", default="auto", help="native|python: who runs the packet pipeline "
                        "(auto: native where the core is installed and speaks the transport: tcp, or verbs where the "
                        "native verbs end runs)")
    parser.add_argument("--sync-on-close", action="store_true",
                        help="fsync a replica's files and directory before it is final and acknowledged "
                        "(HDFS's dfs.datanode.synconclose; off by default, as there)")
    return node_main(parser, _run, argv, label="datanode")


def _run(args) -> int:
    host, _, port = args.meta.rpartition(":")
    node = DataNode(args.name, args.dir, args.transport, meta=(host, int(port)), impl=args.impl,
                    sync_on_close=args.sync_on_close)
    listener = node.transport.listen(args.host, args.port)
    register((host, int(port)), args.name, listener.address)
    server = serve(listener, node.handle, f"datanode {args.name}").start()
    serve_until_signalled(server.stop, ready=lambda: announce(
        "listening", transport=args.transport, address=listener.address))
    return 0


if __name__ == "__main__":
    sys.exit(main())
