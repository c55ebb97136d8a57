"""The engine's worker: one process per node, started by the driver through the node's launcher.

    python -m pytest_hpcnet.reference.mapreduce.engine.worker --driver HOST:PORT --node NAME \
        --workdir DIR [--shared DIR] --addresses '{"eth": "127.0.0.1"}'

It starts a shuffle server per transport (tcp on each of the node's networks, shm, and verbs where the
node has an RDMA device -- on its ``ib`` address if it has one), connects to the driver's control
socket, says hello (with the servers' addresses, or why verbs could not start), and then runs the
tasks the driver sends, one at a time, replying ``done`` with the task's result or ``failed`` with the
error. A thread sends a heartbeat every ``HEARTBEAT_SECONDS``. The worker exits when the driver says
``stop`` or its connection goes away, so a dead driver never leaves workers behind.

Control messages are JSON objects, one per line (see ``protocol``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from ... import auth, native
from ....cluster.nodeprogram import node_main
from . import protocol
from .protocol import TOKEN_ENV
from ...transport import TransportError, verbs
from .shuffle import (FetchError, KeptBuffer, ShuffleServer, close_idle, fetch_segments, resolve,
                      write_map_output, write_map_output_with)
from .. import randomwriter, sort as kvsort, teragen, teravalidate
from ..partition import partition
from ..records import (RECORD_LENGTH, Split, key_columns, key_order, misordered_positions, part_name,
                       record_count)

HEARTBEAT_SECONDS = 0.5


# The two sorts below give exactly terasort.map_sort_partition's and merge_segments' results (the stable
# key order), faster: np.take instead of fancy indexing, and in the reduce a stable sort of the high key
# bytes, which finds the map segments' sorted runs and merges them instead of sorting from scratch.

def sort_and_cut(records: np.ndarray, split_points: list[bytes], reduces: int) -> list[np.ndarray]:
    """A TeraSort map's output: one sorted segment per reduce (empty ones included)."""
    ordered = np.take(records, key_order(records), axis=0) if len(records) > 1 else records
    bounds = np.searchsorted(partition(ordered, split_points), np.arange(reduces + 1), side="left")
    return [ordered[bounds[r]:bounds[r + 1]] for r in range(reduces)]


def merge_runs(segments: list[np.ndarray]) -> np.ndarray:
    """A TeraSort reduce: merge key-sorted segments into one key-sorted array (stable: map order)."""
    if not segments:
        return np.empty((0, RECORD_LENGTH), dtype=np.uint8)
    records = np.concatenate(segments)
    if len(records) < 2:
        return records
    hi, _ = key_columns(records)
    order = np.argsort(hi, kind="stable")
    ties = hi[order]
    if np.any(ties[1:] == ties[:-1]):       # equal high 8 bytes: let key_order settle the low 2 bytes
        order = key_order(records)
    return np.take(records, order, axis=0)


def check_runs(segments: list[np.ndarray], sources: list[dict] | None = None) -> None:
    """A reduce's input must be key-sorted runs: a run that is not was corrupted on its way (the Python
    merge would sort it quietly; the native one refuses it, and so does this check)."""
    for i, seg in enumerate(segments):
        bad = misordered_positions(seg)
        if len(bad):
            raise FetchError(f"segment of map {i}{_from(sources, i)} is corrupt: not key-sorted at record {bad[0]}")


def _from(sources: list[dict] | None, i: int) -> str:
    return f" (from {sources[i]['node']})" if sources and i < len(sources) else ""


def merge_python(data: list, sources: list[dict], f) -> tuple[int, float]:
    """The reduce's merge in numpy (``impl=python``): records written to ``f``, and the merge's seconds."""
    t0 = time.perf_counter()
    segs = [np.frombuffer(d, dtype=np.uint8).reshape(-1, RECORD_LENGTH) if len(d) % RECORD_LENGTH == 0
            else _partial(d, i, sources) for i, d in enumerate(data)]
    check_runs(segs, sources)
    merged = merge_runs(segs)
    t1 = time.perf_counter()
    f.write(np.ascontiguousarray(merged).reshape(-1))
    return len(merged), t1 - t0


def merge_native(data: list, sources: list[dict], f) -> tuple[int, float]:
    """The same merge in the compiled core, streamed onto ``f``'s descriptor (so merge and write are
    one step; the write is counted as merge time)."""
    t0 = time.perf_counter()
    f.flush()
    try:
        records = native.core.merge_records_to_fd(data, f.fileno())
    except ValueError as e:            # "run i is ...": a segment that is not whole or not sorted
        text = str(e)
        i = int(text.split()[1]) if text.startswith("run ") else -1
        raise FetchError(f"segment of map {i}{_from(sources, i)} is corrupt ({text})") from None
    return records, time.perf_counter() - t0


def _partial(d, i: int, sources) -> np.ndarray:
    raise FetchError(f"segment of map {i}{_from(sources, i)} is corrupt: {len(d)} bytes is not a whole "
                     f"number of {RECORD_LENGTH}-byte records")


