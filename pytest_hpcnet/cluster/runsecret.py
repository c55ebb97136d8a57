"""The run's secret: made once by the controller, inherited by every process it starts.

The controller (the process that owns ``Launchers`` or an ``Engine``) calls ``ensure_run_secret()``
before it starts anything; the secret lives in its environment as ``HPCNET_RUN_SECRET`` and reaches the
node programs through theirs (never a command line or a file). What the services do with it is
``reference.auth``'s business; making and handing it on is the cluster layer's, which is why it is here.
"""

from __future__ import annotations

import os
import secrets
import threading

ENV = "HPCNET_RUN_SECRET"
_lock = threading.Lock()


def ensure_run_secret() -> str:
    """Make this process the run's controller if no secret is set: a fresh random secret goes into
    ``os.environ`` (so every process started from here inherits it). Returns the secret."""
    with _lock:
        value = os.environ.get(ENV)
        if not value:
            value = secrets.token_hex(32)
            os.environ[ENV] = value
        return value
