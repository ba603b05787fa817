"""Images whose token count follows their size (``policies.vision_grid``: Qwen2-VL's dynamic
resolution) and the precise scorer past them (``engine-prefix-matches`` with a ``grid``)."""

from __future__ import annotations

import base64
import dataclasses
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from kvgate.policies.engine_blocks import EngineBlockIndex
from kvgate.policies.media import MediaItem, MediaTokens, media_items
from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.policies.vision_grid import VisionGrid, data_url_image_size
from tests.policies.helpers import NOW, request, view
from tests.policies.test_engine_prefix import View
from tests.policies.test_media import WORDS, engine_store, scheduler, text
from tests.policies.test_media import model_dir as model_dir  # the fixture


def png(width: int, height: int, body: int = 64) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + bytes(body)


def jpeg(width: int, height: int, exif: int) -> bytes:
    """SOI, an APP1 segment of ``exif`` bytes (a camera's EXIF), then the frame header (SOF0)."""
    app1 = b"\xff\xe1" + struct.pack(">H", exif + 2) + bytes(exif)
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app1 + sof + b"\xff\xd9"


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def test_token_counts_follow_qwen2_vls_smart_resize() -> None:
    grid = VisionGrid()  # Qwen2-VL / Qwen2.5-VL: 14-pixel patches merged 2 x 2
    assert grid.tokens(224, 224) == 64  # 8 x 8 cells of 28 pixels
    assert grid.tokens(640, 480) == 23 * 17  # 22.9 -> 23 cells wide, 17.1 -> 17 high
    assert grid.tokens(480, 640) == grid.tokens(640, 480)  # a transpose: EXIF orientation does not matter
    assert grid.tokens(70, 70) == 4  # 2.5 cells round to even (Python's round, as transformers'): 2 x 2
    assert grid.tokens(98, 98) == 16  # 3.5 -> 4
    assert grid.tokens(10, 10) == 4  # below min_pixels: scaled up to 56 x 56
    assert grid.tokens(10_000, 10_000) == 127 * 127  # above max_pixels: scaled down (12,845,056)
    assert grid.tokens(100, 20_001) is None  # more elongated than 200:1: the engine refuses it
    assert VisionGrid(patch_size=16).tokens(256, 256) == 64  # Qwen3-VL's 16-pixel patches: 32-pixel cells


def test_sizes_come_from_data_urls_headers_only() -> None:
    assert data_url_image_size(data_url(png(640, 480))) == (640, 480)
    gif = b"GIF89a" + struct.pack("<HH", 33, 17) + bytes(20)
    assert data_url_image_size(data_url(gif, "image/gif")) == (33, 17)
    assert data_url_image_size(data_url(jpeg(800, 600, 200), "image/jpeg")) == (800, 600)
    # the frame header 60 KiB in (a large EXIF segment): found in the second, larger read
    assert data_url_image_size(data_url(jpeg(1024, 768, 60_000), "image/jpeg")) == (1024, 768)
    # ... or in the whole data
    late = jpeg(1024, 768, 65_000) + bytes(200_000)
    assert data_url_image_size(data_url(late, "image/jpeg")) == (1024, 768)
    assert data_url_image_size("https://example.com/cat.png") is None  # only the engine fetches it
    assert data_url_image_size("data:image/png,rawbytes") is None  # not base64
    assert data_url_image_size("data:image/png;base64,bm90IGFuIGltYWdl") is None  # "not an image"


def test_an_items_count_is_fixed_or_from_its_size() -> None:
    url = data_url(png(224, 224))
    item = media_items([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])[0]
    assert item == MediaItem("image", None, url)
    assert MediaTokens("<image>", 576).count(item) == 576
    grid = MediaTokens("<|image_pad|>", 0, grid=VisionGrid())
    assert grid.count(item) == 64
    assert grid.count(MediaItem("image", "cat", "https://example.com/cat.png")) is None
    assert grid.count(MediaItem("image", "cat")) is None


def image(uuid: str, width: int, height: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(png(width, height))}, "uuid": uuid}


@pytest.mark.parametrize("model_dir", ["openai"], indirect=True)
def test_a_conversation_past_images_of_different_sizes_is_matched(model_dir: Path) -> None:
    """The engine expanded each image to its own count (224 x 224: 64 tokens, 640 x 480: 391; written
    here, not computed by kvgate's grid); kvgate with the grid matches the whole conversation, with a
    fixed count only up to the second image."""
    model = ModelTokenizer.load(model_dir)
    assert model.chat_template is not None
    image_id = model.tokenizer.token_to_id("<image>")
    assert image_id is not None
    history: list[dict[str, Any]] = [{"role": "system", "content": " ".join(WORDS[:40])},
               {"role": "user", "content": [image("small", 224, 224), text(" ".join(WORDS[40:60])),
                                            image("photo", 640, 480), text(" ".join(WORDS[60:90]))]},
               {"role": "assistant", "content": " ".join(WORDS[90:160])}]
    rendered = model.chat_template.render(history, {"image": "<image>"})
    pieces = rendered.split("<image>")
    assert len(pieces) == 3

    def encode(piece: str) -> list[int]:
        return list(model.tokenizer.encode(piece, add_special_tokens=False).ids)

    tokens = encode(pieces[0])
    spans = [("small", len(tokens), 64)]
    tokens += [image_id] * 64 + encode(pieces[1])
    spans.append(("photo", len(tokens), 391))
    tokens += [image_id] * 391 + encode(pieces[2])
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    engine_store(index, a.address, tokens, spans)
    whole = len(tokens) // 16
    cache = View(index, {a.address, b.address}, model)

    def cached(media: dict[str, Any]) -> int:
        s = scheduler(cache, {"image": media})
        messages = [*history, {"role": "user", "content": " ".join(WORDS[160:170])}]
        result = s.schedule(dataclasses.replace(request("r", "flattened"), messages=messages), [a, b], NOW)
        return (result.predicted_cached_tokens or 0) // 16 if result.pick.address == a.address else 0

    assert cached({"placeholder": "<image>", "grid": {}}) >= whole - 4  # the 64-token units of the index
    assert cached({"placeholder": "<image>", "tokens": 64}) <= (spans[1][1] + 64) // 16 + 4


def test_grid_parameters_are_checked() -> None:
    from kvgate.policies.errors import ConfigError
    from kvgate.policies.plugins.engine_prefix import EnginePrefixBlueprint

    with pytest.raises(ConfigError, match="either"):
        EnginePrefixBlueprint.from_parameters({"media": {"image": {"placeholder": "<i>"}}})
    with pytest.raises(ConfigError, match="either"):
        EnginePrefixBlueprint.from_parameters(
            {"media": {"image": {"placeholder": "<i>", "tokens": 5, "grid": {}}}})
    with pytest.raises(ConfigError, match="for images"):
        EnginePrefixBlueprint.from_parameters({"media": {"video": {"placeholder": "<v>", "grid": {}}}})
    blueprint = EnginePrefixBlueprint.from_parameters(
        {"media": {"image": {"placeholder": "<|image_pad|>", "token_id": 151655,
                             "grid": {"min_pixels": 200_704, "max_pixels": 1_003_520}}}})
    assert blueprint.media["image"].grid == VisionGrid(min_pixels=200_704, max_pixels=1_003_520)
