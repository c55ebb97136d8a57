"""The accept loop every authenticated service shares (metadata service, datanodes, shuffle servers).

A connection goes through two stages:

1. **Authenticating** (``auth.ServerHandshake``). On tcp this costs no thread: one gate thread runs
   every pending handshake from a selector, so a flood of idle or slow strangers holds descriptors,
   not threads or buffers. At most ``max_pending`` wait at once (the oldest is dropped to make room,
   so a flood cannot lock a good client out), each for at most ``handshake_timeout`` seconds. On shm
   and verbs, whose bytes do not arrive through a socket, a pending handshake gets a short-lived
   thread, bounded by the same ``max_pending``.
2. **Served**: ``handle(conn)`` runs in its own thread; at most ``max_connections`` at once (a peer
   past that is closed and counted). Handlers wait for a request at most ``idle_timeout`` seconds
   (``Limits.idle_timeout``), so an authenticated but idle peer is closed too.

Defaults follow Hadoop where it has one: the idle limit is the IPC server's (twice
``ipc.client.connection.maxidletime`` = 20 s) for request/reply services and ``dfs.client.socket-timeout``
(60 s) inside a block transfer.
"""

from __future__ import annotations

import collections
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from . import auth
from .transport import PeerRefused, TransportClosed, TransportError, TransportTimeout


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256        # served (authenticated) connections, i.e. handler threads
    max_pending: int = 1024           # connections still authenticating
    handshake_timeout: float = auth.HANDSHAKE_TIMEOUT
    idle_timeout: float = 20.0        # between requests on a served connection


    @classmethod
    def from_env(cls) -> "Limits":
        """Defaults, overridden by ``HPCNET_SERVICE_MAX_CONNECTIONS``, ``_MAX_PENDING``,
        ``_HANDSHAKE_TIMEOUT`` and ``_IDLE_TIMEOUT`` (a run sets these for every service it starts)."""
        import os
        kw = {}
        for field, kind in (("max_connections", int), ("max_pending", int),
                            ("handshake_timeout", float), ("idle_timeout", float)):
            value = os.environ.get(f"HPCNET_SERVICE_{field.upper()}")
            if value:
                kw[field] = kind(value)
        return cls(**kw)


DEFAULT_LIMITS = Limits.from_env()
# how long stop() waits for the accept loop (one accept slice is 0.5 s), then for the sessions
STOP_JOIN_TIMEOUT = 2.0


class AuthGate:
    """What stage 1 checks: the run's credentials (``auth``). Another protocol (the Hadoop-IPC server's
    preamble and connection context) supplies its own gate with the same three members."""

    def __init__(self, who: str):
        self.who = who

    def start(self):
        """Sans-IO state of one pending connection: ``greeting()``, ``feed(bytes)``, ``done``, ``ok``,
        ``reply`` (sent when done), ``reason``, ``rest``; optional ``pushback`` (bytes handed back to
        the connection for its handler to read)."""
        return auth.ServerHandshake()

    def blocking(self, conn, timeout: float) -> bool:
        """Stage 1 on a transport whose bytes do not come through a socket (shm, verbs)."""
        return auth.serve_handshake(conn, self.who, timeout)

    def refuse(self, conn, reason: str) -> None:
        auth.count_refusal(self.who, getattr(conn, "peer", "?"), reason)


