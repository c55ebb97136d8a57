"""Errors the library raises for bad input.

The library never imports pytest; the plugin turns these into ``pytest.UsageError`` so a user sees one
line naming where the bad value came from, not a traceback.
"""


class HpcnetError(Exception):
    """Base class for every error the project reports to a user."""


class ConfigError(HpcnetError, ValueError):
    """A bad option, inventory or claims file. ``where`` names its origin (file, option, env var)."""

    def __init__(self, message: str, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class LaunchError(HpcnetError, RuntimeError):
    """A process could not be started on a node, or a node is unreachable."""
