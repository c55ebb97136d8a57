"""Reference RPC: a Hadoop IPC v9 compatible client and server over any reference transport.

Two implementations with one interface (``impl``): ``python`` (``RpcClient``, ``RpcServer``: the
readable reference, every transport) and ``native`` (``native.NativeRpcClient``/``NativeRpcServer``:
the compiled core, tcp, shm and verbs). ``make_client`` and ``make_server`` pick one by name.
"""

from .client import RpcClient  # noqa: F401
from .errors import RpcConnectionLost, RpcError, RpcFatalError, RpcRemoteError, RpcTimeout  # noqa: F401
from .server import RpcServer  # noqa: F401
from .wire import ECHO_PROTOCOL, MAX_DATA_LENGTH  # noqa: F401


def make_client(address, impl: str = "python", **options):
    """An RPC client of implementation ``impl`` (``python`` | ``native``; ``auto``: native if built)."""
    from ..native import resolve_impl
    if resolve_impl(impl) == "native":
        from .native import NativeRpcClient
        return NativeRpcClient(address, **options)
    return RpcClient(address, **options)


def make_server(impl: str = "python", **options):
    """An RPC server (not started) of implementation ``impl``."""
    from ..native import resolve_impl
    if resolve_impl(impl) == "native":
        from .native import NativeRpcServer
        return NativeRpcServer(**options)
    return RpcServer(**options)
