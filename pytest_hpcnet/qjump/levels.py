"""Moved to ``pytest_hpcnet.cluster.shaping`` (see this package's docstring)."""

from ..cluster.shaping import *  # noqa: F401,F403
from ..cluster.shaping import QJumpParams  # noqa: F401
