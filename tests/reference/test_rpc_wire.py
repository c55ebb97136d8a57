"""Wire conformance against bytes assembled by hand from design.md section 8 (not by our encoder)."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from pytest_hpcnet.reference import native
from pytest_hpcnet.reference.rpc import RpcServer, make_client, make_server, wire

CLIENT_ID = bytes(range(16))
PROTOCOL = b"org.pytest_hpcnet.rpc.EchoProtocol"


def _len_delimited(tag: int, payload: bytes) -> bytes:
    assert len(payload) < 128   # one-byte lengths keep the hand assembly readable
    return bytes([tag, len(payload)]) + payload


# RpcRequestHeaderProto: rpcKind=2 (field 1 varint), rpcOp=0 (field 2), callId (field 3 sint32, zigzag),
# clientId (field 4 bytes), retryCount=-1 (field 5 sint32: zigzag(-1) = 1)
def _request_header(zigzag_call_id: int) -> bytes:
    return (b"\x08\x02" + b"\x10\x00" + bytes([0x18, zigzag_call_id])
            + _len_delimited(0x22, CLIENT_ID) + b"\x28\x01")


GOLDEN_PREAMBLE = b"hrpc" + b"\x09" + b"\x00" + b"\x00"
_ctx_header = _request_header(0x05)                      # callId -3 -> zigzag 5
_ctx = _len_delimited(0x12, _len_delimited(0x0A, b"alice")) + _len_delimited(0x1A, PROTOCOL)
GOLDEN_CONTEXT = (b"\x00\x00\x00" + bytes([1 + len(_ctx_header) + 1 + len(_ctx)])
                  + bytes([len(_ctx_header)]) + _ctx_header + bytes([len(_ctx)]) + _ctx)

_call_header = _request_header(0x00)                     # callId 0
_req_header = (_len_delimited(0x0A, b"echo") + _len_delimited(0x12, PROTOCOL) + b"\x18\x01")
_echo_req = _len_delimited(0x0A, b"hi")                  # EchoRequestProto{payload="hi"}
_call_body = (bytes([len(_call_header)]) + _call_header + bytes([len(_req_header)]) + _req_header
              + bytes([len(_echo_req)]) + _echo_req)
GOLDEN_CALL = b"\x00\x00\x00" + bytes([len(_call_body)]) + _call_body

# RpcResponseHeaderProto: callId=0 (uint32), status=SUCCESS, serverIpcVersionNum=9, clientId (field 7),
# retryCount=-1 (field 8 sint32)
_resp_header = b"\x08\x00" + b"\x10\x00" + b"\x18\x09" + _len_delimited(0x3A, CLIENT_ID) + b"\x40\x01"
_echo_resp = _len_delimited(0x0A, b"hi")
_resp_body = bytes([len(_resp_header)]) + _resp_header + bytes([len(_echo_resp)]) + _echo_resp
GOLDEN_RESPONSE = b"\x00\x00\x00" + bytes([len(_resp_body)]) + _resp_body


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "peer closed early"
        data += chunk
    return data


# Both implementations against the same hand-built bytes (the native core where it is built).
IMPLS = ["python", pytest.param("native", marks=pytest.mark.skipif(not native.AVAILABLE,
                                                                   reason=native.WHY_NOT or "native core absent"))]


@pytest.mark.parametrize("impl", IMPLS)
def test_server_answers_a_hand_built_connection_and_call_byte_for_byte(impl):
    with make_server(impl) as server:
        with socket.create_connection(server.address, timeout=10) as s:
            s.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT + GOLDEN_CALL)
            assert _recv_exact(s, len(GOLDEN_RESPONSE)) == GOLDEN_RESPONSE


@pytest.mark.parametrize("impl", IMPLS)
def test_client_sends_the_hand_built_bytes_and_understands_the_hand_built_response(impl):
    listener = socket.create_server(("127.0.0.1", 0))
    seen = {}

    def fake_server():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            seen["bytes"] = _recv_exact(conn, len(GOLDEN_PREAMBLE + GOLDEN_CONTEXT + GOLDEN_CALL))
            conn.sendall(GOLDEN_RESPONSE)
            conn.recv(1)   # wait for the client to close
    th = threading.Thread(target=fake_server, daemon=True)
    th.start()
    with make_client(listener.getsockname(), impl=impl, user="alice", client_id=CLIENT_ID, timeout=10) as client:
        assert client.echo(b"hi") == b"hi"
    th.join(10)
    listener.close()
    assert seen["bytes"] == GOLDEN_PREAMBLE + GOLDEN_CONTEXT + GOLDEN_CALL


def test_generated_modules_use_hadoop_field_numbers_and_types():
    from pytest_hpcnet.reference.rpc.proto import RpcHeader_pb2 as h
    from google.protobuf.descriptor import FieldDescriptor as F

    req = h.RpcRequestHeaderProto.DESCRIPTOR.fields_by_name
    assert (req["callId"].number, req["callId"].type) == (3, F.TYPE_SINT32)
    assert (req["retryCount"].number, req["retryCount"].type) == (5, F.TYPE_SINT32)
    resp = h.RpcResponseHeaderProto.DESCRIPTOR.fields_by_name
    assert (resp["callId"].number, resp["callId"].type) == (1, F.TYPE_UINT32)


@pytest.mark.parametrize("call_id", [0, 1, 63, 64, 127, 128, 300, 2**31 - 1, -1, -3, -4])
@pytest.mark.parametrize("retry_count", [-1, 0, 5, -7])
def test_hand_encoded_hot_path_headers_equal_the_protobuf_encoding(call_id, retry_count):
    client_id = bytes(range(16))
    assert wire.request_header_bytes(call_id, client_id, retry_count) == \
        wire.request_header(call_id, client_id, retry_count).SerializeToString()
    header = wire.RpcResponseHeaderProto(callId=wire.response_call_id(call_id), status=wire.SUCCESS,
                                         serverIpcVersionNum=9, clientId=client_id, retryCount=retry_count)
    assert wire.success_header_bytes(call_id, client_id, retry_count) == header.SerializeToString()


def test_a_call_off_the_hot_path_shape_is_answered_through_protobuf():
    """retryCount 3 and a callId above one varint byte: the server's fast header check must not match,
    and the response carries the request's retry count."""
    rh = wire.RequestHeaderProto(methodName="echo", declaringClassProtocolName=wire.ECHO_PROTOCOL,
                                 clientProtocolVersion=1)
    body = b"".join(wire.delimited(wire.request_header(1000, CLIENT_ID, retry_count=3), rh,
                                   wire.EchoRequestProto(payload=b"retry")))
    with RpcServer() as server, socket.create_connection(server.address, timeout=10) as s:
        s.sendall(GOLDEN_PREAMBLE + GOLDEN_CONTEXT + struct.pack(">I", len(body)) + body)
        (length,) = struct.unpack(">I", _recv_exact(s, 4))
        packet = memoryview(_recv_exact(s, length))
        header_bytes, pos = wire.read_delimited(packet, 0)
        header = wire.RpcResponseHeaderProto.FromString(bytes(header_bytes))
        assert (header.callId, header.status, header.retryCount) == (1000, wire.SUCCESS, 3)
        assert wire.EchoResponseProto.FromString(bytes(wire.read_delimited(packet, pos)[0])).payload == b"retry"
