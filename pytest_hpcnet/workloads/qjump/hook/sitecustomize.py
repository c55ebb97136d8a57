"""Runs at start-up of every Python program ``hpcnet qjump run`` starts (this directory is first on
PYTHONPATH): if ``HPCNET_SO_PRIORITY`` is set, every Internet socket the program creates or accepts gets
``SO_PRIORITY`` = that value, i.e. runs at a QJump level (the value comes from cluster.shaping).

Only Python programs are reached: the hook replaces ``socket.socket`` with a subclass, which covers
``socket.create_connection``, ``accept()``, asyncio and anything else built on the ``socket`` module.
Programs in other languages would need an LD_PRELOAD shim, which this project does not ship.

Self-contained on purpose (no ``pytest_hpcnet`` import), so it works in any Python 3 interpreter. After
installing the hook it runs the ``sitecustomize`` this one shadows, if there is one.
"""

import os
import socket as _socket_module
import sys

_ENV = "HPCNET_SO_PRIORITY"


def install(priority):
    """Make every AF_INET/AF_INET6 socket created from now on use SO_PRIORITY ``priority``."""
    base = _socket_module.socket
    if getattr(base, "_hpcnet_priority", None) is not None:
        base = base.__mro__[1]  # installed before: wrap the original class, not our wrapper

    class PrioritySocket(base):
        _hpcnet_priority = priority

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.family in (_socket_module.AF_INET, _socket_module.AF_INET6):
                self.setsockopt(_socket_module.SOL_SOCKET, _socket_module.SO_PRIORITY, priority)

    PrioritySocket.__name__ = PrioritySocket.__qualname__ = "socket"
    _socket_module.socket = PrioritySocket
    return PrioritySocket


def _chain():
    """Run the next ``sitecustomize`` on sys.path (a distribution's own), which ours hides."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _main():
    value = os.environ.get(_ENV)
    if value:
        try:
            priority = int(value, 0)
        except ValueError:
            sys.stderr.write(f"hpcnet qjump hook: {_ENV}={value!r} is not an integer; sockets left as they are\n")
        else:
            install(priority)
    _chain()


_main()
