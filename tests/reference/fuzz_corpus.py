"""Writes the fuzz targets' seed corpus (native/fuzz/corpus/<target>/seed-*): small valid inputs
encoded with the protobuf library through the Python reference implementation's wire module, so the
seeds do not come from the Rust encoders under test. It lives with the tests, not in native/, since it
uses the Python reference (the native crate depends on nothing of the package's). test_fuzz_corpus.py
beside it checks that the committed files are what this writes.

    python tests/reference/fuzz_corpus.py [OUT_DIR]      (default: native/fuzz/corpus)
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from pytest_hpcnet.reference.dfs import checksums
from pytest_hpcnet.reference.dfs import wire as dfs_wire
from pytest_hpcnet.reference.rpc import wire

CLIENT_ID = bytes(range(16))
USER, PROTOCOL = "hpcnet", wire.ECHO_PROTOCOL


def packet(*messages) -> bytes:
    """A packet body: the messages varint-delimited, without the 4-byte length."""
    return b"".join(wire.delimited(*messages))


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def context_packet() -> bytes:
    return packet(wire.request_header(wire.CONNECTION_CONTEXT_CALL_ID, CLIENT_ID),
                  wire.connection_context(USER, PROTOCOL))


def call_packet(call_id: int, method: str, request) -> bytes:
    return packet(wire.request_header(call_id, CLIENT_ID),
                  wire.RequestHeaderProto(methodName=method, declaringClassProtocolName=PROTOCOL,
                                          clientProtocolVersion=wire.PROTOCOL_VERSION),
                  request)


def echo_call(call_id: int = 0, payload: bytes = b"hi") -> bytes:
    return call_packet(call_id, "echo", wire.EchoRequestProto(payload=payload))


def ping_call(call_id: int = 1) -> bytes:
    return call_packet(call_id, "ping", wire.EmptyRequestProto())


def heartbeat() -> bytes:
    return packet(wire.request_header(wire.PING_CALL_ID, CLIENT_ID))


def close_connection() -> bytes:
    h = wire.request_header(2, CLIENT_ID)
    h.rpcOp = wire.RpcRequestHeaderProto.RPC_CLOSE_CONNECTION
    return packet(h)


def response(call_id: int, status, body=None, **error) -> bytes:
    h = wire.RpcResponseHeaderProto(callId=wire.response_call_id(call_id), status=status,
                                    serverIpcVersionNum=wire.IPC_VERSION, clientId=CLIENT_ID,
                                    retryCount=-1, **error)
    return packet(h, body) if body is not None else packet(h)


def dfs_packet(seq: int, offset: int, data: bytes, last: bool, kind: str = "crc32c", bpc: int = 512) -> bytes:
    """A block store packet frame, its checksums from the pure-Python reference."""
    sums = checksums.chunk_sums(data, bpc, kind, impl="python")
    return frame(b"".join(dfs_wire.encode({"op": "packet", "seq": seq, "offset": offset, "len": len(data),
                                           "last": last}, sums, data)))


def seeds() -> dict[str, dict[str, bytes]]:
    limit = struct.pack(">H", 1024)
    conversation = frame(context_packet()) + frame(echo_call()) + frame(ping_call()) + frame(heartbeat())
    error_class = "org.apache.hadoop.ipc.RpcNoSuchProtocolException"
    shm_counters = struct.pack("<QQBH", 4096 + 100, 4096 + 40, 20, 4096)
    return {
        "frame": {
            "seed-conversation": limit + conversation,
            "seed-over-limit": struct.pack(">H", 16) + frame(echo_call(payload=b"x" * 32)),
            "seed-partial": limit + frame(echo_call())[:-3],
            "seed-empty-packet": limit + frame(b""),
        },
        "connection": {
            "seed-echo-ping": b"\0" + wire.PREAMBLE + conversation + frame(close_connection()),
            "seed-small-bound": b"\x04" + wire.PREAMBLE + frame(context_packet()) + frame(echo_call(7, b"y" * 80)),
            "seed-version-10": b"\0" + b"hrpc\x0a\x00\x00" + frame(context_packet()),
            "seed-sasl": b"\0" + b"hrpc\x09\x00" + bytes([wire.AUTH_SASL]),
        },
        "request": {
            "seed-context": context_packet(),
            "seed-echo": echo_call(5, b"hello"),
            "seed-ping": ping_call(),
            "seed-heartbeat": heartbeat(),
            "seed-close": close_connection(),
            "seed-other-method": call_packet(9, "sleep", wire.EmptyRequestProto()),
        },
        "response": {
            "seed-success-echo": response(0, wire.SUCCESS, wire.EchoResponseProto(payload=b"hi")),
            "seed-success-empty": response(1, wire.SUCCESS, wire.EmptyResponseProto()),
            "seed-error": response(2, wire.ERROR, exceptionClassName=error_class,
                                   errorMsg="unknown protocol x", errorDetail=3),
            "seed-fatal": response(-1, wire.FATAL, exceptionClassName="org.apache.hadoop.ipc.IpcException",
                                   errorMsg="IPC version 10 not supported", errorDetail=14),
        },
        # first byte: bit 0 CRC32 (else CRC32C), bits 1-2 bytes per checksum (512, 1, 7, 64), bits 3-4
        # the replica's starting offset (0, 512, 2^40), bit 5 a downstream
        "packet": {
            "seed-two-packets": b"\x20" + dfs_packet(0, 0, bytes(range(256)) * 3, False)
                                + dfs_packet(1, 768, b"tail", True),
            "seed-crc32-bpc7": b"\x03" + dfs_packet(0, 0, b"abcdefghijklmnop", True, "crc32", 7),
            "seed-resume-at-512": b"\x08" + dfs_packet(4, 512, b"z" * 600, True),
            "seed-ack": b"\x00" + b"".join(dfs_wire.encode({"op": "ack", "seq": 0, "status": "ok"})),
        },
        "shm": {
            "seed-handshake": shm_counters + b'{"capacity": 1048576}',
            "seed-wrapping": struct.pack("<QQBH", 10, 2**64 - 10, 12, 64) + b'{"capacity": 4096}',
        },
    }


def write(out: Path) -> list[Path]:
    written = []
    for target, files in seeds().items():
        (out / target).mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            path = out / target / name
            path.write_bytes(data)
            written.append(path)
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "native" / "fuzz" / "corpus"
    for p in write(out):
        print(p, p.stat().st_size)
