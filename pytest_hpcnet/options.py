"""The plugin's settings and the one function that decides where each value comes from.

Every setting can be given four ways; the first one present wins:
command line (``--hpcnet-cluster``) > environment (``HPCNET_CLUSTER``) > ini (``hpcnet_cluster``) > default.
Each value is parsed by the setting's own parser, and a bad value raises ``ConfigError`` naming the
origin (``--hpcnet-rounds``, ``$HPCNET_ROUNDS``, ``hpcnet_rounds in pytest.ini``), so the user knows
which of the four to fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value < 2:
        raise ValueError(f"needs at least 2 rounds for a paired comparison, got {value}")
    return value


def _fraction(text: str) -> float:
    """A regression size: '20%' or '0.2' (both mean a 20% regression)."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"expected a regression such as '20%' or '0.2', got {text!r}") from None
    if not 0 < value <= 10:
        raise ValueError(f"expected a regression above 0% and at most 1000%, got {text!r}")
    return value


def _flag(text) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected yes or no (1/0, true/false), got {text!r}")


def _nonempty(text: str) -> str:
    text = str(text).strip()
    if not text:
        raise ValueError("must not be empty")
    return text


def _verdicts(text: str) -> str:
    text = str(text).strip()
    if text not in ("enforce", "report"):
        raise ValueError(f"expected 'enforce' or 'report', got {text!r}")
    return text


def _directory(text: str) -> str:
    path = Path(_nonempty(text))
    if not path.is_dir():
        raise ValueError(f"{str(path)!r} is not a directory" if path.exists() else f"no such directory {str(path)!r}")
    return str(path)


def _probe_errors(text: str) -> str:
    text = str(text).strip()
    if text not in ("error", "warn"):
        raise ValueError(f"expected 'error' or 'warn', got {text!r}")
    return text


def _tables(text: str) -> str:
    text = str(text).strip()
    if text not in ("auto", "summary", "compact", "full"):
        raise ValueError(f"expected auto, summary, compact or full, got {text!r}")
    return text


def _words(value) -> list[str]:
    """A list option: repeated CLI flags, or comma/space separated text from env or ini."""
    if isinstance(value, (list, tuple)):
        items = [w for v in value for w in str(v).replace(",", " ").split()]
    else:
        items = str(value).replace(",", " ").split()
    return items


@dataclass(frozen=True)
class Setting:
    name: str                 # "cluster" -> --hpcnet-cluster, HPCNET_CLUSTER, hpcnet_cluster
    help: str
    default: Any
    parse: Callable[[Any], Any] = _nonempty
    many: bool = False        # repeatable flag / list value
    switch: bool = False      # a flag without a value on the command line (env/ini still say yes/no)
    shown: str | None = None  # the default as --help says it, when the value itself is None or a list

    @property
    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        if self.default in (None, []):
            return "none"
        return "no" if self.default is False else str(self.default)

    @property
    def flag(self) -> str:
        return f"--hpcnet-{self.name.replace('_', '-')}"

    @property
    def env(self) -> str:
        return f"HPCNET_{self.name.upper()}"

    @property
    def ini(self) -> str:
        return f"hpcnet_{self.name}"


SETTINGS = (
    Setting("cluster", "cluster to run on: local:N (N nodes on this host), or a TOML inventory path",
            "local:4"),
    Setting("target", "stack under test (reference, ...)", "reference"),
    Setting("claims", "extra claims files (TOML) besides suites/*/claims.toml", [],
            parse=lambda v: [str(Path(p)) for p in _words(v)], many=True),
    Setting("report", "directory for run records (JSON)", ".hpcnet", parse=lambda v: str(Path(_nonempty(v)))),
    Setting("rounds", "paired rounds per comparison (baseline and candidate interleaved)", None,
            parse=_positive_int, shown="30"),
    Setting("max_rounds", "budget of paired rounds: while a claim's CI straddles a bound, more rounds are "
            "taken up to this many before it settles on warn", None,
            parse=_positive_int, shown="3x the rounds each comparison started with"),
    Setting("canary", "inject this regression (e.g. 20%) into the candidate of every enforced local gate; "
            "each must then FAIL, and a gate that passes fails its test", None, parse=_fraction),
    Setting("strict_warn", "a claim that warns fails its test, like a failed one", False, parse=_flag,
            switch=True),
    Setting("assume", "declare a hardware feature the probe can't see (repeatable)", [],
            parse=_words, many=True),
    Setting("verdicts", "what a failed claim does: enforce (fails its test) or report (recorded and "
            "printed as failed, the test passes: for tracking, and for rehearsing claims off their hardware)",
            "enforce", parse=_verdicts),
    Setting("sysroot", "read /sys and /proc of every node under this directory (canned hardware trees)",
            None, parse=_directory, shown="/"),
    Setting("asv", "at the end of the run, add its record to this asv project of claims over time "
            "(as `hpcnet asv-import RUN.json --into DIR`; made when missing)", None,
            parse=lambda v: str(Path(_nonempty(v)))),
    Setting("probe_errors", "a node whose hardware probe fails: error (stop the run, naming the node and "
            "the cause) or warn (run on, that node having only its declared features)", "error",
            parse=_probe_errors),
    Setting("tables", "how much the end-of-run summary shows: summary (verdict counts, FAIL/WARN lines), "
            "compact (claims and one row per measurement), full (every key, the distributions, each claim's "
            "statement and source), or auto: summary under -q, full under -v, compact otherwise", "auto",
            parse=_tables),
)
BY_NAME = {s.name: s for s in SETTINGS}


def resolve(setting: Setting, cli_value, environ: dict | None = None, ini_value=None,
            ini_file: str | None = None) -> tuple[Any, str]:
    """Return (parsed value, where it came from) by the precedence CLI > env > ini > default."""
    environ = os.environ if environ is None else environ
    if setting.many:
        empty = not cli_value
    else:
        empty = cli_value is None
    candidates = [
        (cli_value, setting.flag, not empty),
        (environ.get(setting.env), f"${setting.env}", setting.env in environ),
        (ini_value, f"{setting.ini} in {ini_file or 'the ini file'}", ini_value not in (None, "", [])),
    ]
    for raw, where, present in candidates:
        if present:
            try:
                return setting.parse(raw), where
            except ValueError as e:
                raise ConfigError(str(e), where) from None
    return setting.default, "default"


def env_int(name: str, default: int, environ: dict | None = None) -> int:
    """A positive whole number from environment variable ``name`` (how paper-scale tests take their
    sizes and counts, none of which may be 0), or ``default`` when it is unset; a bad value is a
    ConfigError naming the variable."""
    environ = os.environ if environ is None else environ
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"expected a whole number, got {text!r}", f"${name}") from None
    if value < 1:
        raise ConfigError(f"expected a positive whole number, got {text!r}", f"${name}")
    return value
