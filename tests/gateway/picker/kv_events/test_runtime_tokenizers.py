"""The pools' tokenizers (``KvEventsRuntime.load_tokenizers``): loaded once per file version, a pool
whose tokenizer cannot load is a ConfigError naming it, and each pool's view hands its own out."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvgate.gateway.picker.kv_events.runtime import KvEventsRuntime
from kvgate.gateway.picker.pools_file import PoolSpec
from kvgate.policies.errors import ConfigError

SIM_MODEL = Path(__file__).resolve().parents[4] / "simulator" / "data"


def pool(name: str, tokenizer: str | None) -> PoolSpec:
    events: dict[str, object] = {"port": 5557, **({"tokenizer": tokenizer} if tokenizer else {})}
    return PoolSpec.model_validate({"name": name, "endpoints": [], "kvEvents": events})


async def test_tokenizers_load_once_per_file_version_and_views_hand_out_their_pools(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(SIM_MODEL, model)
    runtime = KvEventsRuntime()
    specs = [pool("a", str(model)), pool("b", str(model)), pool("c", None)]
    first = runtime.load_tokenizers(specs)
    runtime.apply(specs, first)
    try:
        assert set(first) == {"a", "b"}
        assert first["a"] is first["b"]  # one load for one path
        a_view = runtime.view("a")
        assert a_view.tokenizer() is first["a"]
        assert a_view.tokenizer().chat_template is not None  # type: ignore[union-attr]
        assert runtime.view("c").tokenizer() is None
        assert runtime.load_tokenizers(specs)["a"] is first["a"]  # unchanged file: kept
        stat = (model / "tokenizer.json").stat()
        os.utime(model / "tokenizer.json", (stat.st_atime, stat.st_mtime + 5))
        os.utime(model, (stat.st_atime, stat.st_mtime + 5))
        assert runtime.load_tokenizers(specs)["a"] is not first["a"]  # a new version: loaded again
    finally:
        await runtime.stop()


def test_a_tokenizer_that_cannot_load_names_its_pool(tmp_path: Path) -> None:
    runtime = KvEventsRuntime()
    with pytest.raises(ConfigError, match=r"pool 'x'.*no-such"):
        runtime.load_tokenizers([pool("x", str(tmp_path / "no-such.json"))])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"pool 'y'.*cannot load tokenizer"):
        runtime.load_tokenizers([pool("y", str(tmp_path / "bad.json"))])
