"""Hadoop's own benchmark programs run as commands, and their outputs parsed.

Each runner returns a ``HadoopJobResult``: exit status, wall time, the YARN application ids the
client printed, the job counters, and the program's parsed figures in ``details`` (TeraValidate's
checksum line, the TestDFSIO block, ``Total calls per second``). A failed program raises
``HadoopJobError`` with the tail of what it printed.

Paths are Hadoop paths: ``/x`` is on the cluster's default FS (HDFS), ``file:///abs`` is local --
which is how the cross-conformance checks hand files between Hadoop and the reference.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ConfigError, HpcnetError
from .budget import CLIENT_S, JOB_S
from .runtime import HadoopRuntime

APP_ID = re.compile(r"Submitted application (application_\d+_\d+)")
COUNTER = re.compile(r"^\s+([A-Za-z_][\w .:()/-]*?)=(-?\d+)\s*$", re.M)
CALLS_PER_SECOND = re.compile(r"^Total calls per second: ([0-9.eE+-]+)\s*$", re.M)
SORT_VALIDATED = "SUCCESS! Validated the MapReduce framework's 'sort' successfully."
DFSIO_LABELS = {"Number of files": "nr_files", "Total MBytes processed": "total_mb",
                "Throughput mb/sec": "throughput", "Average IO rate mb/sec": "average_io_rate",
                "IO rate std deviation": "io_rate_std", "Test exec time sec": "exec_sec"}


class HadoopJobError(HpcnetError, RuntimeError):
    """A Hadoop program failed; the message names it and ends with what it printed last."""


@dataclass
class HadoopJobResult:
    program: str
    argv: list[str]
    returncode: int
    wall_s: float
    output: str                                   # stdout + stderr
    app_ids: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    details: dict = field(default_factory=dict)


def _tail(text: str, n: int = 30) -> str:
    lines = text.splitlines()
    errors = [ln for ln in lines if "Exception" in ln or "ERROR" in ln][-8:]
    return "\n".join(errors + ["..."] + lines[-n:])


def run_program(rt: HadoopRuntime, program: str, args: list, *, conf_dir=None, defines: dict | None = None,
                timeout: float = JOB_S, check: bool = True, cwd=None) -> HadoopJobResult:
    argv = rt.argv(program, [str(a) for a in args], conf_dir=conf_dir, defines=defines)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              stdin=subprocess.DEVNULL, env=rt.program_env(program, conf_dir))
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise HadoopJobError(f"hadoop {program} did not finish in {timeout:.0f}s\n{_tail(out)}") from None
    wall = time.monotonic() - t0
    output = proc.stdout + proc.stderr
    result = HadoopJobResult(program, argv, proc.returncode, wall, output, APP_ID.findall(output),
                             {k.strip(): int(v) for k, v in COUNTER.findall(output)})
    if check and proc.returncode != 0:
        raise HadoopJobError(f"hadoop {program} {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"{_tail(output)}")
    return result


def _positive(value: int, where: str) -> int:
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be a positive integer, got {value!r}", where)
    return value


# -- TeraSort family -----------------------------------------------------------------------------
def teragen(rt, rows: int, out: str, *, maps: int = 2, conf_dir=None, defines=None) -> HadoopJobResult:
    _positive(rows, "teragen rows")
    d = {"mapreduce.job.maps": _positive(maps, "teragen maps"), **(defines or {})}
    r = run_program(rt, "teragen", [rows, out], conf_dir=conf_dir, defines=d)
    r.details["checksum"] = r.counters.get("CHECKSUM")   # TeraGen's counter: the sum of record CRC32s
    return r


def terasort(rt, indir: str, outdir: str, *, reduces: int = 2, conf_dir=None, defines=None) -> HadoopJobResult:
    d = {"mapreduce.job.reduces": _positive(reduces, "terasort reduces"), **(defines or {})}
    return run_program(rt, "terasort", [indir, outdir], conf_dir=conf_dir, defines=d)


def teravalidate(rt, outdir: str, reportdir: str, *, conf_dir=None, defines=None) -> HadoopJobResult:
    r = run_program(rt, "teravalidate", [outdir, reportdir], conf_dir=conf_dir, defines=defines)
    report = fs_cat(rt, f"{reportdir.rstrip('/')}/part-r-00000", conf_dir=conf_dir)
    lines = report.decode(errors="replace").splitlines()
    r.details["lines"] = lines
    r.details.update(parse_teravalidate(lines))
    return r


def parse_teravalidate(lines: list[str]) -> dict:
    """``checksum\\t<hex>`` and any ``error`` lines of a TeraValidate report."""
    checksums = [ln.split("\t", 1)[1] for ln in lines if ln.startswith("checksum\t")]
    errors = [ln for ln in lines if ln.startswith("error")]
    return {"checksum": checksums[0] if checksums else None, "errors": errors,
            "valid": len(checksums) == 1 and not errors}


# -- RandomWriter / Sort / SortValidator ---------------------------------------------------------
def randomwriter(rt, out: str, total_bytes: int, *, maps: int = 2, conf_dir=None, defines=None):
    _positive(total_bytes, "randomwriter bytes")
    d = {"mapreduce.randomwriter.totalbytes": total_bytes,
         "mapreduce.randomwriter.bytespermap": -(-total_bytes // _positive(maps, "randomwriter maps")),
         **(defines or {})}
    return run_program(rt, "randomwriter", [out], conf_dir=conf_dir, defines=d)


def sort(rt, indir: str, outdir: str, *, reduces: int = 2, conf_dir=None, defines=None):
    return run_program(rt, "sort", ["-r", _positive(reduces, "sort reduces"), indir, outdir],
                       conf_dir=conf_dir, defines=defines)


def sortvalidate(rt, indir: str, outdir: str, *, conf_dir=None, defines=None):
    r = run_program(rt, "sortvalidate", ["-sortInput", indir, "-sortOutput", outdir],
                    conf_dir=conf_dir, defines=defines)
    r.details["valid"] = SORT_VALIDATED in r.output
    return r


# -- TestDFSIO -----------------------------------------------------------------------------------
def dfsio(rt, args: list[str], *, res_file: str | os.PathLike, conf_dir=None, defines=None):
    """``TestDFSIO <args> -resFile <res_file>``; details = the printed block's figures."""
    r = run_program(rt, "TestDFSIO", [*args, "-resFile", str(res_file)], conf_dir=conf_dir, defines=defines)
    try:
        text = open(res_file).read()
    except OSError as e:
        raise HadoopJobError(f"TestDFSIO wrote no result file {res_file}: {e}\n{_tail(r.output)}") from None
    blocks = parse_dfsio_blocks(text)
    if not blocks:
        raise HadoopJobError(f"no TestDFSIO block in {res_file}\n{text[-2000:]}")
    r.details = blocks[-1]
    return r


