"""Targets: the stacks under test. Each names its configurations; workloads run against a target+config.

``reference`` is this project's own implementation; external stacks (``hadoop``) register the same way.
A configuration is a name claims refer to (``transport=shm``) and the settings it stands for.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from ..errors import ConfigError


class Target(Protocol):
    name: ClassVar[str]

    def configurations(self) -> dict[str, dict]: ...
    def describe(self) -> dict: ...


TARGETS: dict[str, type] = {}


def register(cls):
    TARGETS[cls.name] = cls
    return cls


def load_target(name: str, where: str | None = None) -> Target:
    try:
        return TARGETS[name]()
    except KeyError:
        raise ConfigError(f"unknown target {name!r} (known: {', '.join(sorted(TARGETS))})", where) from None


from . import reference  # noqa: E402,F401  (registers itself)
from . import hadoop  # noqa: E402,F401  (registers "hadoop")
