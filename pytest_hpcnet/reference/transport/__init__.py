"""Transports for the reference implementation: ``tcp`` and ``shm`` now, ``verbs`` later.

See ``base`` for the interface. ``TRANSPORTS`` maps a name to a zero-argument factory;
``get_transport(name)`` raises ``ConfigError`` for an unknown name.
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