def parse_dfsio_blocks(text: str) -> list[dict]:
    """Every ``----- TestDFSIO ----- : <type>`` block of a result file, figures as floats."""
    blocks, current = [], None
    for line in text.splitlines():
        if "----- TestDFSIO ----- :" in line:
            current = {"test_type": line.split(":", 1)[1].strip()}
            blocks.append(current)
            continue
        if current is None or ":" not in line:
            continue
        label, value = (part.strip() for part in line.split(":", 1))
        key = DFSIO_LABELS.get(label)
        if key:
            try:
                current[key] = float(value.replace(",", ""))
            except ValueError:
                raise HadoopJobError(f"TestDFSIO block: {label} = {value!r} is not a number") from None
    return blocks


# -- RPCCallBenchmark ----------------------------------------------------------------------------
def rpc_benchmark(rt, *, clients: int, seconds: int, msg_size: int, port: int, host: str = "127.0.0.1",
                  server_threads: int = 0, timeout: float | None = None) -> HadoopJobResult:
    """Hadoop's client threads echo ``msg_size`` bytes for ``seconds`` s against host:port (and run
    the server in the same JVM when ``server_threads`` > 0); details["calls_per_second"]."""
    args = ["-c", _positive(clients, "-c"), "-t", _positive(seconds, "-t"), "-m", msg_size,
            "-h", host, "-p", port, "-s", server_threads]
    r = run_program(rt, "RPCCallBenchmark", args, timeout=timeout or seconds + CLIENT_S)
    found = CALLS_PER_SECOND.findall(r.output)
    if not found:
        raise HadoopJobError(f"RPCCallBenchmark printed no 'Total calls per second'\n{_tail(r.output)}")
    r.details["calls_per_second"] = float(found[-1])
    return r


@contextmanager
def rpc_benchmark_server(rt, *, port: int, threads: int = 4, host: str = "127.0.0.1",
                         start_timeout: float = CLIENT_S):
    """Hadoop's RPCCallBenchmark echo server (``-s N -c 0``: it serves until killed)."""
    argv = rt.argv("RPCCallBenchmark", ["-s", str(threads), "-c", "0", "-h", host, "-p", str(port)])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=rt.program_env("RPCCallBenchmark"))
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise HadoopJobError(f"RPCCallBenchmark server exited {proc.returncode}:\n"
                                     f"{_tail(proc.stdout.read().decode(errors='replace'))}")
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise HadoopJobError(f"RPCCallBenchmark server not listening on {host}:{port} "
                                         f"after {start_timeout:.0f}s") from None
                time.sleep(0.2)
        yield (host, port)
    finally:
        from .minicluster import kill_tree
        kill_tree(proc.pid)
        proc.wait(timeout=10)
        proc.stdout.close()


# -- files ---------------------------------------------------------------------------------------
def fs_cat(rt, path: str, *, conf_dir=None) -> bytes:
    """A file's bytes. Copied to a local temp file rather than read from ``-cat``'s stdout, which the
    jars' log4j configuration shares with log lines."""
    with tempfile.TemporaryDirectory(prefix="hpcnet-fs-") as tmp:
        local = Path(tmp) / "file"
        argv = rt.argv("fs", ["-copyToLocal", path, f"file://{local}"], conf_dir=conf_dir)
        proc = subprocess.run(argv, capture_output=True, timeout=CLIENT_S, stdin=subprocess.DEVNULL,
                              env=rt.program_env("fs", conf_dir))
        if proc.returncode != 0 or not local.exists():
            raise HadoopJobError(f"hadoop fs -copyToLocal {path} exited {proc.returncode}\n"
                                 f"{_tail((proc.stdout + proc.stderr).decode(errors='replace'))}")
        return local.read_bytes()
