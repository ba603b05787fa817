#!/usr/bin/env bash
# Regenerates the Python modules of kvgate's own protos (proto/kvgate_proto/*.proto → *_pb2.py and
# .pyi beside them; the package is `kvgate_proto`, a name no other distribution uses, unlike `proto`)
# with the protoc that grpcio-tools ships (a dev dependency). tests/proto/test_generated.py fails when
# the checked-in modules differ from what this writes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m grpc_tools.protoc -I proto --python_out=proto --pyi_out=proto proto/kvgate_proto/*.proto
