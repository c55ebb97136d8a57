"""Transport layer: framing, timeouts, peer loss, one-sided put/get, shm rings, buffer counters."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from pytest_hpcnet.errors import ConfigError
from pytest_hpcnet.reference.buffers import NaiveBuffers, PooledBuffers, size_class
from pytest_hpcnet.reference.transport import (TRANSPORTS, FrameTooLarge, RemoteRegion, TransportClosed,
                                               TransportError, TransportTimeout, connect_pair, get_transport)
from pytest_hpcnet.reference.transport.shm import ShmTransport


@pytest.fixture(params=sorted(TRANSPORTS))
def pair(request):
    """A connected (client, server) pair of the parametrized transport; closed afterwards."""
    pairs = []

    def make(transport=None, buffers="pooled"):
        t = transport or get_transport(request.param)
        listener = t.listen("127.0.0.1", 0, buffers=buffers)
        client, server = connect_pair(t, listener, buffers=buffers)
        pairs.append((client, server, listener))
        return client, server

    make.name = request.param
    yield make
    for client, server, listener in pairs:
        client.close()
        server.close()
        listener.close()


def _echo_thread(conn, n):
    def run():
        for _ in range(n):
            m = conn.recv(timeout=10)
            conn.send([m.view])
            m.release()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def test_framing_round_trip_of_many_sizes(pair):
    client, server = pair()
    sizes = [0, 1, 3, 4, 63, 64, 65, 4095, 4096, 100_000, 3 << 20]
    th = _echo_thread(server, len(sizes))
    for size in sizes:
        data = random.Random(size).randbytes(size)
        client.send([data[: size // 2], data[size // 2:]])   # parts are one message
        got = client.recv(timeout=10)
        assert bytes(got.view) == data
        got.release()
    th.join(10)


def test_shm_ring_wraps_around_and_streams_messages_larger_than_the_ring():
    t = ShmTransport(capacity=4096)
    listener = t.listen("127.0.0.1", 0)
    client, server = connect_pair(t, listener)
    rng = random.Random(7)
    messages = [rng.randbytes(rng.choice([1, 100, 1000, 3000, 5000, 70_000])) for _ in range(300)]
    echo = _echo_thread(server, len(messages))
    for m in messages:   # 300 messages through a 4 KiB ring: the counters wrap many times
        client.send([m])
        r = client.recv(timeout=10)
        assert bytes(r.view) == m
    echo.join(10)
    client.close(), server.close(), listener.close()


def test_recv_times_out_and_resumes_a_partial_message(pair):
    client, server = pair()
    with pytest.raises(TransportTimeout):
        server.recv(timeout=0.05)
    client.send_raw(b"\x00\x00\x00\x05he")       # a frame header and part of the body
    with pytest.raises(TransportTimeout):
        server.recv(timeout=0.05)
    client.send_raw(b"llo")
    assert bytes(server.recv(timeout=5).view) == b"hello"


def test_peer_closing_raises_transport_closed_not_a_hang(pair):
    client, server = pair()
    client.send([b"last words"])
    client.close()
    assert bytes(server.recv(timeout=5).view) == b"last words"   # data sent before close arrives
    with pytest.raises(TransportClosed):
        server.recv(timeout=5)


def test_peer_closing_wakes_a_blocked_receiver(pair):
    client, server = pair()
    errors = []

    def blocked():
        try:
            server.recv(timeout=20)
        except Exception as e:
            errors.append(e)
    th = threading.Thread(target=blocked)
    th.start()
    threading.Timer(0.1, client.close).start()
    th.join(10)
    assert not th.is_alive()
    assert isinstance(errors[0], TransportClosed)


def test_announced_length_over_the_limit_raises_frame_too_large(pair):
    client, server = pair()
    client.send([b"x" * 2000])
    with pytest.raises(FrameTooLarge) as e:
        server.recv(timeout=5, max_length=1000)
    assert e.value.length == 2000


def test_one_sided_put_and_get_on_a_registered_region(pair):
    client, server = pair()
    region = server.register(bytearray(b"." * 64))
    client_side = RemoteRegion.from_bytes(region.remote().to_bytes())   # as it would travel
    client.put(client_side, 8, b"written-by-peer", timeout=5)
    assert bytes(region.view[8:23]) == b"written-by-peer"
    region.view[40:44] = b"abcd"
    assert client.get(client_side, 40, 4, timeout=5) == b"abcd"
    with pytest.raises(Exception):
        client.put(client_side, 60, b"too long for the region", timeout=5)


def test_connect_to_nothing_fails_cleanly():
    with pytest.raises(TransportClosed):
        get_transport("tcp").connect(("127.0.0.1", 1), timeout=2)
    with pytest.raises(TransportClosed):
        get_transport("shm").connect(("127.0.0.1", 1), timeout=2)


def test_unknown_transport_and_buffers_are_config_errors():
    with pytest.raises(ConfigError, match="verbz"):
        get_transport("verbz")
    with pytest.raises(ConfigError, match="buffers"):
        get_transport("tcp").listen("127.0.0.1", 0, buffers="fancy")


def _dev_shm():
    return set(os.listdir("/dev/shm"))


def test_shm_leaves_nothing_in_dev_shm():
    before = _dev_shm()
    t = get_transport("shm")
    listener = t.listen("127.0.0.1", 0)
    for _ in range(10):
        client, server = connect_pair(t, listener)
        region = server.register(4096)
        client.put(region.remote(), 0, b"x", timeout=5)
        assert _dev_shm() - before, "a registered region should be visible while open"
        client.close()
        server.close()
    listener.close()
    assert _dev_shm() - before == set()


def test_size_classes_are_powers_of_two():
    assert size_class(1) == 6 and size_class(64) == 6 and size_class(65) == 7
    assert size_class(4096) == 12 and size_class(4097) == 13


def test_pooled_reuses_the_class_recent_messages_needed():
    pool = PooledBuffers(preallocate=())
    for size in [3000, 2500, 3900, 2100] * 5:   # all in the 4 KiB class
        view, release = pool.acquire(size)
        release()
    assert pool.stats.allocations == 1 and pool.stats.pool_hits == 19
    view, release = pool.acquire(1500)           # smaller, but recent messages needed 4 KiB
    assert len(view.obj) == 4096 and pool.stats.allocations == 1
    release()


def test_pooled_does_fewer_allocations_and_copies_per_message_than_naive():
    counts = {}
    for design in (PooledBuffers, NaiveBuffers):
        buffers = design()
        for i in range(100):
            size = 1000 + i
            view, release = buffers.acquire(size)
            buffers.finish(view, release).release()
            buffers.gather([b"hdr", b"x" * size])
        counts[design.name] = buffers.stats
    assert counts["pooled"].allocations < counts["naive"].allocations / 10
    assert counts["pooled"].copies == 0 and counts["naive"].copies == 200
    assert counts["pooled"].bytes_copied == 0 < counts["naive"].bytes_copied


_KILLED_PEER = """
import sys, time
from pytest_hpcnet.reference.transport import get_transport
conn = get_transport(sys.argv[1]).connect(("127.0.0.1", int(sys.argv[2])), timeout=10)
conn.send([b"hello"])
print("sent", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("name", sorted(TRANSPORTS))
def test_killed_peer_process_raises_transport_closed(name):
    import signal
    import subprocess
    import sys

    listener = get_transport(name).listen("127.0.0.1", 0)
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_PEER, name, str(listener.address[1])],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        server = listener.accept(timeout=20)
        assert proc.stdout.readline().strip() == "sent"
        assert bytes(server.recv(timeout=10).view) == b"hello"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(TransportClosed):
            server.recv(timeout=10)
        server.close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        listener.close()


