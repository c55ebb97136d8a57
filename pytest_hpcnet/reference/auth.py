"""Run credentials: who may talk to the services a run starts.

The controller (the process that owns ``Launchers`` or an ``Engine``) makes one random secret per run
(``ensure_run_secret``) and keeps it in its environment as ``HPCNET_RUN_SECRET``; every process it
starts inherits it from there. It never goes on a command line or into a file. A process started
without it (by hand, or by a stranger) makes up its own secret, so it can talk to nobody else: the
safe default.

Before a service serves anything, each new connection runs a mutual challenge--response (fixed-size,
unframed, so it works over a transport connection and over a plain socket alike)::

    server -> client   MAGIC + server nonce (32 bytes)
    client -> server   MAGIC + client nonce (32) + HMAC-SHA256(key, "client" + server nonce + client nonce)
    server -> client   0x00 + HMAC-SHA256(key, "server" + client nonce + server nonce)   (or 0x01: refused)

Both nonces are fresh per connection, so a recorded exchange cannot be replayed. The server closes a
peer that fails (or says nothing within ``HANDSHAKE_TIMEOUT``), counts it in ``refused`` and logs it;
the client raises ``AuthError`` if the server cannot prove the key either.

API (one owner per idea; services call only these):

- ``ensure_run_secret()``           the controller, once per run
- ``serve_handshake(conn, who)``    a server, on each accepted transport connection, before serving
- ``client_handshake(conn)``        a client, right after ``connect``
- ``connect(transport, address)``   connect + client handshake
- ``*_socket`` variants             the same over a plain ``socket.socket`` (engine control, region server)
- ``ServerHandshake``               sans-IO server side for event loops (the engine driver's select loop)
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import secrets
import socket
import sys
import threading
import time

from ..cluster.runsecret import ENV, ensure_run_secret  # noqa: F401  (the secret's owner; re-exported)
from .transport.base import PeerRefused, TransportError

MAGIC = b"HPCNAUTH1"
NONCE = 32
MAC = 32
GREETING_SIZE = len(MAGIC) + NONCE
RESPONSE_SIZE = len(MAGIC) + NONCE + MAC
PROOF_SIZE = 1 + MAC
HANDSHAKE_TIMEOUT = 10.0     # a peer that has not authenticated by then is dropped (slowloris bound)

refused: collections.Counter = collections.Counter()   # service name -> peers refused
_lock = threading.Lock()


class AuthError(PeerRefused):
    """The peer did not prove it holds this run's secret."""


def _key() -> bytes:
    return hashlib.sha256(b"hpcnet-run-key\0" + ensure_run_secret().encode()).digest()


