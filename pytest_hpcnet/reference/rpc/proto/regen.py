"""Regenerate the committed ``*_pb2.py`` modules from the ``.proto`` files in this directory.

    python pytest_hpcnet/reference/rpc/proto/regen.py

Uses grpcio-tools' bundled protoc. Recent protoc stamps its gencode with a runtime check that refuses
any protobuf runtime older than itself; the package promises ``protobuf>=4.25``, so the check is
dropped here. What remains (``AddSerializedFile`` + ``builder``) is the gencode shape protobuf has
accepted since 4.21, and ``tests/reference/test_rpc_wire.py`` checks the modules import and
round-trip.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = ("RpcHeader.proto", "IpcConnectionContext.proto", "ProtobufRpcEngine.proto", "Echo.proto")

_RUNTIME_CHECK = re.compile(
    r"from google\.protobuf import runtime_version as _runtime_version\n"
    r"|_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:.*\n)*?\)\n")


def main() -> int:
    from grpc_tools import protoc

    args = ["protoc", f"-I{HERE}", f"--python_out={HERE}"] + [str(HERE / p) for p in PROTOS]
    if protoc.main(args) != 0:
        print("protoc failed", file=sys.stderr)
        return 1
    for proto in PROTOS:
        out = HERE / proto.replace(".proto", "_pb2.py")
        text = _RUNTIME_CHECK.sub("", out.read_text())
        text = text.replace("# NO CHECKED-IN PROTOBUF GENCODE\n",
                            "# Regenerate with regen.py (runtime version check removed, see there).\n")
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
