"""The driver <-> worker control channel: JSON objects, one per line, over a plain TCP socket.

Small and text-based on purpose: it carries task descriptions and results (bytes of metadata), never
data; data moves through the shuffle servers and the file system.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Iterator

from ....errors import HpcnetError

MAX_LINE = 16 * 1024 * 1024
TOKEN_ENV = "HPCNET_WORKER_TOKEN"   # the driver's per-launch token for a worker; its hello carries it


class ProtocolError(HpcnetError):
    """The peer sent something that is not a JSON object per line."""


def decode_line(line: bytes) -> dict:
    try:
        message = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"control message is not JSON: {e}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"control message is not a JSON object: {line[:80]!r}")
    return message


class Channel:
    """Blocking send (thread-safe) and a message iterator over one socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._lock = threading.Lock()
        self._buf = b""

    def send(self, message: dict) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            self.sock.sendall(data)

    def feed(self, data: bytes) -> list[dict]:
        """Messages completed by ``data`` (for callers that do their own reads)."""
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        if len(self._buf) > MAX_LINE:
            raise ProtocolError(f"control line longer than {MAX_LINE} bytes")
        return [decode_line(line) for line in lines if line.strip()]

    def messages(self) -> Iterator[dict]:
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                return
            yield from self.feed(data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
