"""RPC conformance, in two parts.

On the target under test (``--hpcnet-target``), through the ``target`` fixture's RPC workloads: the
target's echo server (the reference's, or Hadoop's RPCCallBenchmark server under ``--hpcnet-target
hadoop``) answers a Hadoop-wire client byte for byte, at every size and with calls in flight together on
one connection and on many connections; the target's client drives its own server and the reference's.
A target without an RPC server or client skips, naming the workload.

The reference's internals, against a server running on a cluster node: framing, call-id matching,
out-of-order responses, handler errors, timeouts, the data length limit, a server that dies, malformed
input and many connections -- over tcp, shm and (where there is an RDMA device) verbs. The test process
is the client (it needs to see exceptions and bytes). These skip under another target, saying so.

Over tcp, shm and verbs every reference test runs four ways (``impls``): the Python server and client,
the native server and client (``impl=native``, the compiled core), and across them (native client <->
Python server, and the reverse; over verbs the Python end is pyverbs, the independent peer). The native
ones skip, with the reason, where the native core is not built (or, over verbs, cannot speak verbs here).

The hand-built golden packets (design §8) are checked byte for byte in tests/reference/test_rpc_wire.py;
here framing is checked on whatever server the suite is pointed at.
"""

from __future__ import annotations

import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pytest_hpcnet.measure import measurement
from pytest_hpcnet.reference.rpc import (RpcClient, RpcConnectionLost, RpcRemoteError, RpcTimeout, make_client,
                                         wire)
from pytest_hpcnet.reference.rpc.hadoop_bench import bench_client, bench_server
from pytest_hpcnet.reference.transport import TransportClosed, TransportError, get_transport
from pytest_hpcnet.timeouts import scaled

from .conftest import _Starter, skip_unless_native_speaks, skip_unless_same_host

E = wire.RpcResponseHeaderProto
CLIENT_ID = bytes(range(16))
WAIT = scaled(10)   # for an answer that comes at once on a real machine (the emulated guest scales it)


# -- on the target ---------------------------------------------------------------------------------------
# A Hadoop server's echo message is a Java string: payloads are UTF-8 text (two-byte characters among
# one-byte ones, so a byte lost or doubled shows), of sizes around the buffer and packet edges.
TEXT_SIZES = [0, 1, 4095, 65536, (1 << 20) + 3]
RPC_CLIENTS, RPC_SECONDS, RPC_MSG = 2, 2, 1024


