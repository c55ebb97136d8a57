"""The metadata service process (namenode role): serves ``Namespace`` over the tcp transport.

    python -m pytest_hpcnet.reference.dfs.metaservice --dir D [--host H] [--port P]

announces ``listening on tcp <host>:<port>`` (``cluster.nodeprogram``) once it accepts connections and
serves until SIGTERM/SIGINT. Requests and replies are ``wire``
messages; an ``op`` it does not know, or a malformed request, is an error reply, and bytes that are
not a message at all drop that connection only.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from ...cluster.nodeprogram import announce, node_main, serve_until_signalled
from ..transport import get_transport
from .errors import DfsError
from .namespace import Namespace
from .server import request_loop, serve


class MetaService:
    def __init__(self, state_dir: Path):
        self.ns = Namespace(Path(state_dir) / "namespace.json")
        self.lock = threading.Lock()

    def dispatch(self, h: dict, payload) -> dict:
        op = h["op"]
        ns = self.ns
        calls = {
            "register": lambda: ns.register(h["name"], h["address"]),
            "create": lambda: ns.create(h["path"], h["replication"], h["block_size"], h.get("overwrite", False)),
            "append": lambda: ns.append(h["path"]),
            "add_block": lambda: ns.add_block(h["path"], h.get("writer"), h.get("exclude", ())),
            "bump_gen": lambda: ns.bump_gen(h["path"], h["block"]),
            "commit_block": lambda: ns.commit_block(h["path"], h["block"], h["gen"], h["length"], h["locations"]),
            "complete": lambda: ns.complete(h["path"]),
            "get": lambda: ns.get(h["path"]),
            "truncate": lambda: ns.truncate(h["path"], int(h["length"])),
            "delete": lambda: ns.delete(h["path"], bool(h.get("recursive", False))),
            "list": lambda: ns.listing(h["path"]),
            "datanodes": lambda: {"datanodes": dict(ns.datanodes)},
        }
        if op not in calls:
            raise DfsError(f"unknown op {op!r}")
        with self.lock:
            return calls[op]()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    return node_main(parser, _run, argv, label="metaservice")


def _run(args) -> int:
    args.dir.mkdir(parents=True, exist_ok=True)
    service = MetaService(args.dir)
    listener = get_transport("tcp").listen(args.host, args.port)
    server = serve(listener, lambda conn: request_loop(conn, service.dispatch), "metaservice").start()
    serve_until_signalled(server.stop, ready=lambda: announce(
        "listening", transport="tcp", address=listener.address))
    return 0


if __name__ == "__main__":
    sys.exit(main())
