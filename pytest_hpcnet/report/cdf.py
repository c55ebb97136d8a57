"""``hpcnet plot cdf``: the QJump paper's Figure 1c from ``.bs`` files - CDFs of barrier-sync latency.

For each (file, label): read the latencies (ms), drop samples >= 90 ms as outliers (counted per file),
convert to µs and draw the empirical CDF; the left plot spans 0-2250 µs, the right one is the same
curves zoomed to the 0.90-1.0 tail. The statistics printed per file are count, avg, median, min, max,
stdev (population, ddof=0) and percentiles 1/10/25/50/75/90/99 (linear interpolation), in µs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .bsfile import read_bs

OUTLIER_MS = 90.0
X_LIMIT_US = 2250
PERCENTILES = (1, 10, 25, 50, 75, 90, 99)


@dataclass
class Series:
    label: str
    path: Path
    latencies_us: np.ndarray   # outliers removed
    outliers: int              # samples >= OUTLIER_MS dropped


def drop_outliers(latencies_ms, limit_ms: float = OUTLIER_MS) -> tuple[np.ndarray, int]:
    """Keep samples below ``limit_ms``; return (kept, number dropped)."""
    arr = np.asarray(latencies_ms, dtype=float)
    keep = arr < limit_ms
    return arr[keep], int((~keep).sum())


def load_series(path, label: str) -> Series:
    kept_ms, dropped = drop_outliers(read_bs(path))
    if kept_ms.size == 0:
        raise ConfigError(f"every sample is >= {OUTLIER_MS:g} ms (all outliers)", str(path))
    return Series(label=label, path=Path(path), latencies_us=kept_ms * 1000.0, outliers=dropped)


def stats(latencies_us) -> dict[str, float]:
    arr = np.asarray(latencies_us, dtype=float)
    out = {"count": int(arr.size), "avg": float(arr.mean()), "median": float(np.median(arr)),
           "min": float(arr.min()), "max": float(arr.max()), "stdev": float(arr.std())}
    for q, v in zip(PERCENTILES, np.percentile(arr, PERCENTILES)):
        out[f"p{q}"] = float(v)
    return out


def stats_table(series: list[Series]) -> str:
    from tabulate import tabulate
    keys = ["count", "avg", "median", "min", "max", "stdev"] + [f"p{q}" for q in PERCENTILES]
    rows = []
    for s in series:
        st = stats(s.latencies_us)
        rows.append([s.label, s.path.name, s.outliers] + [st[k] for k in keys])
    return tabulate(rows, headers=["label", "file", "outliers"] + keys, floatfmt=".1f")


def plot_cdf(series: list[Series], out: str | os.PathLike) -> Path:
    """Draw the two-panel CDF figure into ``out`` (format from its suffix, e.g. .png, .pdf)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (full, tail) = plt.subplots(1, 2, figsize=(10, 4))
    try:
        for s in series:
            x = np.sort(s.latencies_us)
            y = np.arange(1, x.size + 1) / x.size
            for ax in (full, tail):
                ax.step(x, y, where="post", label=s.label)
        full.set_ylim(0, 1.0)
        tail.set_ylim(0.90, 1.0)
        for ax in (full, tail):
            ax.set_xlim(0, X_LIMIT_US)
            ax.set_xlabel("barrier-sync latency [µs]")
            ax.grid(True, alpha=0.3)
        full.set_ylabel("CDF")
        tail.set_title("tail (0.90-1.0)")
        full.legend(loc="lower right")
        fig.tight_layout()
        out = Path(out)
        fig.savefig(out)
    finally:
        plt.close(fig)
    return out


def parse_arguments(words: list[str], output: str | None) -> tuple[list[tuple[str, str]], Path]:
    """``FILE LABEL [FILE LABEL ...] [OUT]`` (the original script's form) or pairs plus ``-o OUT``.

    Returns ([(file, label)], output path); an OUT without a suffix gets ``.png``."""
    words = list(words)
    if len(words) % 2:
        if output is not None:
            raise ConfigError(f"both a trailing output name {words[-1]!r} and -o {output!r}; give one",
                              "hpcnet plot cdf")
        output = words.pop()
    if not words:
        raise ConfigError("expected at least one FILE LABEL pair", "hpcnet plot cdf")
    out = Path(output or "qjump-cdf.png")
    if not out.suffix:
        out = out.with_suffix(".png")
    return [(words[i], words[i + 1]) for i in range(0, len(words), 2)], out


def plot_command(args) -> int:
    pairs, out = parse_arguments(args.pairs, args.output)
    series = [load_series(f, label) for f, label in pairs]
    print(stats_table(series))
    print(f"wrote {plot_cdf(series, out)}")
    return 0
