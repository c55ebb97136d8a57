"""The native tools that measure a fabric alone, one strategy each, and how to read their output.

Every figure is one-way latency in microseconds (perftest's ``*_lat`` and qperf's ``tcp_lat`` report
half the round trip; sockperf's ping-pong too) or bandwidth in MB/s (10^6 bytes per second as qperf
and perftest print them; a GB/sec figure is converted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Protocol

from ..errors import HpcnetError


class ToolError(HpcnetError):
    """A fabric tool could not run or printed nothing this module can read (one line, the reason)."""


class FabricTool(Protocol):
    name: str
    side: str              # "rdma" (perftest over the RDMA device) or "ip" (over an IP address)
    quantity: str          # "latency" (us, one-way) or "bandwidth" (MB/s)
    package: str           # the Debian package that ships it

    def server(self, host: str, port: int) -> list[str]: ...
    def client(self, host: str, port: int, seconds: float) -> list[str]: ...
    def parse(self, text: str) -> float: ...


_NUM = r"([0-9]+(?:\.[0-9]+)?)"


def _perftest_table(text: str, column: str) -> float:
    """The value under ``column`` in perftest's result table (the line after the header row)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("#bytes") and column in line:
            # header names may hold a space ("BW peak[MB/sec]") and are not always two spaces apart
            headers = re.findall(r"#\w+|[^\s\[\]][^\[\]]*?\[[^\]]*\]", line)
            for row in lines[i + 1:]:
                cells = row.split()
                if cells and cells[0].isdigit() and len(cells) >= len(headers):
                    value = cells[headers.index(column)]
                    if value in ("inf", "nan", "-nan"):
                        raise ToolError(f"perftest printed {value} for {column} (its clock calibration failed)")
                    return float(value)
    raise ToolError(f"no {column} figure in perftest's output: {_tail(text)}")


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "(no output)")[:160]


@dataclass(frozen=True)
class Perftest:
    name: str
    quantity: str
    column: str
    size: int
    side: str = "rdma"
    package: str = "perftest"

    iterations: int = 1000

    def _mode(self, seconds: float | None) -> list[str]:
        # a latency test is a ping-pong, so both ends must run the same count: a server left at its
        # default count against a client in duration mode (-D) never finishes (seen on rxe); a bandwidth
        # client may run for a duration against a passive server
        if self.quantity == "latency":
            return ["-n", str(self.iterations)]
        return [] if seconds is None else ["-D", str(max(1, int(seconds)))]

    def server(self, host: str, port: int) -> list[str]:
        return [self.name, "-p", str(port), "-s", str(self.size), "-F", *self._mode(None)]

    def client(self, host: str, port: int, seconds: float) -> list[str]:
        return [self.name, "-p", str(port), "-s", str(self.size), "-F", *self._mode(seconds), host]

    def parse(self, text: str) -> float:
        return _perftest_table(text, self.column)


@dataclass(frozen=True)
class Qperf:
    name: str
    test: str
    quantity: str
    side: str = "ip"
    package: str = "qperf"

    def server(self, host: str, port: int) -> list[str]:
        return ["qperf", "--listen_port", str(port)]

    def client(self, host: str, port: int, seconds: float) -> list[str]:
        return ["qperf", "--listen_port", str(port), host, "-t", str(max(1, int(seconds))), self.test, "quit"]

    def parse(self, text: str) -> float:
        if self.quantity == "latency":
            m = re.search(rf"latency\s*=\s*{_NUM}\s*(ns|us|ms)\b", text)
            if not m:
                raise ToolError(f"no latency in qperf's output: {_tail(text)}")
            return float(m.group(1)) * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[m.group(2)]
        m = re.search(rf"bw\s*=\s*{_NUM}\s*(KB|MB|GB)/sec", text)
        if not m:
            raise ToolError(f"no bw in qperf's output: {_tail(text)}")
        return float(m.group(1)) * {"KB": 1e-3, "MB": 1.0, "GB": 1e3}[m.group(2)]


@dataclass(frozen=True)
class Sockperf:
    name: str = "sockperf_pingpong"
    quantity: str = "latency"
    side: str = "ip"
    package: str = "sockperf"
    size: int = 64

    def server(self, host: str, port: int) -> list[str]:
        return ["sockperf", "server", "--tcp", "-i", host, "-p", str(port)]

    def client(self, host: str, port: int, seconds: float) -> list[str]:
        return ["sockperf", "ping-pong", "--tcp", "-i", host, "-p", str(port), "-m", str(self.size),
                "-t", str(max(1, int(seconds)))]

    def parse(self, text: str) -> float:
        m = re.search(rf"percentile 50\.000\s*=\s*{_NUM}", text)   # the typical one-way latency
        if not m:
            raise ToolError(f"no median latency in sockperf's output: {_tail(text)}")
        return float(m.group(1))


class _Registry(dict):
    def add(self, tool: FabricTool) -> None:
        if tool.name in self:
            raise ValueError(f"fabric tool {tool.name!r} is registered twice")
        self[tool.name] = tool


TOOLS: _Registry = _Registry()
for _tool in (Perftest("ib_send_lat", "latency", "t_typical[usec]", 2),
              Perftest("ib_write_bw", "bandwidth", "BW average[MB/sec]", 65536),
              Qperf("qperf_tcp_lat", "tcp_lat", "latency"),
              Qperf("qperf_tcp_bw", "tcp_bw", "bandwidth"),
              Sockperf()):
    TOOLS.add(_tool)

# Which tool measures each (side, quantity) by default; sockperf can stand in for qperf's latency.
DEFAULT: dict[tuple[str, str], str] = {
    ("rdma", "latency"): "ib_send_lat", ("rdma", "bandwidth"): "ib_write_bw",
    ("ip", "latency"): "qperf_tcp_lat", ("ip", "bandwidth"): "qperf_tcp_bw",
}

Runner = Callable[[FabricTool, str], str]
