"""Moved to ``pytest_hpcnet.workloads.qjump.scenarios`` (see this package's docstring)."""

from ..workloads.qjump.scenarios import *  # noqa: F401,F403
from ..workloads.qjump.scenarios import measurements, run_experiment  # noqa: F401
