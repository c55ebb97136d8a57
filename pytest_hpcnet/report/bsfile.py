"""``.bs`` files: the Naiad latency test's raw output, one barrier-sync latency in milliseconds per line.
The report's reader (``hpcnet plot cdf``, ``cdf``), and the writer the QJump workload's barrier uses.

The original files have 10,001 lines each. Reading accepts them unchanged: surrounding whitespace and
blank lines are ignored, anything else that is not a finite number is an error naming file and line.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable

from ..errors import ConfigError

DEFAULT_SAMPLES = 10_001


def read_bs(path: str | os.PathLike) -> list[float]:
    """Latencies in milliseconds, in file order."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read .bs file: {getattr(e, 'strerror', None) or e}", str(path)) from None
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        word = line.strip()
        if not word:
            continue
        try:
            value = float(word)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ConfigError(f"line {number}: expected a latency in milliseconds, got {word[:40]!r}", str(path))
        values.append(value)
    if not values:
        raise ConfigError("no samples (empty file)", str(path))
    return values


def write_bs(path: str | os.PathLike, latencies_ms: Iterable[float]) -> Path:
    """Write one value per line (milliseconds, microsecond resolution); atomically via a temp file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{v:.6f}\n" for v in latencies_ms))
    os.replace(tmp, path)
    return path
