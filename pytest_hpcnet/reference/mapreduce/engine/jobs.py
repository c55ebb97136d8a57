"""TeraGen, TeraSort, TeraValidate, RandomWriter and Sort as engine jobs.

Each job validates its arguments before touching the disk, runs its tasks on the engine's workers and
commits its output atomically with ``records.committed_output`` (temporary dir next to the output,
rename, ``_SUCCESS``): if the job fails, the temporary dir is removed and the output dir never
appears. The output dir must be reachable from every node (on a multi-host cluster, put it under the
shared dir). Results are ``driver.JobResult``; the single-process modules one level up are the
correctness reference these jobs are tested against.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from ....errors import ConfigError
from ..partition import PARTITION_FILENAME, sample_split_points, write_partition_file
from ..records import RECORD_LENGTH, committed_output, input_files, input_splits, part_name
from ..teragen import MASK128, split_ranges
from ..teravalidate import FileValidation, is_valid_report, reduce_validations
from .config import EngineConfig, parse_config
from .driver import Engine, JobResult


def _absolute(path) -> Path:
    """Workers run in their node's work dir: every path they get must be absolute."""
    return Path(path).absolute()


def _positive(value: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be a whole number >= 1, got {value!r}", where)
    return value


def teragen(engine: Engine, rows: int, outdir: str | os.PathLike, maps: int = 1, start_row: int = 0) -> JobResult:
    """``rows`` TeraGen rows as ``maps`` files part-m-NNNNN; ``details["checksum"]`` is TeraValidate's."""
    _positive(maps, "teragen --maps")
    outdir = _absolute(outdir)
    split_ranges(rows, maps, start_row)
    t0 = time.perf_counter()
    with committed_output(outdir, "teragen OUTDIR") as tmp:
        results = engine.run_map_only("teragen", [{"rows": rows, "index": i, "maps": maps, "start": start_row,
                                                   "outdir": str(tmp)} for i in range(maps)])
    checksum = sum(int(r["checksum"], 16) for r in results) & MASK128
    dt = time.perf_counter() - t0
    return JobResult("teragen", "", dt, {"map": dt}, records=sum(r["rows"] for r in results),
                     output=Path(outdir), details={"checksum": format(checksum, "x")}, id=engine.job_id,
                     slot_seconds=engine.slot_seconds)


def randomwriter(engine: Engine, outdir: str | os.PathLike, total_bytes: int, maps: int = 1,
                 seed: int = 0) -> JobResult:
    """RandomWriter's framed key/value files, one per map, the same bytes as the single-process tool."""
    _positive(maps, "randomwriter --maps")
    outdir = _absolute(outdir)
    if total_bytes < 0:
        raise ConfigError(f"byte count must be >= 0, got {total_bytes}", "randomwriter --bytes")
    t0 = time.perf_counter()
    with committed_output(outdir, "randomwriter OUTDIR") as tmp:
        results = engine.run_map_only("randomwriter", [{"total_bytes": total_bytes, "index": i, "maps": maps,
                                                        "seed": seed, "outdir": str(tmp)} for i in range(maps)])
    dt = time.perf_counter() - t0
    return JobResult("randomwriter", "", dt, {"map": dt}, records=sum(r["records"] for r in results),
                     output=Path(outdir), details={"bytes": sum(r["bytes"] for r in results)}, id=engine.job_id,
                     slot_seconds=engine.slot_seconds)


def split_bytes_for(files: list[Path], maps: int | None) -> int:
    """Split size that gives about ``maps`` splits (whole records), or Hadoop's default."""
    from ..records import DEFAULT_SPLIT_BYTES
    if maps is None:
        return DEFAULT_SPLIT_BYTES
    _positive(maps, "terasort --maps")
    total = sum(p.stat().st_size for p in files)
    per = math.ceil(total / maps / RECORD_LENGTH) * RECORD_LENGTH
    return max(RECORD_LENGTH, per)


def terasort(engine: Engine, indir: str | os.PathLike, outdir: str | os.PathLike, reduces: int = 1,
             config: EngineConfig | str = "", maps: int | None = None) -> JobResult:
    """Sort TeraGen data into ``reduces`` totally ordered files (sampled partitioner, Hadoop's sampling)."""
    _positive(reduces, "terasort --reduces")
    config = parse_config(config)
    indir, outdir = _absolute(indir), _absolute(outdir)
    files = input_files(indir, "terasort INDIR")
    if Path(outdir).exists():
        raise ConfigError(f"output directory {str(outdir)!r} already exists", "terasort OUTDIR")
    splits = input_splits(files, split_bytes_for(files, maps))
    t0 = time.perf_counter()
    points = sample_split_points(splits, reduces)
    sample_s = time.perf_counter() - t0
    args = [{"path": str(s.path), "start": s.start, "length": s.length,
             "split_points": [p.hex() for p in points], "reduces": reduces} for s in splits]
    with committed_output(outdir, "terasort OUTDIR") as tmp:
        write_partition_file(tmp / PARTITION_FILENAME, points)
        result = engine.run_mapreduce("terasort", config, "terasort_map", args, reduces, "terasort_reduce", tmp)
    result.output = Path(outdir)
    result.seconds = time.perf_counter() - t0
    result.phases = {"sample": sample_s, **result.phases}
    result.details["split_points"] = [p.hex() for p in points]
    result.details["maps"] = len(splits)
    return result


def sort(engine: Engine, indir: str | os.PathLike, outdir: str | os.PathLike, reduces: int = 1,
         config: EngineConfig | str = "") -> JobResult:
    """Sort RandomWriter's files (one map per file, hash partitioner): each output file key-sorted."""
    _positive(reduces, "sort --reduces")
    config = parse_config(config)
    indir, outdir = _absolute(indir), _absolute(outdir)
    files = input_files(indir, "sort INDIR")
    if Path(outdir).exists():
        raise ConfigError(f"output directory {str(outdir)!r} already exists", "sort OUTDIR")
    t0 = time.perf_counter()
    args = [{"path": str(p), "reduces": reduces} for p in files]
    with committed_output(outdir, "sort OUTDIR") as tmp:
        result = engine.run_mapreduce("sort", config, "sort_map", args, reduces, "sort_reduce", tmp)
    result.output = Path(outdir)
    result.seconds = time.perf_counter() - t0
    result.details["maps"] = len(files)
    return result


def teravalidate(engine: Engine, outdir: str | os.PathLike,
                 reportdir: str | os.PathLike | None = None) -> JobResult:
    """One map per file (order check + checksum), the single reduce in the driver; ``details["lines"]``
    is the report, ``details["valid"]`` whether it is a lone checksum line."""
    outdir = _absolute(outdir)
    reportdir = _absolute(reportdir) if reportdir is not None else None
    files = input_files(outdir, "teravalidate OUTDIR")
    if reportdir is not None and Path(reportdir).exists():
        raise ConfigError(f"output directory {str(reportdir)!r} already exists", "teravalidate REPORTDIR")
    t0 = time.perf_counter()
    found = engine.run_map_only("validate", [{"path": str(p), "name": p.name} for p in files])
    validations = [FileValidation(f["name"], f["records"],
                                  bytes.fromhex(f["first_key"]) if f["first_key"] else None,
                                  bytes.fromhex(f["last_key"]) if f["last_key"] else None,
                                  int(f["checksum"], 16), list(f["errors"])) for f in found]
    lines = reduce_validations(validations)
    if reportdir is not None:
        with committed_output(reportdir, "teravalidate REPORTDIR") as tmp:
            (tmp / part_name("r", 0)).write_text("".join(line + "\n" for line in lines))
    dt = time.perf_counter() - t0
    return JobResult("teravalidate", "", dt, {"map": dt}, records=sum(v.records for v in validations),
                     output=Path(reportdir) if reportdir is not None else None,
                     details={"lines": lines, "valid": is_valid_report(lines)}, id=engine.job_id,
                     slot_seconds=engine.slot_seconds)
