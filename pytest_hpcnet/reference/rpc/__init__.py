"""Reference RPC: a Hadoop IPC v9 compatible client and server over any reference transport."""

from .client import RpcClient  # noqa: F401
from .errors import RpcConnectionLost, RpcError, RpcFatalError, RpcRemoteError, RpcTimeout  # noqa: F401
from .server import RpcServer  # noqa: F401
from .wire import ECHO_PROTOCOL, MAX_DATA_LENGTH  # noqa: F401
