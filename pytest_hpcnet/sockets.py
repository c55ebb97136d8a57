"""Small socket helpers the workloads share (stdlib only: they run on every node)."""

from __future__ import annotations

import socket
import threading
from typing import Callable


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; a peer that closes first is a ConnectionError, not a short read."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"peer closed the connection after {got} of {len(view)} bytes")
        got += n


def accept_in_background(listener: socket.socket, handle: Callable[[socket.socket], None], *,
                         thread_per_connection: bool, name: str) -> threading.Thread:
    """Accept on ``listener`` in a daemon thread until it is closed (how a node program shuts down);
    ``handle(conn)`` runs in the accepting thread (one connection at a time) or in a thread of its own."""
    def loop():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:   # the listener was closed: shutting down
                return
            if thread_per_connection:
                threading.Thread(target=handle, args=(conn,), daemon=True).start()
            else:
                handle(conn)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread
