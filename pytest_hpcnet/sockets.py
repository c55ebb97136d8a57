"""Small socket helpers the workloads share (stdlib only: they run on every node)."""

from __future__ import annotations

import random
import socket
import threading
from typing import Callable

FIRST_PORT = 10000              # below it sit well-known services; a free port is picked above it
_handed_out: set[int] = set()   # ports this process gave out: never the same one twice
# drawn from the OS, not from ``random``'s shared state: pytest-randomly seeds that alike in every
# worker at every test, and two workers would then draw the same ports in the same order
_draw = random.SystemRandom()


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


def ephemeral_ports() -> range:
    """The ports the kernel hands to outgoing connections and to ``bind(0)`` (Linux's
    ``ip_local_port_range``; its default where that cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port(address: str = "") -> int:
    """A tcp port nobody holds now, for a server that another process binds a little later.

    Why not ``bind(0)``: the kernel takes that port from its ephemeral range, the one it also gives
    every outgoing connection, so between this check and the server's own bind any connect on the
    host (a JVM's, a pytest worker's) can take it, and the server dies with "Address already in use".
    A random port outside that range can only be taken by another server; checking it on the
    wildcard address (without SO_REUSEADDR, so a port in TIME_WAIT also counts as held) and never
    giving one out twice in this process leaves only another process picking the same one in the same
    moment, one in tens of thousands."""
    ephemeral = ephemeral_ports()
    if ephemeral.start <= FIRST_PORT and ephemeral.stop > 65535:
        ephemeral = range(0)   # a host that gives every port to connects: checking is all there is
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    wildcard = "::" if family == socket.AF_INET6 else ""
    for _ in range(1000):
        port = _draw.randrange(FIRST_PORT, 65536)
        if port in ephemeral or port in _handed_out:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((wildcard, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free tcp port found in {FIRST_PORT}-65535 outside the ephemeral range "
                  f"{ephemeral.start}-{ephemeral.stop - 1}")
