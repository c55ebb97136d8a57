"""``hpcnet rpc serve`` / ``hpcnet rpc ping`` end to end, with the server as a real process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from pytest_hpcnet.cli import main


def _serve(*args, full_cli=False):
    """The server process; ``full_cli`` goes through ``hpcnet`` (slower: it imports every area)."""
    entry = ["pytest_hpcnet.cli", "rpc"] if full_cli else ["pytest_hpcnet.reference.rpc.cli"]
    return subprocess.Popen([sys.executable, "-m", *entry, "serve", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _stop(proc) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_serve_then_ping_prints_round_trip_statistics(transport, capsys):
    proc = _serve("--transport", transport, "--buffers", "naive", "--handlers", "2",
                  full_cli=transport == "tcp")
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"listening on {transport} 127.0.0.1:"), line
        address = line.split()[3]
        assert main(["rpc", "ping", address, "--transport", transport, "--size", "100",
                     "--count", "50", "--warmup", "5"]) == 0
        out = capsys.readouterr().out
        assert "round-trip" in out and "size=100 B" in out and "iterations=50" in out
        for key in ("min=", "median=", "mean=", "stdev=", "p99=", "p99.9=", "max="):
            assert key in out
    finally:
        assert _stop(proc) == 0   # SIGTERM is a clean shutdown


def test_ping_failures_are_one_line_and_nonzero(capsys):
    assert main(["rpc", "ping", "nonsense"]) == 2
    err = capsys.readouterr().err.strip()
    assert "HOST:PORT" in err and len(err.splitlines()) == 1
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["rpc", "ping", f"127.0.0.1:{port}", "--timeout", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "refused" in err and len(err.splitlines()) == 1


def test_serve_on_a_taken_port_fails_with_one_line():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        proc = _serve("--port", str(taken.getsockname()[1]))
        try:
            out, err = proc.communicate(timeout=30)
        finally:
            _stop(proc)
    assert proc.returncode == 2
    assert "cannot listen" in err and len(err.strip().splitlines()) == 1


def test_serve_and_ping_default_to_the_native_core_where_it_is_built(capsys):
    from pytest_hpcnet.reference import native
    expected = "native" if native.AVAILABLE else "python"
    proc = _serve("--handlers", "1")
    try:
        line = proc.stdout.readline()
        assert line.rstrip().endswith(f"impl={expected})"), line
        address = line.split()[3]
        assert main(["rpc", "ping", address, "--count", "20", "--warmup", "2"]) == 0
        assert f"impl={expected}" in capsys.readouterr().out
        assert main(["rpc", "ping", address, "--count", "20", "--warmup", "2", "--impl", "python"]) == 0
        assert "impl=python" in capsys.readouterr().out
    finally:
        assert _stop(proc) == 0
