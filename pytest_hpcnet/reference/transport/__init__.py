"""Transports for the reference implementation: ``tcp``, ``shm`` and ``verbs``.

See ``base`` for the interface. ``TRANSPORTS`` maps a name to a zero-argument factory;
``get_transport(name)`` raises ``ConfigError`` for an unknown name. ``transport_for(name, impl)`` is
the transport a component of that implementation uses: over verbs, ``native`` components use the
native core's verbs end where it can run.
"""

from __future__ import annotations

from ...errors import ConfigError
from .base import (DEFAULT_TIMEOUT, Connection, FrameTooLarge, Listener, PeerRefused, Region,  # noqa: F401
                   RemoteRegion, Transport, TransportClosed, TransportError, TransportTimeout, connect_pair)
from .shm import ShmTransport
from .tcp import TcpTransport
from . import verbs as _verbs

TRANSPORTS: dict[str, type] = {"tcp": TcpTransport, "shm": ShmTransport}


def _verbs_transport(**options):
    """Imported on use: pyverbs is optional, and its absence is reported when verbs is asked for."""
    from .verbs import VerbsTransport
    return VerbsTransport(**options)


if _verbs.looks_usable():   # listed only where it can run, so loops over TRANSPORTS stay green elsewhere
    TRANSPORTS["verbs"] = _verbs_transport


def get_transport(name: str, **options) -> Transport:
    try:
        factory = TRANSPORTS[name]
    except KeyError:
        if name == "verbs":   # known, just not usable here: say what is missing
            return _verbs_transport(**options)
        raise ConfigError(f"unknown transport {name!r}; choose one of {sorted(TRANSPORTS)}",
                          where="transport") from None
    return factory(**options)


def transport_for(name: str, impl: str, **options) -> Transport:
    """``get_transport(name)``, except that over verbs an ``impl=native`` component gets the native
    end (``verbs.native``) where it can run, and pyverbs (as ``impl=python``) where it cannot."""
    if name == "verbs" and impl == "native":
        from .verbs import native as native_verbs
        if native_verbs.unavailable() is None:
            return native_verbs.NativeVerbsTransport(**options)
    return get_transport(name, **options)
