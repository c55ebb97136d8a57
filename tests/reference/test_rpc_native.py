"""The native core (``impl=native``): its resource bounds, Python-dispatched methods, and the fallback
where the module is absent. The behaviour shared with the Python implementation (framing, errors,
timeouts, malformed input, 110 connections, across implementations) is suites/rpc/test_conformance.py's;
the hand-built golden packets, for both implementations, tests/reference/test_rpc_wire.py's."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.rpc import RpcConnectionLost, RpcRemoteError, make_client, make_server, wire

from test_rpc_wire import CLIENT_ID, GOLDEN_CONTEXT, GOLDEN_PREAMBLE, _recv_exact

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason=native.WHY_NOT or "native core absent")
E = wire.RpcResponseHeaderProto


@pytest.fixture
def server():
    with make_server("native", handlers=2) as s:
        yield s


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except socket.timeout:
        return False
    except ConnectionError:
        return True


def test_pipelined_calls_in_one_segment_are_all_answered_in_order(server):
    rh = wire.RequestHeaderProto(methodName="echo", declaringClassProtocolName=wire.ECHO_PROTOCOL,
                                 clientProtocolVersion=1)
    packets = b""
    for i in range(50):
        body = b"".join(wire.delimited(wire.request_header(i, CLIENT_ID), rh,
                                       wire.EchoRequestProto(payload=b"%d" % i)))
        packets += struct.pack(">I", len(body)) + body
    with socket.create_connection(server.address, timeout=10) as s:
        s.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT + packets)
        for i in range(50):
            (n,) = struct.unpack(">I", _recv_exact(s, 4))
            packet = memoryview(_recv_exact(s, n))
            hb, pos = wire.read_delimited(packet, 0)
            assert E.FromString(bytes(hb)).callId == i
            assert wire.EchoResponseProto.FromString(bytes(wire.read_delimited(packet, pos)[0])).payload \
                == b"%d" % i


def test_python_methods_errors_and_the_counters(server):
    server.register("upper", wire.EchoRequestProto, lambda r: wire.EchoResponseProto(payload=r.payload.upper()))

    def boom(r):
        raise KeyError("nope")
    server.register("boom", wire.EchoRequestProto, boom)
    with make_client(server.address, impl="native", timeout=10) as c:
        assert c.call("upper", wire.EchoRequestProto(payload=b"abc"), wire.EchoResponseProto).payload == b"ABC"
        with pytest.raises(RpcRemoteError) as info:
            c.call("boom", wire.EchoRequestProto(), wire.EchoResponseProto)
        assert info.value.class_name == "builtins.KeyError" and info.value.error_detail == E.ERROR_APPLICATION
        with pytest.raises(RpcRemoteError) as info:
            c.call("nothing", wire.EmptyRequestProto(), wire.EmptyResponseProto)
        assert info.value.error_detail == E.ERROR_NO_SUCH_METHOD
        c.ping()
        c.send_ping()
        assert c.echo(b"x" * 100) == b"x" * 100
    time.sleep(0.2)
    counters = server.counters
    assert counters["python_calls"] == 3 and counters["native_calls"] == 2
    assert counters["errors"] == 2 and counters["pings"] == 1


def test_connections_past_the_limit_are_closed_and_counted():
    with make_server("native", max_connections=2) as s:
        clients = [make_client(s.address, impl="native", timeout=5) for _ in range(2)]
        for c in clients:
            assert c.echo(b"in") == b"in"
        extra = make_client(s.address, impl="native", timeout=2)
        with pytest.raises(RpcConnectionLost):
            extra.echo(b"one too many")
        assert s.closed_reasons.get("already serving 2 connections") == 1
        for c in clients + [extra]:
            c.close()


def test_idle_and_handshake_timeouts_close_connections():
    # idle_threshold=0: idle connections close however few are open (by default only above 512)
    with make_server("native", idle_timeout=0.4, handshake_timeout=0.4, idle_threshold=0) as s:
        with socket.create_connection(s.address) as idle, socket.create_connection(s.address) as mute:
            idle.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT)
            mute.sendall(b"hrp")
            assert _closed_within(idle, 3) and _closed_within(mute, 3)
        reasons = s.closed_reasons
        assert reasons.get("idle") == 1 and reasons.get("handshake timeout") == 1


def test_idle_connections_stay_open_at_or_below_the_idle_threshold():
    with make_server("native", idle_timeout=0.3, idle_threshold=1) as s:
        with socket.create_connection(s.address) as idle:
            idle.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT)
            assert not _closed_within(idle, 1.5)
        assert "idle" not in s.closed_reasons


def test_announced_lengths_cost_no_memory_until_the_bytes_arrive():
    """100 connections each announce a 100 MB packet (under the 128 MB limit) and send 10 bytes: the
    server's buffers grow with what arrives, not with what is announced."""
    def rss_kb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    with make_server("native") as s:
        before = rss_kb()
        socks = []
        try:
            for _ in range(100):
                k = socket.create_connection(s.address)
                k.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT + struct.pack(">I", 100 << 20) + b"0123456789")
                socks.append(k)
            deadline = time.monotonic() + 10
            while s.connections < 100 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert s.connections == 100
            assert rss_kb() - before < 32 * 1024
            with make_client(s.address, impl="native", timeout=5) as c:
                assert c.echo(b"still") == b"still"
        finally:
            for k in socks:
                k.close()


