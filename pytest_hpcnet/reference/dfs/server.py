"""The accept loop the metadata service and the datanodes share: a thread per connection, and a
connection that sends garbage is dropped with a logged reason while the server keeps serving."""

from __future__ import annotations

import sys
import threading
import time

from ..transport import FrameTooLarge, TransportClosed, TransportError, TransportTimeout
from .errors import DfsError, ProtocolError
from .wire import MAX_MESSAGE, decode_request, encode


def log(who: str, message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {who}: {message}", file=sys.stderr, flush=True)


def serve_forever(listener, handle_connection, who: str) -> None:
    """Accept until the listener closes; ``handle_connection(conn)`` runs in its own thread."""
    while True:
        try:
            conn = listener.accept(timeout=3600)
        except TransportTimeout:
            continue
        except TransportError as e:
            log(who, f"listener stopped: {e}")
            return
        threading.Thread(target=_guard, args=(handle_connection, conn, who), daemon=True).start()


def _guard(handle_connection, conn, who: str) -> None:
    peer = getattr(conn, "peer", "?")
    try:
        handle_connection(conn)
    except TransportClosed:
        return                                 # the peer went away: normal end of a connection
    except FrameTooLarge as e:
        log(who, f"dropped connection from {peer}: {e} (garbage or a foreign protocol)")
    except ProtocolError as e:
        log(who, f"dropped connection from {peer}: {e}")
    except TransportError as e:
        log(who, f"connection from {peer} failed: {e}")
    except Exception as e:  # a bug must not take the server down with it
        log(who, f"connection from {peer} ended by an internal error: {type(e).__name__}: {e}")
    finally:
        conn.close()


def request_loop(conn, dispatch) -> None:
    """Serve request/reply messages: ``dispatch(header, payload) -> reply header`` (DfsError -> error reply)."""
    while True:
        msg = conn.recv(timeout=3600, max_length=MAX_MESSAGE)
        try:
            header, payload = decode_request(msg.view)
            try:
                reply = {"status": "ok", **dispatch(header, payload)}
            except (DfsError, KeyError, TypeError, ValueError) as e:
                if isinstance(e, ProtocolError):
                    raise
                reply = {"status": "error", "kind": type(e).__name__, "reason": str(e) or type(e).__name__}
        finally:
            msg.release()
        conn.send(encode(reply))
