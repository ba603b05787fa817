"""The checked-in modules of proto/ are what protoc writes from the .proto files now
(regenerate with scripts/gen_proto.sh)."""

from __future__ import annotations

import shutil
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]


def test_generated_modules_match_their_protos(tmp_path: Path) -> None:
    protos = sorted((ROOT / "proto").glob("*.proto"))
    assert protos, "proto/ holds no .proto file"
    (tmp_path / "proto").mkdir()
    for source in protos:
        shutil.copy(source, tmp_path / "proto" / source.name)
    names = [f"proto/{source.name}" for source in protos]
    out = [f"-I{tmp_path}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    assert protoc.main(["protoc", *out, *names]) == 0
    for source in protos:
        for suffix in ("_pb2.py", "_pb2.pyi"):
            name = source.stem + suffix
            fresh = (tmp_path / "proto" / name).read_text()
            stale = f"proto/{name} is stale: bash scripts/gen_proto.sh"
            assert (ROOT / "proto" / name).read_text() == fresh, stale