def test_bad_spin_setting_is_a_config_error(monkeypatch):
    from pytest_hpcnet.reference.transport.shm import spin_seconds

    monkeypatch.setenv("HPCNET_SHM_SPIN", "fast")
    with pytest.raises(ConfigError, match="HPCNET_SHM_SPIN"):
        spin_seconds()


def test_both_transports_fill_the_connection_protocol(pair):
    from pytest_hpcnet.reference.transport import Connection

    client, server = pair()
    assert isinstance(client, Connection) and isinstance(server, Connection)


@pytest.mark.parametrize("buffers", ["pooled", "naive"])
def test_pipelined_messages_arrive_whole_and_in_order(pair, buffers):
    client, server = pair(buffers=buffers)
    rng = random.Random(3)
    messages = [rng.randbytes(rng.choice([0, 5, 60, 700, 5000, 70_000])) for _ in range(200)]
    stream = b"".join(len(m).to_bytes(4, "big") + m for m in messages)
    sender = threading.Thread(target=lambda: client.send_raw(stream, timeout=20))
    sender.start()   # many messages per read: the read-ahead must carry the surplus over
    for m in messages:
        got = server.recv(timeout=10)
        assert bytes(got.view) == m
        got.release()
    sender.join(20)


def test_pooled_read_ahead_takes_a_small_message_in_one_read(pair):
    client, server = pair(buffers="pooled")
    client.send([b"m" * 100])   # the first message teaches the predictor its size class
    server.recv(timeout=5).release()
    reads = []
    inner = server._recv_into
    server._recv_into = lambda view, deadline: reads.append(1) or inner(view, deadline)
    for i in range(20):
        client.send([b"m" * 100])
        time.sleep(0.002)   # let the whole message land before the server reads
        assert bytes(server.recv(timeout=5).view) == b"m" * 100
    assert len(reads) == 20   # length and body together, one read per message


