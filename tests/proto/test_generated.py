"""The checked-in modules of proto/ (the package kvgate.proto) are what protoc writes from the .proto
files now (regenerate with scripts/gen_proto.sh)."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "proto"
IMPORT_PATH = Path("kvgate") / "proto"
"""Where protoc sees the files: their import path names the module, kvgate.proto.<name>_pb2."""


def test_generated_modules_match_their_protos(tmp_path: Path) -> None:
    protos = sorted(PACKAGE.glob("*.proto"))
    assert protos, "proto/ holds no .proto file"
    (tmp_path / IMPORT_PATH).mkdir(parents=True)
    for source in protos:
        shutil.copy(source, tmp_path / IMPORT_PATH / source.name)
    names = [f"{IMPORT_PATH.as_posix()}/{source.name}" for source in protos]
    out = [f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    assert protoc.main(["protoc", *out, *names]) == 0
    for source in protos:
        for suffix in ("_pb2.py", "_pb2.pyi"):
            name = source.stem + suffix
            fresh = (tmp_path / IMPORT_PATH / name).read_text()
            stale = f"proto/{name} is stale: bash scripts/gen_proto.sh"
            assert (PACKAGE / name).read_text() == fresh, stale