class Worker:
    def __init__(self, node: str, workdir: Path, shared: Path | None, addresses: dict[str, str],
                 impl: str | None = None):
        self.node = node
        # native: TeraSort's map sorts and spills, and its reduce fetches (tcp) and merges, in the compiled
        # core, and the tcp server sends by sendfile, and the verbs shuffle goes through the core's verbs
        # end (serving and fetching, where it can run); python: the numpy path and pyverbs, the same bytes out
        self.impl = native.resolve_impl(impl, "mapreduce worker impl")
        self.reduce_buffer = KeptBuffer()     # where each reduce's segments land, reused by the next
        self.roots = {"local": Path(workdir)}
        if shared is not None:
            self.roots["shared"] = Path(shared)
        self.servers = []
        for net, host in sorted(addresses.items()):
            self.servers.append(("tcp", net, ShuffleServer("tcp", host, self.roots, impl=self.impl)))
        self.servers.append(("shm", None, ShuffleServer("shm", node, self.roots, impl=self.impl)))
        self.verbs_unavailable = verbs.unavailable_reason() if verbs.looks_usable() else \
            "no pyverbs or no ACTIVE RDMA port with an IPv4 address on this node"
        if self.verbs_unavailable is None:
            host = addresses.get("ib") or addresses.get("eth") or "127.0.0.1"   # loopback: the RDMA address
            try:
                self.servers.append(("verbs", None, ShuffleServer("verbs", host, self.roots, impl=self.impl)))
            except TransportError as e:
                self.verbs_unavailable = f"the verbs shuffle server did not start: {e}"

    def shuffle_addresses(self) -> dict:
        out: dict = {"tcp": {}}
        for transport, net, server in self.servers:
            if transport == "tcp":
                out["tcp"][net] = list(server.address)
            else:
                out[transport] = list(server.address)
            if transport == "verbs":   # which end serves (native with impl=native where it can run)
                out["verbs_end"] = "native" if server.native_verbs else "pyverbs"
        if self.verbs_unavailable:
            out["verbs_unavailable"] = f"{self.node}: {self.verbs_unavailable}"
        return out

    # -- tasks --------------------------------------------------------------------------------------
    def run(self, op: str, args: dict) -> dict:
        handler = getattr(self, f"op_{op}", None)
        if handler is None:
            raise ValueError(f"unknown task op {op!r}")
        return handler(**args)

    def _map_base(self, root: str, path: str) -> Path:
        return resolve(self.roots, root, path)

    def op_terasort_map(self, path, start, length, split_points, reduces, root, out):
        points = [bytes.fromhex(k) for k in split_points]
        # (an empty sample gives no split points: the other partitions are then empty, but exist)
        if self.impl == "native":
            return self._terasort_map_native(Split(Path(path), start, length), points, reduces, root, out)
        t0 = time.perf_counter()
        records = Split(Path(path), start, length).read()
        t1 = time.perf_counter()
        segments = sort_and_cut(records, points, reduces)
        t2 = time.perf_counter()
        sizes = write_map_output(self._map_base(root, out), segments)
        t3 = time.perf_counter()
        return {"records": len(records), "sizes": sizes, "seconds": {"read": t1 - t0, "sort": t2 - t1,
                                                                    "spill": t3 - t2}}

    def _terasort_map_native(self, split: Split, points: list[bytes], reduces: int, root, out):
        """The same map in the compiled core: read, sort and spill in one call (``read`` and ``spill``
        are counted in ``sort``). The partitions past the split points' are empty, as numpy's."""
        t0 = time.perf_counter()
        first, count = split.record_range()
        total = record_count(split.path)
        first = min(first, total)
        count = min(count, total - first)

        def spill(f):
            with open(split.path, "rb") as src:
                f.flush()
                sizes = native.core.terasort_sort_and_spill(src.fileno(), first, count, points, f.fileno())
            return (list(sizes) + [0] * reduces)[:reduces]
        sizes = write_map_output_with(self._map_base(root, out), spill)
        return {"records": count, "sizes": sizes, "seconds": {"read": 0.0, "sort": time.perf_counter() - t0,
                                                             "spill": 0.0}}

    def op_sort_map(self, path, reduces, root, out):
        t0 = time.perf_counter()
        records = randomwriter.read_records(path)
        segments = [randomwriter.encode_records(s) for s in kvsort.map_partition_sort(records, reduces)]
        t1 = time.perf_counter()
        sizes = write_map_output(self._map_base(root, out), segments)
        return {"records": len(records), "sizes": sizes,
                "seconds": {"sort": t1 - t0, "spill": time.perf_counter() - t1}}

    def _reduce(self, reduce, sources, transport, direct, outdir, merge):
        """Fetch reduce ``reduce``'s segments, then ``merge(data, sources, file)``: write the merged
        records to the open ``file`` and return how many there were."""
        try:
            data, fetch_s = fetch_segments(sources, reduce, transport, self.roots, direct, impl=self.impl,
                                           buffer=self.reduce_buffer)
        except FetchError:
            raise
        except OSError as e:   # direct read of a segment that vanished
            raise FetchError(f"reading map output directly failed: {e}") from None
        t0 = time.perf_counter()
        final = Path(outdir) / part_name("r", reduce)
        tmp = final.with_name(f".{final.name}.{self.node}.tmp")
        try:
            with open(tmp, "wb") as f:
                records, merge_s = merge(data, sources, f)
            os.rename(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        t2 = time.perf_counter()
        return {"records": records, "bytes": sum(len(d) for d in data),
                "seconds": {"fetch": fetch_s, "merge": merge_s, "write": t2 - t0 - merge_s}}

    def op_terasort_reduce(self, reduce, sources, transport, direct, outdir):
        return self._reduce(reduce, sources, transport, direct, outdir,
                            merge_native if self.impl == "native" else merge_python)

    def op_sort_reduce(self, reduce, sources, transport, direct, outdir):
        def merge(data, sources, f):
            t0 = time.perf_counter()
            segs = [randomwriter.decode_records(d, f"segment from map {i}") for i, d in enumerate(data)]
            merged = kvsort.merge_sorted(segs)
            payload = randomwriter.encode_records(merged)
            t1 = time.perf_counter()
            f.write(payload)
            return len(merged), t1 - t0
        return self._reduce(reduce, sources, transport, direct, outdir, merge)

    def op_teragen(self, rows, index, maps, start, outdir):
        final = Path(outdir) / part_name("m", index)
        tmp = final.with_name(f".{final.name}.{self.node}.tmp")
        result = teragen.write_teragen_split(tmp, rows, index, maps, start)
        os.rename(tmp, final)
        return {"rows": result.rows, "checksum": format(result.checksum, "x")}

    def op_randomwriter(self, total_bytes, index, maps, seed, outdir):
        final = Path(outdir) / part_name("m", index)
        tmp = final.with_name(f".{final.name}.{self.node}.tmp")
        result = randomwriter.write_random_split(tmp, total_bytes, index, maps, seed)
        os.rename(tmp, final)
        return {"records": result.records, "bytes": result.bytes}

    def op_validate(self, path, name):
        v = teravalidate.validate_file(path, name)
        return {"name": v.name, "records": v.records, "checksum": format(v.checksum, "x"),
                "first_key": v.first_key.hex() if v.first_key is not None else None,
                "last_key": v.last_key.hex() if v.last_key is not None else None, "errors": v.errors}

    def op_cleanup(self, root, path):
        shutil.rmtree(self._map_base(root, path), ignore_errors=True)
        return {}

    def close(self) -> None:
        for _, _, server in self.servers:
            server.close()


def serve(driver: tuple[str, int], worker: Worker) -> int:
    sock = socket.create_connection(driver, timeout=30)
    auth.client_handshake_socket(sock, 30)
    sock.settimeout(None)
    channel = protocol.Channel(sock)
    channel.send({"type": "hello", "node": worker.node, "pid": os.getpid(),
                  "token": os.environ.get(TOKEN_ENV, ""), "shuffle": worker.shuffle_addresses()})
    stop = threading.Event()

    def heartbeat():
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                channel.send({"type": "heartbeat"})
            except OSError:
                return
            close_idle()
    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
    try:
        for message in channel.messages():
            if message.get("type") == "stop":
                break
            if message.get("type") != "task":
                continue
            task = message["task"]
            try:
                result = worker.run(message["op"], message["args"])
                channel.send({"type": "done", "task": task, "result": result})
            except FetchError as e:
                channel.send({"type": "failed", "task": task, "error": str(e), "fetch_node": e.node})
            except Exception as e:  # a task's error goes to the driver; the worker keeps serving
                channel.send({"type": "failed", "task": task, "error": f"{type(e).__name__}: {e}",
                              "trace": traceback.format_exc()[-2000:]})
    except (OSError, protocol.ProtocolError):
        pass
    finally:
        stop.set()
        channel.close()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--driver", required=True, help="HOST:PORT of the driver's control socket")
    parser.add_argument("--node", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--shared", default="")
    parser.add_argument("--addresses", default='{"eth": "127.0.0.1"}', help="JSON {network: address}")
    parser.add_argument("--impl", default=None, choices=native.IMPLS,
                        help="data path: native (the compiled core) or python; default: native where built")
    return node_main(parser, _run, argv, label="mapreduce worker")


def _run(args) -> int:
    # No announcement: the worker dials the driver's control socket, and that connection is its "ready".
    host, _, port = args.driver.rpartition(":")
    worker = Worker(args.node, Path(args.workdir), Path(args.shared) if args.shared else None,
                    json.loads(args.addresses), impl=args.impl)
    try:
        return serve((host, int(port)), worker)
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main())