def test_shm_handshake_does_not_inherit_a_short_accept_timeout():
    """A server polls accept with short timeouts; a client arriving late in one must still connect."""
    t = get_transport("shm")
    listener = t.listen("127.0.0.1", 0)
    accepted, stop = [], threading.Event()

    def accept_loop():
        while not stop.is_set():
            try:
                accepted.append(listener.accept(timeout=0.003))
            except TransportTimeout:
                pass
    th = threading.Thread(target=accept_loop)
    th.start()
    clients = []
    try:
        for i in range(30):
            time.sleep(0.001 * (i % 4))
            clients.append(t.connect(listener.address, timeout=10))
            clients[-1].send([b"%d" % i])
        deadline = time.monotonic() + 10
        while len(accepted) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(int(bytes(c.recv(timeout=5).view)) for c in accepted) == list(range(30))
    finally:
        stop.set()
        th.join(10)
        for c in clients + accepted:
            c.close()
        listener.close()


def test_shm_put_refuses_a_forged_region_descriptor():
    t = get_transport("shm")
    listener = t.listen("127.0.0.1", 0)
    client, server = connect_pair(t, listener)
    try:
        forged = RemoteRegion("shm", "/dev/shm/hpcnet-region-../../etc/passwd", "../../etc/passwd", 10)
        with pytest.raises(TransportError, match="not an shm region"):
            client.put(forged, 0, b"x")
    finally:
        client.close(), server.close(), listener.close()


_REGION_OWNER = """
from pytest_hpcnet.reference.transport.shm import ShmRegion
import time
r = ShmRegion(4096)
print(r.path, flush=True)
time.sleep(60)
"""


def test_regions_of_a_killed_owner_are_swept_by_the_next_register():
    import signal
    import subprocess
    import sys

    from pytest_hpcnet.reference.transport.shm import ShmRegion

    proc = subprocess.Popen([sys.executable, "-c", _REGION_OWNER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        path = proc.stdout.readline().strip()
        assert os.path.exists(path)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # no close, no atexit: the file stays behind
        proc.wait()
    assert os.path.exists(path)
    region = ShmRegion(64)
    try:
        assert not os.path.exists(path)
    finally:
        region.close()
    assert not os.path.exists(region.path)


def test_shm_rpc_with_the_adaptive_spin_enabled(monkeypatch):
    """The spin phase (off by default) must deliver the same stream as the doorbell path."""
    from pytest_hpcnet.reference.rpc import RpcClient, RpcServer

    monkeypatch.setenv("HPCNET_SHM_SPIN", "0.0002")
    with RpcServer(transport="shm") as s, RpcClient(s.address, transport="shm", timeout=10) as c:
        assert c.conn._spin_max == 0.0002
        for size in (0, 64, 5000, (1 << 20) + 7):
            payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
            assert c.echo(payload) == payload


def test_connect_pair_on_a_closed_listener_is_an_error_not_a_hang():
    t = get_transport("tcp")
    listener = t.listen("127.0.0.1", 0)
    listener.close()
    t0 = time.monotonic()
    with pytest.raises(TransportError):
        connect_pair(t, listener, timeout=5)
    assert time.monotonic() - t0 < 5
