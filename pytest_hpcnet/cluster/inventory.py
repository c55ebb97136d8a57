"""Cluster inventories: a TOML file that names the nodes of a real (or embedded) cluster.

    [cluster]                     # optional; defaults every node inherits
    name = "osu-ri"               # default: the file's stem
    launcher = "ssh"              # a key of LAUNCHERS; default "local"
    workdir = "/scratch/hpcnet"   # per-node local disk
    shared = "/lustre/hpcnet"     # a directory every node sees (Lustre, NFS, ...)
    features = ["ib_qdr"]         # declared by hand, added to every node's own list
    sysroot = "/"                 # where the hardware probe reads /sys and /proc
    python = "/opt/venv/bin/python"   # the interpreter on the nodes (ssh, slurm); default: this
                                  # process's own path (a shared install)
    controller = { eth = "10.0.0.100", ib = "192.168.1.100" }   # where nodes reach this host (per
                                  # network); default: the source address this host uses to reach the
                                  # first node's address on that network

    [cluster.ssh]                 # settings for one launcher, shared by every node
    user = "hpcnet"

    [[nodes]]
    name = "ri-node01"            # unique
    host = "ri-node01.example"    # how the launcher reaches it
    addresses = { eth = "ri-node01.example", ib = "ri-node01-ib.example" }   # default: { eth = host }
    workdir = "..."  shared = "..."  features = [...]  launcher = "..."  sysroot = "..."
    [nodes.ssh]                   # per-node launcher settings, merged over [cluster.ssh]
    port = 2222

Relative paths resolve against the inventory file's directory. Any key not listed here is an error,
and every error names the file, the node and the field. Feature names are not checked here: the hardware
module knows which exist.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError
from .launcher import known_launchers
from .model import Cluster, Node


class _Bad(Exception):
    """A value's problem, without its location; ``_Table`` adds file, node and field."""


# --- one converter per kind of value: (raw TOML value, inventory dir) -> model value, or raise _Bad ---

def _string(value: Any, base: Path) -> str:
    if not isinstance(value, str):
        raise _Bad(f"must be a string, got {_kind(value)} {value!r}")
    if not value.strip():
        raise _Bad("must not be empty")
    return value


def _path(value: Any, base: Path) -> Path:
    return base / _string(value, base)  # an absolute path stays as it is under "/"


def _string_list(value: Any, base: Path) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Bad(f"must be a list of non-empty strings, got {value!r}")
    return frozenset(value)


def _features(value: Any, base: Path) -> frozenset[str]:
    from ..features import unknown_feature
    names = _string_list(value, base)
    for name in sorted(names):
        if problem := unknown_feature(name):
            raise _Bad(problem)
    return names


