"""Measurements: paired, interleaved rounds of a baseline and a candidate, and their statistics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

Direction = Literal["lower", "higher"]  # which way is better for the metric


@dataclass
class Measurement:
    """One metric of one workload under one configuration, with every sample it was computed from."""

    metric: str              # dotted name claims refer to, e.g. "rpc.echo.latency"
    value: float             # the headline figure (median of samples unless said otherwise)
    unit: str                # "us", "s", "MB/s", "calls/s", ...
    direction: Direction
    samples: list[float] = field(default_factory=list)
    config: str = ""         # named configuration, e.g. "transport=tcp"
    nodes: tuple[str, ...] = ()
    params: dict = field(default_factory=dict)   # workload parameters, e.g. {"size": 64}
    stats: dict = field(default_factory=dict)    # summary statistics (see ``summarize``)
    test: str | None = None  # pytest node id, filled in by the plugin

    def to_json(self) -> dict:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Measurement":
        d = dict(d)
        d["nodes"] = tuple(d.get("nodes", ()))
        return cls(**d)
