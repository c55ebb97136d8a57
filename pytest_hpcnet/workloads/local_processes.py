"""Servers and load clients as local processes, for the benchmarks run on one box (benchmarks/bench_*.py).

A server runs in its own session and announces its address (``cluster.nodeprogram``); the load clients
warm up, announce ``ready``, start together on ``go`` and print how many calls they made. (The suites start theirs
on cluster nodes through the launchers instead: ``workloads.rpc``.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable

import numpy as np

from ..cluster.nodeprogram import announce, await_ready
from ..errors import LaunchError
from ..measure import abba


class ServerProcess:
    """``python <args>`` in its own session; ``address`` is the one it announces (``await_ready``)."""

    def __init__(self, args: list[str], what: str = "server"):
        self.proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            self.address = await_ready(self.proc).address
        except LaunchError as e:
            self.stop()
            raise RuntimeError(f"{what} server did not start: {e}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def echo_for(client, size: int, seconds: float) -> int:
    """Echo calls of ``size`` bytes back to back for ``seconds``; how many were made."""
    payload = bytes(size)
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        client.echo(payload)
        calls += 1
    return calls


def client_loop(connect: Callable, size: int, seconds: float, loop: Callable = echo_for,
                warmup: int = 50) -> None:
    """Body of one load client process: warm up, say ready, wait for go, ``loop(client, size,
    seconds)`` (a native client's own loop keeps the interpreter out), print the count. ``connect()``
    gives a client (a context manager with ``echo``)."""
    with connect() as c:
        for _ in range(warmup):
            c.echo(bytes(size))
        announce("ready")
        sys.stdin.readline()   # start together
        calls = loop(c, size, seconds)
    print(calls, flush=True)


def calls_per_second(client_argv: list[list[str]], seconds: float, what: str) -> float:
    """Aggregate calls/s of one client process per ``python <argv>`` (each runs ``client_loop``)."""
    procs = []
    try:
        for argv in client_argv:
            procs.append(subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True))
        for p in procs:
            try:
                await_ready(p, "ready", timeout=120)
            except LaunchError as e:
                raise RuntimeError(f"{what} load client failed to start: {e}") from None
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        total = sum(int(p.stdout.readline()) for p in procs)
        for p in procs:
            p.wait(30)
        return total / seconds
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def interleaved_rounds(timers: dict, rounds: int, calls: int) -> tuple[dict, dict]:
    """``timers[path](n)`` times n round trips (us); each round times every path in ABBA order. Returns
    every sample and each round's median, per path, so ratios can be taken round by round."""
    paths = list(timers)
    samples = {p: [] for p in paths}
    round_p50 = {p: [] for p in paths}
    for forward in abba(rounds):
        for p in (paths if forward else paths[::-1]):
            s = timers[p](calls)
            samples[p] += s
            round_p50[p].append(float(np.median(s)))
    return samples, round_p50
