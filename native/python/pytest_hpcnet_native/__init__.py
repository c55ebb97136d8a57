"""The compiled data path of pytest-hpcnet's reference implementation (Rust, PyO3).

Use it through ``pytest_hpcnet.reference.native``, which says why when this package is absent.
"""

from ._native import (Client, FloorServer, NativeError, PingPong, Server, __version__,  # noqa: F401
                      pingpong)
