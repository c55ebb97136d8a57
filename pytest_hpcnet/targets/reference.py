"""The reference implementation shipped with this project, as a target."""

from __future__ import annotations

from importlib import metadata

from . import register


@register
class ReferenceTarget:
    name = "reference"

    def configurations(self) -> dict[str, dict]:
        # Transports and buffer designs join as the reference implementation grows them.
        return {"transport=tcp": {"transport": "tcp"}}

    def describe(self) -> dict:
        return {"name": self.name, "version": metadata.version("pytest-hpcnet"),
                "configurations": sorted(self.configurations())}