def test_over_the_limit_is_fatal_with_the_limit_named():
    with make_server("native", max_data_length=1024) as s, socket.create_connection(s.address, timeout=10) as k:
        k.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT + struct.pack(">I", 4096))
        (n,) = struct.unpack(">I", _recv_exact(k, 4))
        header = E.FromString(bytes(wire.read_delimited(memoryview(_recv_exact(k, n)), 0)[0]))
        assert (header.status, header.errorDetail) == (wire.FATAL, E.FATAL_INVALID_RPC_HEADER)
        assert "ipc.maximum.data.length 1024" in header.errorMsg
        assert _closed_within(k, 3)


def test_large_responses_to_a_peer_that_does_not_read_are_held_back_not_buffered_without_end():
    with make_server("native", write_timeout=30) as s:
        with make_client(s.address, impl="native", timeout=30) as c:
            big = bytes(range(256)) * 4096   # 1 MiB
            results = []

            def call():
                results.append(c.echo(big) == big)
            threads = [threading.Thread(target=call) for _ in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert results == [True] * 12


def test_echo_samples_are_per_call_microseconds(server):
    with make_client(server.address, impl="native") as c:
        samples = c.echo_samples(64, 200, 20)
    assert len(samples) == 200 and all(0 < x < 1e6 for x in samples)


def test_floor_drivers_time_a_raw_ping_pong():
    floor = native.core.FloorServer("127.0.0.1", 0)
    try:
        samples = native.core.pingpong(*floor.address, 64, 100, 10)
        assert len(samples) == 100 and all(0 < x < 1e6 for x in samples)
        pp = native.core.PingPong(*floor.address, 1024)
        assert len(pp.samples(10)) == 10
    finally:
        floor.stop()


def test_without_the_module_python_is_the_fallback_and_native_is_refused_in_words():
    code = """
import sys
sys.modules['pytest_hpcnet_native'] = None   # as if it were not installed
from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.rpc import make_client, make_server
from pytest_hpcnet.errors import ConfigError
assert not native.AVAILABLE and native.default_impl() == 'python'
assert 'make setup' in native.WHY_NOT and 'cargo' in native.WHY_NOT
try:
    make_server('native')
except ConfigError as e:
    print('refused:', e)
s = make_server('auto')
print(type(s).__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused: impl: the native core" in out.stdout and "RpcServer" in out.stdout


def test_native_refuses_what_it_does_not_implement():
    from pytest_hpcnet.errors import ConfigError
    with pytest.raises(ConfigError, match="speaks tcp, shm, verbs"):
        make_server("native", transport="udp")
    with pytest.raises(ConfigError, match="buffer design"):
        make_client(("127.0.0.1", 1), impl="native", buffers="huge")


@pytest.mark.parametrize("size", [1000, 65536])
def test_pooled_copies_nothing_per_call_and_naive_allocates_and_copies_on_both_ends(size):
    """The counters of both designs, both ends, per echo call once warm (as test_performance's gate
    counts them for the Python implementation)."""
    per_call = {}
    for buffers in ("pooled", "naive"):
        with make_server("native", buffers=buffers) as s, \
                make_client(s.address, impl="native", buffers=buffers, timeout=10) as c:
            for _ in range(5):
                c.echo(bytes(size))
            before = (c.buffers.stats, s.buffer_stats)
            for _ in range(20):
                c.echo(bytes(size))
            time.sleep(0.05)
            after = (c.buffers.stats, s.buffer_stats)
            per_call[buffers] = {k: sum(getattr(a, k) - getattr(b, k) for a, b in zip(after, before)) / 20
                                 for k in ("allocations", "copies", "messages", "pool_hits", "pool_misses")}
    assert per_call["pooled"]["copies"] == 0 and per_call["pooled"]["allocations"] == 0
    assert per_call["pooled"]["pool_hits"] == 2 and per_call["pooled"]["messages"] == 2
    assert per_call["naive"]["copies"] == 4 and per_call["naive"]["allocations"] == 4


def test_echo_for_counts_the_calls_completed_in_the_time(server):
    with make_client(server.address, impl="native") as c:
        t0 = time.monotonic()
        calls = c.echo_for(64, 0.3)
        assert 0.3 <= time.monotonic() - t0 < 2 and calls > 10


def test_a_thousand_open_connections_cost_the_server_process_little_memory_and_no_thread():
    """``hpcnet rpc serve --impl native`` with 1,000 connections past their context, each announcing a
    128 MiB packet: RSS stays under 64 MB in all (issue 16's goal) and no thread is added."""
    def usage(pid):
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads")))
        return rss / 1024, threads
    proc = subprocess.Popen([sys.executable, "-m", "pytest_hpcnet.reference.rpc.cli", "serve", "--port", "0",
                             "--impl", "native", "--handlers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    socks = []
    try:
        line = proc.stdout.readline()
        assert "impl=native" in line, line
        host, port = line.split()[3].rsplit(":", 1)
        address = (host, int(port))
        rss0, threads0 = usage(proc.pid)
        for _ in range(1000):
            k = socket.create_connection(address)
            k.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT + struct.pack(">I", wire.MAX_DATA_LENGTH) + b"x")
            socks.append(k)
        with make_client(address, impl="native", timeout=10) as c:   # served alongside
            assert c.echo(b"good") == b"good"
        time.sleep(0.5)
        rss, threads = usage(proc.pid)
        print(f"\nnative rpc server, 1000 connections announcing 128 MiB: RSS {rss0:.0f} -> {rss:.0f} MB, "
              f"threads {threads0} -> {threads}")
        assert rss < 64 and threads == threads0
    finally:
        for k in socks:
            k.close()
        proc.terminate()
        proc.wait(10)


def test_a_peer_that_pipelines_without_reading_is_paused_then_fully_answered(server):
    """40 MiB of echo requests sent before reading a byte: the server stops reading while its answers
    back up (not buffering without end) and resumes as they drain; every answer arrives, in order."""
    rh = wire.RequestHeaderProto(methodName="echo", declaringClassProtocolName=wire.ECHO_PROTOCOL,
                                 clientProtocolVersion=1)
    payload = bytes(range(256)) * 4096
    with socket.create_connection(server.address, timeout=30) as s:
        s.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT)

        def send():
            for i in range(40):
                body = b"".join(wire.delimited(wire.request_header(i, CLIENT_ID), rh,
                                               wire.EchoRequestProto(payload=payload)))
                s.sendall(struct.pack(">I", len(body)) + body)
        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(1.0)   # nothing read yet: the server must have paused this connection
        for i in range(40):
            (n,) = struct.unpack(">I", _recv_exact(s, 4))
            packet = memoryview(_recv_exact(s, n))
            hb, pos = wire.read_delimited(packet, 0)
            assert E.FromString(bytes(hb)).callId == i
            assert len(wire.read_delimited(packet, pos)[0]) > len(payload)
        sender.join(30)
