"""TestDFSIO's per-task statistics, its result formulas and its printed block.

Per task: size (bytes) and time (ms of the I/O, from opening the file to closing it); io rate =
size * 1000 / (time * 2^20) in MB/s. For the job (Hadoop's ``analyzeResult``):

- Throughput mb/sec     = total MB / (sum of task times in s)
- Average IO rate mb/sec = mean of the task rates
- IO rate std deviation  = sqrt(|mean(rate^2) - mean(rate)^2|)
- Test exec time sec     = wall time of the whole job

Hadoop computes these in Java ``float`` (rates summed as ``rate*1000`` floats by its reducer) and
prints them with ``DecimalFormat("#.##")`` (half-even rounding, no trailing zeros, no leading zero
before the point). We reproduce both, so the same task figures print the same block. One
difference: Hadoop's task time is whole milliseconds; ours is measured in nanoseconds and kept as
fractional milliseconds, because our tests use files small enough to finish in under 1 ms.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import numpy as np

from .options import MEGA

f32 = np.float32
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True)
class TaskResult:
    name: str
    size: int            # bytes processed
    time_ms: float       # I/O time
    node: str = ""

    @property
    def rate(self) -> float:
        """MB/s, Hadoop's ``ioRateMbSec`` (in float precision)."""
        return float(_task_rate(self))


def _task_rate(t: TaskResult):
    with np.errstate(divide="ignore", invalid="ignore"):
        return f32(f32(t.size) * f32(1000)) / f32(t.time_ms * MEGA)


@dataclass
class DfsioResult:
    test_type: str
    tasks: list[TaskResult]
    exec_ms: float
    date: float = field(default_factory=time.time)   # seconds since the epoch, when the job ended
    config: dict = field(default_factory=dict)        # target, fsync policy, transport, ...

    @property
    def nr_files(self) -> int:
        return len(self.tasks)

    @property
    def total_bytes(self) -> int:
        return sum(t.size for t in self.tasks)

    @property
    def total_mb(self) -> float:
        return float(f32(self.total_bytes) / f32(MEGA))

    @property
    def throughput(self) -> float:
        """MB / sum of task seconds (Hadoop: ``toMB(size) / msToSecs(time)``)."""
        time_ms = sum(t.time_ms for t in self.tasks)
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(f32(self.total_mb) / (f32(time_ms) / f32(1000)))

    def _rate_sums(self):
        rate = sqrate = f32(0)
        for t in self.tasks:   # the reducer adds rate*1000 and rate^2*1000 as floats
            r = _task_rate(t)
            rate = f32(rate + f32(r * f32(1000)))
            sqrate = f32(sqrate + f32(f32(r * r) * f32(1000)))
        return rate, sqrate

    @property
    def average_io_rate(self) -> float:
        rate, _ = self._rate_sums()
        return float(f32(f32(rate / f32(1000)) / f32(self.nr_files)))

    @property
    def io_rate_std(self) -> float:
        _, sqrate = self._rate_sums()
        med = self.average_io_rate
        return math.sqrt(abs(float(f32(f32(sqrate / f32(1000)) / f32(self.nr_files))) - med * med))

    @property
    def exec_sec(self) -> float:
        return float(f32(self.exec_ms) / f32(1000))

    def block(self) -> str:
        """The block TestDFSIO prints and appends to its result file, ending with an empty line."""
        lines = [
            f"----- TestDFSIO ----- : {self.test_type}",
            f"            Date & time: {java_date(self.date)}",
            f"        Number of files: {self.nr_files}",
            f" Total MBytes processed: {decimal_format(self.total_mb)}",
            f"      Throughput mb/sec: {decimal_format(self.throughput)}",
            f" Average IO rate mb/sec: {decimal_format(self.average_io_rate)}",
            f"  IO rate std deviation: {decimal_format(self.io_rate_std)}",
            f"     Test exec time sec: {decimal_format(self.exec_sec)}",
            "",
        ]
        return "\n".join(lines) + "\n"

    def append_to(self, res_file: str | Path) -> None:
        with open(res_file, "a") as f:
            f.write(self.block())

    def measurements(self, config: str, nodes=()) -> list:
        """``Measurement``s of this run: throughput, average IO rate, exec time and task rates."""
        from ...measure import measurement
        kind = self.test_type.replace(" ", "_")
        params = {"nr_files": self.nr_files, "total_mb": self.total_mb, **self.config}
        figures = [("throughput", self.throughput, "MB/s", "higher"),
                   ("average_io_rate", self.average_io_rate, "MB/s", "higher"),
                   ("exec_time", self.exec_sec, "s", "lower")]
        out = [measurement(f"dfsio.{kind}.{name}", [value], unit=unit, direction=direction,
                           config=config, nodes=nodes, params=params)
               for name, value, unit, direction in figures if math.isfinite(value)]
        if len(self.tasks) > 0:
            out.append(measurement(f"dfsio.{kind}.task_rate", [t.rate for t in self.tasks], unit="MB/s",
                                   direction="higher", config=config, nodes=nodes, params=params))
        return out


def decimal_format(x: float) -> str:
    """Java's ``new DecimalFormat("#.##").format(x)``: half-even on the exact binary value."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "-\u221e" if x < 0 else "\u221e"
    text = format(Decimal(x).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN), "f")
    sign = "-" if text.startswith("-") else ""
    whole, _, frac = text.lstrip("-").partition(".")
    frac = frac.rstrip("0")
    if whole == "0" and frac:
        whole = ""                 # "#" integer digits: 0.5 prints as ".5"
    if not frac and whole == "0" and sign:
        return "-0"
    return sign + whole + ("." + frac if frac else "")


def java_date(epoch: float) -> str:
    """``java.util.Date.toString()``: ``EEE MMM dd HH:mm:ss zzz yyyy`` in local time, English names."""
    t = time.localtime(epoch)
    return (f"{_DAYS[t.tm_wday]} {_MONTHS[t.tm_mon - 1]} {t.tm_mday:02d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} {time.strftime('%Z', t)} {t.tm_year}")
