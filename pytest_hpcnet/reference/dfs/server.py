"""The accept loop the metadata service and the datanodes share (``serving.Server``: run credentials
checked before anything is served, bounded connections, idle timeouts), and a connection that sends
garbage is dropped with a logged reason while the server keeps serving."""

from __future__ import annotations

from ..serving import DEFAULT_LIMITS, Limits, Server, log
from ..transport import FrameTooLarge, TransportClosed, TransportError, TransportTimeout
from .errors import DfsError, ProtocolError
from .wire import MAX_MESSAGE, decode_request, encode


# Messages up to this size (a default 64 KiB packet and its checksums) get their buffer at once;
# a larger announced length gets a buffer that grows as the bytes arrive.
EAGER_LIMIT = 1 << 20


def serve_forever(listener, handle_connection, who: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Accept until the listener closes; ``handle_connection(conn)`` runs in its own thread once the
    peer has proved the run's credentials."""
    serve(listener, handle_connection, who, limits).serve_forever()


def serve(listener, handle_connection, who: str, limits: Limits = DEFAULT_LIMITS) -> Server:
    """The server ``serve_forever`` runs, not started yet: ``.start()`` it in the background and
    ``.stop()`` it (a node program does that on SIGTERM, ``nodeprogram.serve_until_signalled``)."""
    return Server(listener, handle_connection, who, limits, guard=_guard)


def _guard(handle_connection, conn, who: str) -> None:
    peer = getattr(conn, "peer", "?")
    conn.eager_limit = EAGER_LIMIT
    try:
        handle_connection(conn)
    except TransportClosed:
        return                                 # the peer went away: normal end of a connection
    except TransportTimeout:
        log(who, f"closed idle connection from {peer}")
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


def request_loop(conn, dispatch, idle_timeout: float = DEFAULT_LIMITS.idle_timeout) -> None:
    """Serve request/reply messages: ``dispatch(header, payload) -> reply header`` (DfsError -> error reply)."""
    while True:
        msg = conn.recv(timeout=idle_timeout, max_length=MAX_MESSAGE)
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
