#!/usr/bin/env bash
# Regenerates the Python modules of kvgate's own protos (proto/*.proto → *_pb2.py and .pyi beside
# them), as the package kvgate.proto (proto/ is linked from kvgate/proto), with the protoc that
# grpcio-tools ships (a dev dependency). tests/proto/test_generated.py fails when the checked-in
# modules differ from what this writes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. kvgate/proto/*.proto