def utf8_text(size: int) -> bytes:
    unit = "hé,".encode()          # 4 bytes, one of them a two-byte character
    return (unit * (size // len(unit) + 1))[:size - size % len(unit)] + b"x" * (size % len(unit))


@pytest.fixture(scope="module")
def target_server(target):
    """The target's echo server, one for the module's target tests (a Hadoop one is a JVM)."""
    if not target.offers("rpc_server"):
        pytest.skip(str(target.missing("rpc_server")))
    with target.rpc_server(threads=RPC_CLIENTS) as address:
        yield tuple(address)


def test_target_server_echoes_text_byte_exact_at_every_size(target, target_server):
    with bench_client(target_server, timeout=scaled(30)) as c:
        for size in TEXT_SIZES:
            payload = utf8_text(size)
            assert c.echo(payload) == payload, f"echo of {size} bytes came back changed"


def test_target_server_matches_concurrent_calls_by_call_id(target, target_server):
    clients = [bench_client(target_server, timeout=scaled(30)) for _ in range(3)]
    try:
        def work(t):
            c = clients[t % len(clients)]
            return all(c.echo(f"{t}:{i}".encode()) == f"{t}:{i}".encode() for i in range(40))
        with ThreadPoolExecutor(6) as pool:        # two threads on each connection, three connections
            assert all(pool.map(work, range(6)))
    finally:
        for c in clients:
            c.close()


def test_target_client_drives_its_own_server(target, target_server, measure):
    result = target.rpc_client(target_server, clients=RPC_CLIENTS, seconds=RPC_SECONDS, msg_size=RPC_MSG)
    assert result.details["calls_per_second"] > 0
    measure.record(measurement("rpc.echo.calls_per_second", [result.details["calls_per_second"]],
                               unit="calls/s", direction="higher", config=target.name,
                               params={"clients": RPC_CLIENTS, "msg_size": RPC_MSG, "seconds": RPC_SECONDS}))


def test_target_client_drives_the_reference_server(target):
    """The reference's server as the fixed point: every call the target's client made arrived, none failed."""
    with bench_server(handlers=RPC_CLIENTS) as server:
        result = target.rpc_client(tuple(server.address), clients=RPC_CLIENTS, seconds=RPC_SECONDS,
                                   msg_size=RPC_MSG)
        assert server.counters["calls"] > 0 and server.counters["errors"] == 0
    assert result.details["calls_per_second"] > 0


# -- the reference's internals (skip under another target) ---------------------------------------------
# (server impl, client impl) per parameter
IMPLS = {"python": ("python", "python"), "native": ("native", "native"),
         "python-server+native-client": ("python", "native"),
         "native-server+python-client": ("native", "python")}


# (transport, IMPLS key); verbs keeps its old id for the Python pair
PATHS = ([pytest.param((t, k), id=f"{t}-{k}") for t in ("tcp", "shm") for k in IMPLS]
         + [pytest.param(("verbs", k), id="verbs" if k == "python" else f"verbs-{k}",
                         marks=[pytest.mark.rdma, pytest.mark.pyverbs]) for k in IMPLS])


@pytest.fixture(scope="module", params=PATHS)
def path(request, nodes):
    transport, key = request.param
    if transport == "shm":
        skip_unless_same_host(nodes)
    pair = IMPLS[key]
    skip_unless_native_speaks(transport, pair)
    return transport, pair


@pytest.fixture(scope="module")
def transport(path):
    return path[0]


@pytest.fixture(scope="module")
def impls(path):
    return path[1]


@pytest.fixture(scope="module")
def server(nodes, launchers, transport, impls):
    """An echo server (echo, ping, sleepEcho, fail) over ``transport`` of the ``impls`` server side."""
    starter = _Starter(launchers, nodes[0], impls)
    yield starter(transport)
    starter.stop()


@pytest.fixture
def serve(nodes, launchers, impls):
    starter = _Starter(launchers, nodes[0], impls)
    yield starter
    starter.stop()


def client(server, **kw) -> RpcClient:
    return make_client(server.address, impl=getattr(server, "client_impl", "python"),
                       transport=server.transport, buffers=server.buffers, timeout=kw.pop("timeout", scaled(20)),
                       **kw)


def sleep_echo(c: RpcClient, ms: int, tag: bytes, timeout=None) -> bytes:
    request = wire.EchoRequestProto(payload=struct.pack(">H", ms) + tag)
    return c.call("sleepEcho", request, wire.EchoResponseProto, timeout).payload[2:]


def raw_connection(server):
    """A bare transport connection that has sent a valid preamble and connection context."""
    conn = get_transport(server.transport).connect(server.address, timeout=WAIT)
    conn.send_raw(wire.PREAMBLE, timeout=WAIT)
    conn.send(wire.delimited(wire.request_header(wire.CONNECTION_CONTEXT_CALL_ID, CLIENT_ID),
                             wire.connection_context("suite", wire.ECHO_PROTOCOL)), timeout=WAIT)
    return conn


def test_one_call_is_one_length_framed_packet_of_delimited_messages(server):
    """Request and response framing, read at the transport level: a 4-byte length covering exactly
    a delimited RpcResponseHeaderProto and a delimited EchoResponseProto, call id and client id echoed."""
    conn = raw_connection(server)
    try:
        rh = wire.RequestHeaderProto(methodName="echo", declaringClassProtocolName=wire.ECHO_PROTOCOL,
                                     clientProtocolVersion=wire.PROTOCOL_VERSION)
        conn.send(wire.delimited(wire.request_header(7, CLIENT_ID), rh, wire.EchoRequestProto(payload=b"frame")),
                  timeout=WAIT)
        packet = conn.recv(timeout=WAIT)
        view = packet.view
        header_bytes, pos = wire.read_delimited(view, 0)
        body, end = wire.read_delimited(view, pos)
        assert end == len(view), "bytes after the response message inside the packet"
        header = E.FromString(bytes(header_bytes))
        assert (header.callId, header.status, header.serverIpcVersionNum, header.clientId) == \
            (7, wire.SUCCESS, 9, CLIENT_ID)
        assert wire.EchoResponseProto.FromString(bytes(body)).payload == b"frame"
        packet.release()
    finally:
        conn.close()


@pytest.mark.parametrize("size", [0, 1, 4095, 65536, (2 << 20) + 3])
def test_echo_is_byte_exact_at_every_size(server, size):
    payload = bytes((i * 7 + size) & 0xFF for i in range(size))
    with client(server) as c:
        assert c.echo(payload) == payload


def test_concurrent_calls_on_one_connection_are_matched_by_call_id(server):
    with client(server) as c:
        def work(t):
            return [c.echo(f"{t}:{i}".encode()) == f"{t}:{i}".encode() for i in range(40)]
        with ThreadPoolExecutor(8) as pool:
            assert all(all(r) for r in pool.map(work, range(8)))


def test_responses_come_back_out_of_order(server):
    """A slow call issued first does not hold up a fast one issued after it on the same connection."""
    with client(server) as c:
        finished = []
        slow = threading.Thread(target=lambda: finished.append(sleep_echo(c, 600, b"slow")))
        slow.start()
        time.sleep(0.1)
        assert sleep_echo(c, 0, b"fast") == b"fast"
        finished.append(b"fast")
        slow.join(WAIT)
        assert finished == [b"fast", b"slow"]


def test_handler_error_is_an_error_response_and_the_connection_stays(server):
    with client(server) as c:
        with pytest.raises(RpcRemoteError) as info:
            c.call("fail", wire.EchoRequestProto(payload=b"no such block blk_42"), wire.EchoResponseProto)
        assert info.value.class_name == "builtins.ValueError"
        assert info.value.message == "no such block blk_42" and not info.value.fatal
        with pytest.raises(RpcRemoteError) as info:
            c.call("noSuchMethod", wire.EmptyRequestProto(), wire.EmptyResponseProto)
        assert info.value.error_detail == E.ERROR_NO_SUCH_METHOD
        assert c.echo(b"still here") == b"still here"


def test_call_timeout_is_raised_in_time_and_the_connection_still_works(server):
    with client(server) as c:
        t0 = time.monotonic()
        with pytest.raises(RpcTimeout):
            sleep_echo(c, 1500, b"late", timeout=0.2)
        assert time.monotonic() - t0 < 1.2   # well before the server answers
        assert c.echo(b"next") == b"next"    # the late answer, when it comes, is dropped


def test_over_the_maximum_data_length_is_fatal_and_others_keep_being_served(serve, transport):
    server = serve(transport, max_data_length=4096)
    with client(server) as ok, client(server) as big:
        with pytest.raises(RpcConnectionLost) as info:
            big.echo(bytes(8192))
        assert "ipc.maximum.data.length" in str(info.value)
        with pytest.raises(RpcConnectionLost):
            big.echo(b"after fatal")
        assert ok.echo(bytes(3000)) == bytes(3000)


def test_server_going_away_fails_pending_calls_instead_of_hanging(serve, transport):
    server = serve(transport)
    with client(server, timeout=scaled(30)) as c:
        assert c.echo(b"up") == b"up"
        errors = []

        def pending():
            try:
                sleep_echo(c, 5000, b"pending")
            except Exception as e:
                errors.append(e)
        th = threading.Thread(target=pending)
        th.start()
        time.sleep(0.3)
        server.proc.kill()
        th.join(scaled(25))
        assert not th.is_alive() and isinstance(errors[0], RpcConnectionLost), errors


def _fatal_or_closed(conn) -> int | None:
    """The errorDetail of a FATAL answer, or None if the server just closed the connection."""
    try:
        packet = conn.recv(timeout=WAIT)
    except TransportClosed:
        return None
    header = E.FromString(bytes(wire.read_delimited(packet.view, 0)[0]))
    assert header.status == wire.FATAL
    return header.errorDetail


@pytest.mark.parametrize("case", ["not hrpc", "version 8", "sasl", "garbage header", "overrun", "truncated"])
def test_malformed_input_closes_that_connection_and_the_server_keeps_serving(server, case):
    conn = get_transport(server.transport).connect(server.address, timeout=WAIT)
    try:
        preamble = {"not hrpc": b"GET / H", "version 8": b"hrpc\x08\x00\x00",
                    "sasl": b"hrpc\x09\x00\xdf"}.get(case, wire.PREAMBLE)
        conn.send_raw(preamble, timeout=WAIT)
        expected = {"not hrpc": None, "version 8": E.FATAL_VERSION_MISMATCH, "sasl": E.FATAL_UNAUTHORIZED}
        if case == "garbage header":
            conn.send([b"\x07" + b"\xff" * 7], timeout=WAIT)
            expected[case] = E.FATAL_INVALID_RPC_HEADER
        elif case in ("overrun", "truncated"):
            conn.send(wire.delimited(wire.request_header(-3, CLIENT_ID),
                                     wire.connection_context("suite", wire.ECHO_PROTOCOL)), timeout=WAIT)
            if case == "overrun":
                conn.send([b"\x7f\x01\x02"], timeout=WAIT)   # a delimited length past the packet's end
                expected[case] = E.FATAL_DESERIALIZING_REQUEST
            else:
                conn.send_raw(b"\x00\x00\x01\x00abc", timeout=WAIT)   # 256 bytes announced, 3 sent
        if case == "truncated":
            conn.close()   # the server must drop the half packet, not wait for it forever
        else:
            assert _fatal_or_closed(conn) == expected[case]
    except TransportError as e:   # the server may close before all our bytes are written
        assert case in ("not hrpc", "version 8", "sasl"), e
    finally:
        conn.close()
    with client(server) as c:
        assert c.echo(b"served") == b"served"


def test_more_than_a_hundred_concurrent_connections(server):
    clients = []
    try:
        for _ in range(110):
            clients.append(client(server))
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda ic: ic[1].echo(b"%d" % ic[0]), enumerate(clients)))
        assert replies == [b"%d" % i for i in range(len(clients))]
    finally:
        for c in clients:
            c.close()
    with client(server) as c:
        assert c.echo(b"after") == b"after"