def _path_list(value: Any, base: Path) -> tuple[Path, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _Bad(f"must be a list of file paths, got {value!r}")
    return tuple(base / v for v in value)


def _addresses(value: Any, base: Path) -> dict[str, str]:
    if not isinstance(value, dict) or not value:
        raise _Bad(f"must be a table of network = \"address\", e.g. {{ eth = \"host1\" }}, got {value!r}")
    for network, address in value.items():
        if not isinstance(address, str) or not address:
            raise _Bad(f"address on network {network!r} must be a non-empty string, got {address!r}")
    return dict(value)


def _launcher(value: Any, base: Path) -> str:
    name = _string(value, base)
    if name not in known_launchers():
        raise _Bad(f"unknown launcher {name!r} (known: {', '.join(sorted(known_launchers()))})")
    return name


def _integer(value: Any, base: Path) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Bad(f"must be an integer, got {_kind(value)} {value!r}")
    return value


def _kind(value: Any) -> str:
    return {str: "string", bool: "boolean", int: "integer", float: "float", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


# --- the schema: field -> converter. Launcher settings tables are keyed by launcher name. ---

_CLUSTER_FIELDS: dict[str, Callable] = {
    "name": _string, "launcher": _launcher, "workdir": _path, "shared": _path,
    "features": _features, "sysroot": _path, "controller": _addresses, "python": _string,
    "claims": _path_list,
}
_NODE_FIELDS: dict[str, Callable] = {
    "name": _string, "host": _string, "addresses": _addresses, "workdir": _path, "shared": _path,
    "features": _features, "launcher": _launcher, "sysroot": _path, "python": _string,
}
_NODE_REQUIRED = ("name", "host", "workdir")  # workdir may also come from [cluster]

# A launcher declares its settings as ``settings = {"port": int, "user": str, "identity_file": Path}``.
_SETTING_CONVERTERS: dict[type, Callable] = {str: _string, int: _integer, Path: _path, list: _string_list,
                                             bool: lambda v, base: _boolean(v, base)}


def _boolean(value: Any, base: Path) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"must be true or false, got {_kind(value)} {value!r}")
    return value


class _Table:
    """One TOML table being read, with the words that locate it in error messages."""

    def __init__(self, raw: Any, file: Path, where: str):
        self.file, self.where = file, where
        if not isinstance(raw, dict):
            raise self.error(None, f"must be a table, got {_kind(raw)} {raw!r}")
        self.raw = raw

    def error(self, field: str | None, message: str) -> ConfigError:
        place = f"{self.where}, field {field!r}" if field else self.where
        return ConfigError(f"{place}: {message}", where=str(self.file))

    def read(self, fields: dict[str, Callable]) -> tuple[dict[str, Any], dict[str, dict]]:
        """Convert every known field; return (fields, launcher settings tables). Unknown keys fail."""
        values, settings = {}, {}
        for key, value in self.raw.items():
            if key in fields:
                values[key] = self._convert(key, value, fields[key])
            elif key in known_launchers() and isinstance(value, dict):
                settings[key] = self._read_settings(key, value)
            else:
                known = sorted(fields) + [f"[{name}] settings table" for name in sorted(known_launchers())]
                raise self.error(key, f"unknown key (known: {', '.join(known)})")
        return values, settings

    def _read_settings(self, launcher: str, raw: dict) -> dict[str, Any]:
        schema = getattr(known_launchers()[launcher], "settings", {})
        out = {}
        for key, value in raw.items():
            field = f"{launcher}.{key}"
            if key not in schema:
                known = ", ".join(sorted(schema)) or "none"
                raise self.error(field, f"unknown {launcher} setting (known: {known})")
            out[key] = self._convert(field, value, _SETTING_CONVERTERS[schema[key]])
        return out

    def _convert(self, field: str, value: Any, convert: Callable) -> Any:
        try:
            return convert(value, self.file.parent)
        except _Bad as e:
            raise self.error(field, str(e)) from None


def load_inventory(path: Path) -> Cluster:
    """Read a TOML inventory into a ``Cluster``; raise ``ConfigError`` naming file, node and field."""
    path = Path(path).absolute()
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read inventory: {e.strerror or e}", where=str(path)) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", where=str(path)) from None

    top = _Table(doc, path, "inventory")
    for key in doc:
        if key not in ("cluster", "nodes"):
            raise top.error(key, "unknown top-level key (known: [cluster], [[nodes]])")
    defaults, default_settings = _Table(doc.get("cluster", {}), path, "[cluster]").read(_CLUSTER_FIELDS)

    raw_nodes = doc.get("nodes")
    if isinstance(raw_nodes, dict):
        raise top.error("nodes", "write each node as [[nodes]] (double brackets: one entry per node), "
                                 "not [nodes]")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise top.error("nodes", "needs at least one [[nodes]] entry")
    nodes: list[Node] = []
    first_index: dict[str, int] = {}
    for index, raw in enumerate(raw_nodes):
        label = f"nodes[{index}]"
        if isinstance(raw, dict) and isinstance(raw.get("name"), str):
            label += f" ({raw['name']!r})"
        table = _Table(raw, path, label)
        node = _read_node(table, defaults, default_settings)
        if node.name in first_index:
            raise table.error("name", f"duplicate node name {node.name!r} "
                                      f"(first used by nodes[{first_index[node.name]}])")
        first_index[node.name] = index
        nodes.append(node)

    if "controller" in defaults:
        controller, how = defaults["controller"], f"inventory: [cluster] controller in {path.name}"
    else:
        controller, how = derive_controller(nodes)
    return Cluster(name=defaults.get("name", path.stem), nodes=tuple(nodes), source=str(path),
                   shared=defaults.get("shared"), controller=controller, controller_source=how,
                   claims=defaults.get("claims", ()))


def derive_controller(nodes) -> tuple[dict[str, str], str]:
    """Per network, the source address this host would use to reach the first node there (a UDP
    ``connect`` picks the route; no packet is sent). Networks it cannot resolve are left out."""
    import socket
    out, notes = {}, []
    for network in sorted({net for n in nodes for net in n.addresses}):
        target = next(n.addresses[network] for n in nodes if network in n.addresses)
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(target, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                out[network] = s.getsockname()[0]
            notes.append(f"{network}: route to {target}")
        except OSError as e:
            notes.append(f"{network}: none ({target}: {e})")
    return out, "derived: " + "; ".join(notes)


def _read_node(table: _Table, defaults: dict[str, Any], default_settings: dict[str, dict]) -> Node:
    values, settings = table.read(_NODE_FIELDS)
    for field in _NODE_REQUIRED:
        if field not in values and field not in defaults:
            raise table.error(field, "missing (required)"
                              + (", or set it once in [cluster]" if field in _CLUSTER_FIELDS else ""))
    inherited = {k: v for k, v in defaults.items()
                 if k in _NODE_FIELDS and k not in ("name", "features", "controller")}
    merged = {**inherited, **values}
    merged["features"] = defaults.get("features", frozenset()) | values.get("features", frozenset())
    merged.setdefault("addresses", {"eth": merged["host"]})
    extra = {name: {**default_settings.get(name, {}), **settings.get(name, {})}
             for name in default_settings.keys() | settings.keys()}
    return Node(**merged, extra=extra)
