"""The node-program protocol: announcements (flushed at once, one parser), serving until signalled, the
shared main's one-line errors, and await_ready's errors for a program that dies or stays silent."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_hpcnet.cluster import local_cluster
from pytest_hpcnet.cluster.launcher import LocalLauncher
from pytest_hpcnet.cluster.nodeprogram import (Announcement, await_ready, format_announcement,
                                               parse_announcement)
from pytest_hpcnet.errors import LaunchError


@pytest.fixture
def node(tmp_path):
    return local_cluster(1, tmp_path / "cluster").nodes[0]


@pytest.fixture
def launcher(tmp_path):
    launcher = LocalLauncher(logdir=tmp_path / "logs")
    yield launcher
    launcher.close()


def program(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


@pytest.mark.parametrize("line, expected", [
    ("listening on tcp 127.0.0.1:4242 (buffers=pooled, impl=native)",
     Announcement("listening", "tcp", "127.0.0.1", 4242, {"buffers": "pooled", "impl": "native"})),
    ("listening on shm [::1]:80", Announcement("listening", "shm", "::1", 80)),
    ("ready", Announcement("ready")),
    ("sent (bytes=1024)", Announcement("sent", details={"bytes": "1024"})),
    ("  ready  \n", Announcement("ready")),
])
def test_announcements_parse_and_print_back_the_same(line, expected):
    assert parse_announcement(line) == expected
    assert parse_announcement(str(expected)) == expected


@pytest.mark.parametrize("line", ["listening 127.0.0.1 4242", "echo ok 1.2 us", "", "{\"json\": 1}",
                                  "listening on tcp 127.0.0.1:port", "ready (no equals sign)"])
def test_other_output_is_not_an_announcement(line):
    assert parse_announcement(line) is None


def test_a_value_that_would_break_the_line_is_refused_when_announcing():
    with pytest.raises(ValueError, match="values lack"):
        format_announcement("listening", note="a, b")
    with pytest.raises(ValueError, match="a word"):
        format_announcement("two words")


def test_await_ready_reads_the_announcement_among_other_output_of_a_block_buffered_program(launcher, node):
    """stdout to a file is block-buffered: the announcement arrives only because announce() flushes."""
    proc = launcher.start(node, program("""
        import sys, time
        from pytest_hpcnet.cluster.nodeprogram import announce
        print("starting up")            # not flushed: buffered with what follows
        announce("listening", transport="tcp", address=("127.0.0.1", 5555), role="test")
        time.sleep(60)
    """))
    found = await_ready(proc, timeout=30)
    assert (found.address, found.details) == (("127.0.0.1", 5555), {"role": "test"})
    assert proc.poll() is None


def test_await_ready_names_a_program_that_exits_first_with_its_stderr(launcher, node):
    proc = launcher.start(node, program("import sys; print('no such file', file=sys.stderr); sys.exit(3)"))
    with pytest.raises(LaunchError, match=r"exited with 3 before it would announce 'listening'; stderr: no such file"):
        await_ready(proc, timeout=30)


def test_await_ready_gives_up_on_a_silent_program_and_kills_it(launcher, node):
    proc = launcher.start(node, program("import time; print('ready-ish', flush=True); time.sleep(60)"))
    with pytest.raises(LaunchError, match=r"did not announce 'ready' within"):
        await_ready(proc, "ready", timeout=0.5)
    assert proc.wait(10) is not None


def test_await_ready_on_a_pipe_leaves_what_follows_in_it():
    proc = subprocess.Popen(program("""
        from pytest_hpcnet.cluster.nodeprogram import announce
        print("noise"); announce("ready"); print("42", flush=True)
    """), stdout=subprocess.PIPE, text=True)
    try:
        assert await_ready(proc, "ready", timeout=30).event == "ready"
        assert proc.stdout.readline() == "42\n"
    finally:
        proc.wait(30)


SERVING = """
    import sys
    from pathlib import Path
    from pytest_hpcnet.cluster.nodeprogram import announce, serve_until_signalled
    serve_until_signalled(lambda: Path(sys.argv[1]).write_text("stopped"), ready=lambda: announce("ready"))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_node_program_serves_until_signalled_then_stops_cleanly(tmp_path, sig):
    marker = tmp_path / "stopped"
    proc = subprocess.Popen(program(SERVING) + [str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        await_ready(proc, "ready", timeout=30)
        proc.send_signal(sig)     # right after the announcement: the handlers are in place already
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert marker.read_text() == "stopped"


def test_the_shared_main_turns_a_library_error_into_one_line_and_status_2():
    done = subprocess.run(program("""
        import argparse, sys
        from pytest_hpcnet.cluster.nodeprogram import node_main
        from pytest_hpcnet.errors import ConfigError
        def run(args):
            raise ConfigError("must be positive", "--size")
        sys.exit(node_main(argparse.ArgumentParser(prog="demo"), run, [], watchdog=False))
    """), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, "demo: --size: must be positive\n")


def test_hpcnet_rpc_serve_announces_through_a_pipe_while_it_runs(tmp_path):
    """``hpcnet rpc serve | other-program``: the line reaches the other program at once, not at exit."""
    hpcnet = Path(sys.executable).with_name("hpcnet")
    reader = f"{sys.executable} -c 'import sys; print(sys.stdin.readline(), end=\"\", flush=True); sys.stdin.read()'"
    proc = subprocess.Popen(["sh", "-c", f"exec {hpcnet} rpc serve --port 0 --impl python | {reader}"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        found = await_ready(proc, timeout=60)
        assert proc.poll() is None       # the server still runs: the line came through the pipe at once
        from pytest_hpcnet.reference.rpc import RpcClient
        with RpcClient(found.address, timeout=10) as client:
            assert client.echo(b"piped") == b"piped"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_every_node_program_uses_the_shared_main():
    """The programs the controller starts on nodes: each one's ``main`` goes through ``node_main``."""
    from pytest_hpcnet import nodeprobe
    from pytest_hpcnet.reference.dfs import datanode, metaservice
    from pytest_hpcnet.reference.mapreduce.engine import worker
    from pytest_hpcnet.workloads import rpc, socket_floor
    from pytest_hpcnet.workloads.dfsio import task
    from pytest_hpcnet.workloads.qjump import barrier, bulk
    import inspect
    for module in (nodeprobe, datanode, metaservice, worker, rpc, socket_floor, task, barrier, bulk):
        assert "node_main(" in inspect.getsource(module.main), module.__name__