def _mac(label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(_key(), label + first + second, hashlib.sha256).digest()


def count_refusal(who: str, peer, reason: str) -> None:
    with _lock:
        refused[who] += 1
    print(f"{time.strftime('%H:%M:%S')} {who}: refused {peer}: {reason}", file=sys.stderr, flush=True)


# -- sans-IO server side -------------------------------------------------------------------------------

class ServerHandshake:
    """``greeting()`` to send first; then ``feed(bytes)`` until ``done``; ``reply`` is what to send back
    (the proof, or the refusal); ``ok`` says whether the peer authenticated; ``rest`` holds bytes the
    peer sent after its response (the start of its first message)."""

    def __init__(self):
        self.nonce = secrets.token_bytes(NONCE)
        self._buf = b""
        self.done = self.ok = False
        self.reply = b""
        self.rest = b""
        self.reason = ""

    def greeting(self) -> bytes:
        return MAGIC + self.nonce

    def feed(self, data: bytes) -> None:
        if self.done:
            self.rest += data
            return
        self._buf += data
        if len(self._buf) > RESPONSE_SIZE:       # a client waits for our proof before it sends more
            return self._finish(False, "sent data before authenticating")
        if len(self._buf) < RESPONSE_SIZE:
            if not MAGIC.startswith(self._buf[:len(MAGIC)]):
                self._finish(False, "not an hpcnet client (bad magic)")
            return
        response, self.rest = self._buf[:RESPONSE_SIZE], self._buf[RESPONSE_SIZE:]
        if response[:len(MAGIC)] != MAGIC:
            return self._finish(False, "not an hpcnet client (bad magic)")
        client_nonce = response[len(MAGIC):len(MAGIC) + NONCE]
        mac = response[len(MAGIC) + NONCE:]
        if not hmac.compare_digest(mac, _mac(b"client", self.nonce, client_nonce)):
            return self._finish(False, "wrong run credentials")
        self._finish(True, "", b"\x00" + _mac(b"server", client_nonce, self.nonce))

    def _finish(self, ok: bool, reason: str, reply: bytes = b"\x01" + bytes(MAC)) -> None:
        self.done, self.ok, self.reason, self.reply = True, ok, reason, reply


def _client_response(greeting: bytes) -> tuple[bytes, bytes, bytes]:
    """(response to send, client nonce, server nonce) for a server's greeting."""
    if len(greeting) != GREETING_SIZE or greeting[:len(MAGIC)] != MAGIC:
        raise AuthError("the server did not greet like an hpcnet service")
    server_nonce = greeting[len(MAGIC):]
    client_nonce = secrets.token_bytes(NONCE)
    return MAGIC + client_nonce + _mac(b"client", server_nonce, client_nonce), client_nonce, server_nonce


def _check_proof(proof: bytes, client_nonce: bytes, server_nonce: bytes) -> None:
    if proof[:1] != b"\x00":
        raise AuthError("the server refused our run credentials (a different run's secret?)")
    if not hmac.compare_digest(proof[1:], _mac(b"server", client_nonce, server_nonce)):
        raise AuthError("the server could not prove it holds this run's secret")


# -- transport connections (tcp, shm, verbs) -----------------------------------------------------------

def serve_handshake(conn, who: str, timeout: float = HANDSHAKE_TIMEOUT) -> bool:
    """Authenticate the client of an accepted connection. On failure the connection is closed, the
    refusal counted and logged, and False returned (the caller just stops serving it)."""
    hs = ServerHandshake()
    peer = getattr(conn, "peer", "?")
    try:
        conn.send_raw(hs.greeting(), timeout=timeout)
        hs.feed(conn.recv_raw(len(MAGIC), timeout=timeout))     # a foreign protocol is refused at once
        if not hs.done:
            hs.feed(conn.recv_raw(RESPONSE_SIZE - len(MAGIC), timeout=timeout))
        conn.send_raw(hs.reply, timeout=timeout)
    except (TransportError, OSError) as e:
        hs.ok, hs.reason = False, f"no credentials within {timeout:.0f}s ({e})"
    if not hs.ok:
        count_refusal(who, peer, hs.reason)
        conn.close()
    return hs.ok


def client_handshake(conn, timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Prove our run credentials to the server and check its proof; AuthError (connection closed) if not."""
    try:
        response, cn, sn = _client_response(conn.recv_raw(GREETING_SIZE, timeout=timeout))
        conn.send_raw(response, timeout=timeout)
        _check_proof(conn.recv_raw(PROOF_SIZE, timeout=timeout), cn, sn)
    except AuthError:
        conn.close()
        raise
    except (TransportError, OSError) as e:
        conn.close()
        raise AuthError(f"authentication with {getattr(conn, 'peer', '?')} failed: {e}") from None


def connect(transport, address, timeout: float | None = None, **options):
    """``transport.connect`` followed by the client handshake: a connection the server will serve."""
    conn = transport.connect(tuple(address), timeout=timeout, **options)
    client_handshake(conn, HANDSHAKE_TIMEOUT if timeout is None else min(timeout, HANDSHAKE_TIMEOUT))
    return conn


# -- plain sockets ---------------------------------------------------------------------------------------

def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection during authentication")
        buf += chunk
    return bytes(buf)


class _SocketConnection:
    """A plain blocking socket seen through the three connection calls the handshakes use."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        try:
            self.peer = sock.getpeername()
        except OSError:
            self.peer = "?"

    def send_raw(self, data: bytes, timeout: float) -> None:
        self.sock.settimeout(timeout)
        self.sock.sendall(data)

    def recv_raw(self, n: int, timeout: float) -> bytes:
        self.sock.settimeout(timeout)
        return _recv_exact(self.sock, n)

    def close(self) -> None:
        self.sock.close()


def serve_handshake_socket(sock: socket.socket, who: str, timeout: float = HANDSHAKE_TIMEOUT) -> bool:
    """``serve_handshake`` for a plain blocking socket (its timeout is restored afterwards)."""
    old = sock.gettimeout()
    ok = serve_handshake(_SocketConnection(sock), who, timeout)
    if ok:
        sock.settimeout(old)
    return ok


def client_handshake_socket(sock: socket.socket, timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """``client_handshake`` for a plain blocking socket (its timeout is restored afterwards)."""
    old = sock.gettimeout()
    client_handshake(_SocketConnection(sock), timeout)
    sock.settimeout(old)
