"""What an RPC caller can get instead of a response."""

from __future__ import annotations

from ...errors import HpcnetError


class RpcError(HpcnetError):
    """Base of every RPC failure."""


class RpcTimeout(RpcError, TimeoutError):
    """No response within the call's timeout (the connection stays usable)."""


class RpcConnectionLost(RpcError, ConnectionError):
    """The connection to the server failed or was closed; pending and later calls get this."""


class RpcRemoteError(RpcError):
    """The server answered ERROR (or FATAL): ``class_name`` and ``message`` are the server's words."""

    def __init__(self, class_name: str, message: str, error_detail: int | None = None,
                 fatal: bool = False):
        self.class_name, self.message, self.error_detail, self.fatal = (class_name, message,
                                                                        error_detail, fatal)
        super().__init__(f"{'FATAL ' if fatal else ''}{class_name}: {message}")


class RpcFatalError(RpcRemoteError, RpcConnectionLost):
    """The server answered FATAL and closed the connection."""

    def __init__(self, class_name: str, message: str, error_detail: int | None = None):
        super().__init__(class_name, message, error_detail, fatal=True)
