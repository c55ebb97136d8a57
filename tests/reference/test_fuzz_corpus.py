"""The native fuzz targets' committed seed corpus (native/fuzz/corpus, written by
tests/reference/fuzz_corpus.py; `make fuzz` runs the targets from it): the committed seeds are what the
generator writes, and they are well-formed packets by the protobuf library's own parsing."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

from pytest_hpcnet.reference.rpc import wire

FUZZ = Path(__file__).resolve().parents[2] / "native" / "fuzz"
TARGETS = ("frame", "connection", "request", "response", "shm", "packet")


def _generator():
    spec = importlib.util.spec_from_file_location("fuzz_corpus", Path(__file__).with_name("fuzz_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_seeds_are_what_the_generator_writes(tmp_path):
    written = _generator().write(tmp_path)
    assert {p.parent.name for p in written} == set(TARGETS)
    for p in written:
        committed = FUZZ / "corpus" / p.parent.name / p.name
        assert committed.read_bytes() == p.read_bytes(), f"{committed} is stale: rerun tests/reference/fuzz_corpus.py"
    for target in TARGETS:
        extra = {p.name for p in (FUZZ / "corpus" / target).iterdir()} - {p.name for p in written}
        assert all(name.startswith("crash-") for name in extra), extra   # found crashes, kept as regressions


def _parts(body: bytes) -> list[bytes]:
    view, pos, parts = memoryview(body), 0, []
    while pos < len(body):
        part, pos = wire.read_delimited(view, pos)
        parts.append(bytes(part))
    return parts


def test_request_and_response_seeds_parse_with_protobuf():
    for path in sorted((FUZZ / "corpus" / "request").glob("seed-*")):
        header, *rest = _parts(path.read_bytes())
        h = wire.RpcRequestHeaderProto.FromString(header)
        assert h.clientId == bytes(range(16))
        if h.callId == wire.CONNECTION_CONTEXT_CALL_ID:
            assert wire.IpcConnectionContextProto.FromString(rest[0]).protocol == wire.ECHO_PROTOCOL
        elif rest:
            assert wire.RequestHeaderProto.FromString(rest[0]).declaringClassProtocolName == wire.ECHO_PROTOCOL
    for path in sorted((FUZZ / "corpus" / "response").glob("seed-*")):
        header, *rest = _parts(path.read_bytes())
        h = wire.RpcResponseHeaderProto.FromString(header)
        assert h.serverIpcVersionNum == wire.IPC_VERSION and len(rest) == (h.status == wire.SUCCESS)


def test_the_connection_seed_is_a_whole_conversation():
    data = (FUZZ / "corpus" / "connection" / "seed-echo-ping").read_bytes()
    assert data[0] == 0 and data[1:8] == wire.PREAMBLE
    pos, packets = 8, 0
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        pos += 4 + n
        packets += 1
    assert pos == len(data) and packets == 5   # context, echo, ping, heartbeat, close


def test_the_packet_seeds_are_block_store_packets_the_python_datanode_accepts():
    from pytest_hpcnet.reference.dfs import checksums
    from pytest_hpcnet.reference.dfs.wire import decode

    data = (FUZZ / "corpus" / "packet" / "seed-two-packets").read_bytes()
    pos, seen = 1, []
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        header, payload = decode(memoryview(data)[pos + 4:pos + 4 + n])
        ncrc = len(payload) - header["len"]
        checksums.verify(payload[ncrc:], payload[:ncrc], 512, "seed", 0, "crc32c", impl="python")
        seen.append((header["seq"], header["offset"], header["last"]))
        pos += 4 + n
    assert seen == [(0, 0, False), (1, 768, True)]
