"""The reference implementation shipped with this project, as a target."""

from __future__ import annotations

from importlib import metadata

from . import register


@register
class ReferenceTarget:
    name = "reference"

    def configurations(self) -> dict[str, dict]:
        """One entry per setting a named configuration may name (``transport=shm,buffers=naive``).

        Transports are the ones that can run here (``verbs`` only with pyverbs and an active RDMA port).
        """
        from ..reference.transport import TRANSPORTS
        settings = {"transport": sorted(TRANSPORTS), "buffers": ["pooled", "naive"], "net": ["eth", "ib"],
                    "intermediate": ["local", "shared"], "shuffle": ["fetch", "direct"]}
        return {f"{key}={value}": {key: value} for key, values in settings.items() for value in values}

    def describe(self) -> dict:
        return {"name": self.name, "version": metadata.version("pytest-hpcnet"),
                "configurations": sorted(self.configurations())}