def log(who: str, message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {who}: {message}", file=sys.stderr, flush=True)


class Server:
    """Accepts on ``listener`` until ``stop()``; ``handle(conn)`` serves one authenticated connection
    (exceptions are the caller's ``guard``'s to log; the connection is closed afterwards)."""

    def __init__(self, listener, handle: Callable, who: str, limits: Limits = DEFAULT_LIMITS,
                 guard: Callable | None = None, gate=None):
        self.listener, self.handle, self.who, self.limits = listener, handle, who, limits
        self.guard = guard
        self.gate = gate or AuthGate(who)
        self._stopped = threading.Event()
        self._sessions = threading.BoundedSemaphore(limits.max_connections)
        self._pending_threads = threading.BoundedSemaphore(limits.max_pending)
        self._sel = selectors.DefaultSelector()
        self._pending: collections.OrderedDict = collections.OrderedDict()   # fd -> (conn, hs, deadline)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._new: collections.deque = collections.deque()
        self._serving, self._serving_lock = False, threading.Lock()
        self.served = 0
        self.refused_busy = 0
        self._accept_thread: threading.Thread | None = None
        self._live: dict = {}            # connection -> the thread serving it (joined by stop())
        self._live_lock = threading.Lock()

    # -- stage 0: accept ---------------------------------------------------------------------------
    def serve_forever(self) -> None:
        with self._serving_lock:
            if self._serving:   # two gate loops on one selector each take half a handshake's bytes
                raise RuntimeError(f"{self.who}: serve_forever is already running")
            self._serving = True
        gate = threading.Thread(target=self._gate_loop, name=f"{self.who}-gate", daemon=True)
        gate.start()
        try:
            while not self._stopped.is_set():
                try:
                    conn = self.listener.accept(timeout=0.5)
                except TransportTimeout:
                    continue
                except PeerRefused as e:              # e.g. shm: another user's process
                    self.gate.refuse(None, str(e))
                    continue
                except TransportError as e:
                    if self._stopped.is_set():
                        return
                    if "Errno 24" in str(e) or "Errno 23" in str(e):   # out of descriptors: wait
                        log(self.who, f"accept failed: {e}")
                        time.sleep(0.05)
                        continue
                    if isinstance(e, TransportClosed) and "listener" in str(e):
                        log(self.who, f"listener stopped: {e}")
                        return
                    log(self.who, f"accept failed: {e}")   # one client's failed set-up
                    continue
                sock = getattr(conn, "sock", None)
                if getattr(conn, "transport", "") == "tcp" and isinstance(sock, socket.socket):
                    self._new.append(conn)
                    self._wake_w.send(b"x")
                elif self._pending_threads.acquire(blocking=False):
                    threading.Thread(target=self._handshake_thread, args=(conn,), daemon=True).start()
                else:
                    self.gate.refuse(conn, "too many connections authenticating")
                    conn.close()
        finally:
            self.stop()

    def start(self) -> "Server":
        self._accept_thread = threading.Thread(target=self.serve_forever, name=f"{self.who}-accept", daemon=True)
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self.listener.close()
        except Exception:
            pass
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        # Wait for the accept loop to see the closed listener: a node program exits right after stop(),
        # and a daemon thread that comes back from the native core (its accept wakes every 200 ms)
        # while the interpreter finalizes is unwound through Rust frames, which aborts the process
        # ("FATAL: exception not rethrown").
        accept = self._accept_thread
        if accept is not None and accept is not threading.current_thread():
            accept.join(STOP_JOIN_TIMEOUT)
        # The same for the sessions: their connections are closed, so a session waiting in the core
        # for its next request comes back now, while the process is still whole, and ends.
        with self._live_lock:
            live = list(self._live.items())
        deadline = time.monotonic() + STOP_JOIN_TIMEOUT
        for conn, _ in live:
            try:
                conn.close()
            except Exception:
                pass
        for _, thread in live:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    # -- stage 1: authenticate ---------------------------------------------------------------------
    def _handshake_thread(self, conn) -> None:
        try:
            if self.gate.blocking(conn, self.limits.handshake_timeout):
                self._admit(conn)
        finally:
            self._pending_threads.release()

    def _gate_loop(self) -> None:
        while not self._stopped.is_set():
            now = time.monotonic()
            timeout = 0.5
            if self._pending:
                first = next(iter(self._pending.values()))
                timeout = max(0.0, min(timeout, first[2] - now))
            for key, _ in self._sel.select(timeout):
                if key.data is None:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                    continue
                self._read_pending(key.fd)
            while self._new:
                self._start_pending(self._new.popleft())
            now = time.monotonic()
            for fd, (conn, hs, deadline) in list(self._pending.items()):
                if deadline > now:
                    break                        # ordered by arrival, so by deadline
                self._drop(fd, f"no credentials within {self.limits.handshake_timeout:.0f}s")
        for fd in list(self._pending):
            self._drop(fd, "server stopping", count=False)

    def _start_pending(self, conn) -> None:
        sock = conn.sock
        while len(self._pending) >= self.limits.max_pending:     # make room: drop the oldest
            self._drop(next(iter(self._pending)), "too many connections authenticating")
        hs = self.gate.start()
        try:
            if hs.greeting():
                sock.sendall(hs.greeting())       # small: fits an empty socket buffer at once
            fd = sock.fileno()
            self._sel.register(fd, selectors.EVENT_READ, conn)
        except (OSError, ValueError):
            conn.close()
            return
        self._pending[fd] = (conn, hs, time.monotonic() + self.limits.handshake_timeout)

    def _read_pending(self, fd: int) -> None:
        entry = self._pending.get(fd)
        if entry is None:        # readiness of a descriptor no longer pending (seen once in a test run
            try:                 # whose connections closed fast): nothing to read for it here
                self._sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            return
        conn, hs, _ = entry
        try:
            data = conn.sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as e:
            return self._drop(fd, f"connection failed during authentication: {e}")
        if not data:
            return self._drop(fd, "closed during authentication")
        hs.feed(data)
        if not hs.done:
            return
        if not hs.ok or hs.rest:
            return self._drop(fd, hs.reason or "sent data before authenticating", reply=hs.reply)
        del self._pending[fd]
        self._sel.unregister(fd)
        try:
            if hs.reply:
                conn.sock.sendall(hs.reply)
        except OSError:
            conn.close()
            return
        pushback = getattr(hs, "pushback", b"")
        if pushback:
            conn.unread(pushback)
        self._admit(conn)

    def _drop(self, fd: int, reason: str, reply: bytes = b"", count: bool = True) -> None:
        conn, _, _ = self._pending.pop(fd)
        try:
            self._sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        if reply:
            try:
                conn.sock.send(reply, socket.MSG_DONTWAIT)
            except OSError:
                pass
        if count:
            self.gate.refuse(conn, reason)
        conn.close()

    # -- stage 2: serve ----------------------------------------------------------------------------
    def _admit(self, conn) -> None:
        if not self._sessions.acquire(blocking=False):
            self.refused_busy += 1
            self.gate.refuse(conn, f"already serving {self.limits.max_connections} connections")
            conn.close()
            return
        self.served += 1
        warm = getattr(getattr(conn, "buffers", None), "warm", None)
        if warm is not None:
            warm()
        thread = threading.Thread(target=self._session, args=(conn,), daemon=True)
        with self._live_lock:
            self._live[conn] = thread
        thread.start()

    def _session(self, conn) -> None:
        try:
            if self.guard is not None:
                self.guard(self.handle, conn, self.who)
            else:
                try:
                    self.handle(conn)
                except TransportError:
                    pass
                finally:
                    conn.close()
        finally:
            with self._live_lock:
                self._live.pop(conn, None)
            self._sessions.release()
