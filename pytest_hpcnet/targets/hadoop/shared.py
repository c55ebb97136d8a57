"""One MiniCluster per process, shared by every test module that asks for it.

Several suites need a running Hadoop; starting one costs about two minutes on a 2-core box, so
``shared_minicluster()`` hands out one MiniCluster, counted: the first user starts it, the last one
to leave stops it (session-scoped fixtures all leave at the end of the session). A start that failed
is remembered and raised again to later users instead of retried.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

from .minicluster import MiniCluster
from .runtime import HadoopRuntime

_lock = threading.Lock()
_state: dict = {"cluster": None, "users": 0, "error": None}


@contextmanager
def shared_minicluster(runtime: HadoopRuntime, workdir: str | Path, **kw):
    with _lock:
        if _state["error"] is not None:
            raise _state["error"]
        if _state["cluster"] is None:
            try:
                _state["cluster"] = MiniCluster(runtime, workdir, **kw).start()
            except Exception as e:
                _state["error"] = e
                raise
        _state["users"] += 1
        cluster = _state["cluster"]
    try:
        yield cluster
    finally:
        with _lock:
            _state["users"] -= 1
            if _state["users"] == 0:
                _state["cluster"] = None
                cluster.stop()
