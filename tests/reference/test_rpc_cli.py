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


def test_serve_falls_back_to_python_with_the_reason_where_the_native_core_is_absent(capsys):
    """As on a box without cargo (or the Soft-RoCE guest, which does not build the core): ``serve`` and
    ``ping`` run the Python implementation and say why on stderr, one line each."""
    hide = "import sys; sys.modules['pytest_hpcnet_native'] = None; from pytest_hpcnet.reference.rpc.cli import main; "
    proc = subprocess.Popen([sys.executable, "-c", hide + "sys.exit(main(['serve', '--handlers', '1']))"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.rstrip().endswith("impl=python)"), line
        address = line.split()[3]
        ping = subprocess.run([sys.executable, "-c", hide + f"sys.exit(main(['ping', '{address}', '--count', '5']))"],
                              capture_output=True, text=True, timeout=60)
        assert ping.returncode == 0 and "impl=python" in ping.stdout, ping.stderr
        assert "hpcnet rpc ping: impl=python: the native core (pytest_hpcnet_native) is not installed" in ping.stderr
    finally:
        assert _stop(proc) == 0
    err = proc.stderr.read()
    assert "hpcnet rpc serve: impl=python: the native core (pytest_hpcnet_native) is not installed" in err
    assert "Traceback" not in err


VERBS_LISTED = ("import sys; from pytest_hpcnet.reference import transport; "
                "transport.TRANSPORTS.setdefault('verbs', transport._verbs_transport); "   # as where pyverbs is
                "from pytest_hpcnet.reference.rpc.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("hidden", [False, True], ids=["core-built", "core-absent-as-in-the-guest"])
def test_serve_over_verbs_is_python_by_default_and_native_is_refused_in_one_line(hidden):
    """verbs defaults to the Python implementation (native verbs is chosen by name): the default falls
    back with the reason, then serves (or, with no RDMA device here, fails in one line, exit 2);
    ``--impl native`` without a native core, or without an RDMA device, fails in one line. Never a
    traceback."""
    from pytest_hpcnet.reference import native
    code = VERBS_LISTED.replace("import sys;", "import sys; sys.modules['pytest_hpcnet_native'] = None;") \
        if hidden else VERBS_LISTED
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--transport", "verbs", "--handlers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
    finally:
        status = _stop(proc)
    err = proc.stderr.read()
    assert "Traceback" not in err
    why = ("the native core (pytest_hpcnet_native) is not installed" if hidden or not native.AVAILABLE
           else "the native core is the default for tcp and shm only, not verbs (--impl native picks it)")
    assert f"hpcnet rpc serve: impl=python: {why}" in err, err
    if line:   # an RDMA device is here: it served
        assert line.rstrip().endswith("impl=python)") and status == 0, line
    else:      # none: one more line saying so, exit 2
        assert status == 2 and len(err.strip().splitlines()) == 2, err
    refused = subprocess.run([sys.executable, "-c", code, "serve", "--transport", "verbs", "--impl", "native"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert ("not installed" if hidden or not native.AVAILABLE else "RDMA") in refused.stderr, refused.stderr


def test_the_rpc_server_keeps_hadoops_simple_auth_under_a_run_secret(monkeypatch):
    """The Hadoop-IPC server is the one service without the run's challenge-response (issue 15): Hadoop's
    own clients cannot answer it. With ``HPCNET_RUN_SECRET`` set, the default server (native where built)
    serves a plain Hadoop-IPC client exactly as the Python server does, and listens on loopback."""
    from pytest_hpcnet.reference import auth
    from pytest_hpcnet.reference.rpc import RpcClient
    monkeypatch.setenv(auth.ENV, "a-run-secret")
    for impl in (["--impl", "python"], []):
        proc = _serve("--handlers", "1", *impl)
        try:
            line = proc.stdout.readline()
            address = line.split()[3]
            assert address.startswith("127.0.0.1:"), line
            host, port = address.rsplit(":", 1)
            with RpcClient((host, int(port)), timeout=10) as c:   # preamble + context, no HMAC exchange
                assert c.echo(b"simple") == b"simple"
        finally:
            assert _stop(proc) == 0
