"""Named engine configurations: which transport the shuffle uses, where map output lives, and how
reducers get it.

A configuration is written as ``key=value`` pairs joined by commas, e.g.
``"transport=shm,intermediate=shared,shuffle=direct"``; omitted keys take their defaults
(``transport=tcp,intermediate=local,shuffle=fetch,net=eth``). Claims name their baseline and
candidate this way, so the parser is strict: an unknown key or value, a repeated key, or a
combination that cannot work (``shuffle=direct`` without a shared intermediate dir) is a
``ConfigError`` naming the text it came from.

- ``transport``: ``tcp`` (sockets; the IPoIB / 10GigE role), ``shm`` (same-host shared-memory rings,
  the kernel-bypass stand-in), ``verbs`` (RDMA through pyverbs: reducers RDMA-READ the segments the
  shuffle server registers; needs an RDMA device on every node, which each worker reports).
- ``intermediate``: ``local`` (each node's work dir, like Hadoop's local dirs) or ``shared`` (the
  cluster's shared dir, the Lustre role).
- ``shuffle``: ``fetch`` (a reducer asks each map's node for its segment over the transport, the
  ShuffleHandler role) or ``direct`` (a reducer reads segments straight from the shared dir,
  "MapReduce over Lustre").
- ``net``: which of a node's networks the tcp shuffle uses (``eth``, ``ib`` for IPoIB).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ....cluster.model import cross_host_reason
from ....errors import ConfigError
from ....vocabulary import ConfigKey, parse_name

# The engine's keys: their values and meaning (the reference target's vocabulary is made from these).
KEYS: dict[str, ConfigKey] = {
    "transport": ConfigKey(("tcp", "shm", "verbs"), "the shuffle's transport: tcp sockets (the IPoIB / 10GigE "
                           "role), shm same-host shared-memory rings (the kernel-bypass stand-in), verbs RDMA"),
    "intermediate": ConfigKey(("local", "shared"), "where map output lives: each node's work dir, or the "
                              "cluster's shared dir (the Lustre role)"),
    "shuffle": ConfigKey(("fetch", "direct"), "how reducers get map output: fetched from each map's node over "
                         "the transport, or read straight from the shared dir (MapReduce over Lustre)"),
    "net": ConfigKey(("eth", "ib"), "which of a node's networks the tcp shuffle uses (ib: IPoIB)"),
}
CHOICES: dict[str, tuple[str, ...]] = {key: spec.values for key, spec in KEYS.items()}
ENGINE_TRANSPORTS = ("tcp", "shm", "verbs")   # what the engine's shuffle servers can serve


@dataclass(frozen=True)
class EngineConfig:
    transport: str = "tcp"
    intermediate: str = "local"
    shuffle: str = "fetch"
    net: str = "eth"

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if value not in CHOICES[f.name]:
                raise ConfigError(f"{f.name}={value!r} is not one of {', '.join(CHOICES[f.name])}",
                                  "engine configuration")
        if self.shuffle == "direct" and self.intermediate != "shared":
            raise ConfigError("shuffle=direct reads map output straight from the shared dir, so it "
                              "needs intermediate=shared", "engine configuration")

    @property
    def name(self) -> str:
        """The canonical spelling (every key, fixed order): equal configs have equal names."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    def __str__(self) -> str:
        return self.name


def parse_config(text: str | EngineConfig, where: str = "engine configuration") -> EngineConfig:
    """``"transport=shm,intermediate=shared"`` -> EngineConfig; ``""`` is the default config."""
    if isinstance(text, EngineConfig):
        return text
    if not isinstance(text, str):
        raise ConfigError(f"expected a string like 'transport=tcp,intermediate=local', got {text!r}", where)
    values: dict[str, str] = {}
    for key, value in parse_name(text, where):
        if value is None:
            raise ConfigError(f"{key!r} in {text!r} is not key=value", where)
        if key not in CHOICES:
            raise ConfigError(f"unknown key {key!r} in {text!r}; known: {', '.join(CHOICES)}", where)
        if key in values:
            raise ConfigError(f"{key!r} is given twice in {text!r}", where)
        values[key] = value
    try:
        return EngineConfig(**values)
    except ConfigError as e:
        raise ConfigError(f"{text!r}: {str(e).split(': ', 1)[1]}", where) from None


def check_runnable(config: EngineConfig, cluster) -> None:
    """Refuse, with a reason, a configuration this cluster and engine cannot run."""
    where = f"engine configuration {config.name!r}"
    if config.transport not in ENGINE_TRANSPORTS:
        raise ConfigError(f"transport {config.transport!r} is not available in the reference engine "
                          f"(available: {', '.join(ENGINE_TRANSPORTS)})", where)
    if config.intermediate == "shared" and cluster.shared is None:
        raise ConfigError(f"intermediate=shared needs a shared dir, and cluster {cluster.name!r} has none",
                          where)
    reason = cross_host_reason(config.transport, cluster.nodes)
    if reason:
        raise ConfigError(f"{reason} (cluster {cluster.name!r})", where)
    missing = [n.name for n in cluster.nodes if config.net not in n.addresses]
    if missing:
        raise ConfigError(f"net={config.net} but node(s) {', '.join(missing)} have no {config.net!r} address",
                          where)

