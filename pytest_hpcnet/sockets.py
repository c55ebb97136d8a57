"""Small socket helpers the workloads share (stdlib only: they run on every node)."""

from __future__ import annotations

import socket


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; a peer that closes first is a ConnectionError, not a short read."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"peer closed the connection after {got} of {len(view)} bytes")
        got += n
