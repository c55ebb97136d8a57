"""Hadoop IPC v9 wire format (design.md section 8): preamble, varint-delimited messages, packets.

A packet is one transport message (4-byte big-endian length + body); the body is a sequence of
varint-length-delimited protobuf messages: request = RpcRequestHeaderProto, RequestHeaderProto,
request; response = RpcResponseHeaderProto, response.
"""

from __future__ import annotations

from ...errors import HpcnetError
from .proto import Echo_pb2, IpcConnectionContext_pb2, ProtobufRpcEngine_pb2, RpcHeader_pb2

PREAMBLE_MAGIC = b"hrpc"
IPC_VERSION = 9
SERVICE_CLASS_DEFAULT = 0
AUTH_NONE = 0
AUTH_SASL = -33 & 0xFF
PREAMBLE = PREAMBLE_MAGIC + bytes([IPC_VERSION, SERVICE_CLASS_DEFAULT, AUTH_NONE])

CONNECTION_CONTEXT_CALL_ID = -3
PING_CALL_ID = -4
INVALID_CALL_ID = -1          # used on FATAL responses that belong to no call
MAX_DATA_LENGTH = 128 * 1024 * 1024   # ipc.maximum.data.length default
ECHO_PROTOCOL = "org.pytest_hpcnet.rpc.EchoProtocol"
PROTOCOL_VERSION = 1

RpcRequestHeaderProto = RpcHeader_pb2.RpcRequestHeaderProto
RpcResponseHeaderProto = RpcHeader_pb2.RpcResponseHeaderProto
RPC_PROTOCOL_BUFFER = RpcHeader_pb2.RPC_PROTOCOL_BUFFER
RequestHeaderProto = ProtobufRpcEngine_pb2.RequestHeaderProto
IpcConnectionContextProto = IpcConnectionContext_pb2.IpcConnectionContextProto
EchoRequestProto, EchoResponseProto = Echo_pb2.EchoRequestProto, Echo_pb2.EchoResponseProto
EmptyRequestProto, EmptyResponseProto = Echo_pb2.EmptyRequestProto, Echo_pb2.EmptyResponseProto
SUCCESS, ERROR, FATAL = (RpcResponseHeaderProto.SUCCESS, RpcResponseHeaderProto.ERROR,
                         RpcResponseHeaderProto.FATAL)


class WireError(HpcnetError):
    """Bytes that are not a well-formed Hadoop IPC packet."""


_ONE_BYTE = [bytes((i,)) for i in range(128)]


def varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _ONE_BYTE[n]   # the common case (small lengths and call ids) without a loop
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_delimited(view: memoryview, pos: int) -> tuple[memoryview, int]:
    """The delimited message starting at ``pos`` and the position after it."""
    length = shift = 0
    while True:
        if pos >= len(view):
            raise WireError("packet ends inside a varint length")
        b = view[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 28:
            raise WireError("varint length longer than 5 bytes")
    if pos + length > len(view):
        raise WireError(f"delimited message of {length} bytes overruns the packet")
    return view[pos:pos + length], pos + length


def delimited(*messages) -> list[bytes]:
    """Packet parts for messages (protobuf objects or already-serialized bytes)."""
    parts = []
    for m in messages:
        data = m if isinstance(m, (bytes, bytearray, memoryview)) else m.SerializeToString()
        parts += [varint(len(data)), data]
    return parts


def request_header(call_id: int, client_id: bytes, retry_count: int = -1) -> RpcRequestHeaderProto:
    return RpcRequestHeaderProto(rpcKind=RPC_PROTOCOL_BUFFER,
                                 rpcOp=RpcRequestHeaderProto.RPC_FINAL_PACKET,
                                 callId=call_id, clientId=client_id, retryCount=retry_count)


def connection_context(user: str, protocol: str) -> IpcConnectionContextProto:
    ctx = IpcConnectionContextProto(protocol=protocol)
    ctx.userInfo.effectiveUser = user
    return ctx


def response_call_id(call_id: int) -> int:
    """The response header's uint32 callId for a (possibly negative) int call id."""
    return call_id & 0xFFFFFFFF


def signed_call_id(call_id: int) -> int:
    return call_id - (1 << 32) if call_id >= 1 << 31 else call_id


# -- hand-encoded hot-path headers -------------------------------------------------------------
# The two headers every call carries change only in callId (and retryCount), so instead of building
# and serializing a protobuf object per call (several microseconds of Python each) the hot path
# splices the varying varints into per-connection constant bytes. Field order and encodings are the
# ones the protobuf library emits (ascending field numbers), so the bytes are identical to
# ``request_header(...).SerializeToString()`` -- tests/reference/test_rpc_wire.py compares both
# against hand-built golden packets.

def zigzag(n: int) -> int:
    """sint32 encoding."""
    return ((n << 1) ^ (n >> 31)) & 0xFFFFFFFF


def request_header_bytes(call_id: int, client_id: bytes, retry_count: int = -1) -> bytes:
    """``request_header(call_id, client_id, retry_count).SerializeToString()``, without protobuf."""
    return request_header_prefix() + varint(zigzag(call_id)) + request_header_suffix(client_id, retry_count)


def request_header_prefix() -> bytes:
    """rpcKind=RPC_PROTOCOL_BUFFER, rpcOp=RPC_FINAL_PACKET, then the callId tag."""
    return b"\x08\x02\x10\x00\x18"


def request_header_suffix(client_id: bytes, retry_count: int = -1) -> bytes:
    """What follows the callId varint: clientId and retryCount (constant per connection)."""
    return b"\x22" + varint(len(client_id)) + client_id + b"\x28" + varint(zigzag(retry_count))


def success_header_bytes(call_id: int, client_id: bytes, retry_count: int = -1) -> bytes:
    """A SUCCESS ``RpcResponseHeaderProto`` (callId, status, serverIpcVersionNum 9, clientId,
    retryCount) serialized without protobuf."""
    return b"\x08" + varint(response_call_id(call_id)) + success_header_suffix(client_id, retry_count)


def success_header_suffix(client_id: bytes, retry_count: int = -1) -> bytes:
    """What follows the callId varint of a SUCCESS response header (constant per connection and
    retry count)."""
    return (b"\x10\x00\x18\x09\x3a" + varint(len(client_id)) + client_id + b"\x40"
            + varint(zigzag(retry_count)))
