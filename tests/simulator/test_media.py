"""Images in the simulator's chat requests (``simulator.media``): vLLM's placeholders, the image
tokens, blocks hashed and reported with ``(identifier, offset)``; and, composed with the picker's
side (vLLM's wire format, the subscriber's decoder, ``EngineBlockIndex``, ``policies.media_prompt``
with the repository's model directory), a conversation matched past its image."""

from __future__ import annotations

import base64
import dataclasses
import struct
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from kvgate.gateway.picker.kv_events.subscriber import apply_batch
from kvgate.gateway.picker.kv_events.wire import decode_batch
from kvgate.policies.engine_blocks import EngineBlockIndex, chain_root
from kvgate.policies.media import MediaTokens, media_items
from kvgate.policies.media_prompt import media_block_keys, media_prompt_tokens
from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.policies.vision_grid import VisionGrid
from kvgate.simulator import openai_api as api
from kvgate.simulator.cli import build_parser
from kvgate.simulator.cli import fleet_config as cli_fleet_config
from kvgate.simulator.engine_types import SimRequest, Stored
from kvgate.simulator.file_tokenizer import BUNDLED, file_encoder
from kvgate.simulator.fleet import Fleet
from kvgate.simulator.kv_events import vllm_events
from kvgate.simulator.media import (
    DEFAULT_IMAGE_TOKENS,
    IMAGE_PLACEHOLDER,
    IMAGE_TOKEN_ID,
    ImageGrid,
    ImageTokens,
    MediaError,
    expand_images,
    image_identifiers,
    with_placeholders,
)
from kvgate.simulator.request_fields import ApiError
from tests.simulator.conftest import MODEL, fleet_config
from tests.simulator.test_engine import _drain
from tests.simulator.test_engine_support import make_engine


def png_url(width: int, height: int) -> str:
    """A data URL of a PNG's signature and header (all that a size needs)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk).decode()


def image(uuid: str | None = None, url: str = "data:image/png;base64,AAAA") -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def test_placeholders_go_in_front_of_a_messages_text_as_vllm_puts_them() -> None:
    parts = [{"type": "text", "text": "what is"}, image(), {"type": "text", "text": "this"}, image()]
    assert with_placeholders(parts) == "<image>\n<image>\nwhat is\nthis"
    assert with_placeholders([{"type": "text", "text": "a <image> b"}, image()]) == "a <image> b"
    assert with_placeholders("plain") == "plain"


def test_identifiers_are_the_clients_uuids_or_a_hash_of_what_was_sent() -> None:
    messages = [{"role": "user", "content": [image("cat"), image(), image(url="data:other")]}]
    found = image_identifiers(messages)
    assert found[0] == "cat"
    assert found[1].startswith("sim-")
    assert found[1] != found[2]
    assert image_identifiers(messages)[1] == found[1]
    with pytest.raises(MediaError, match="audio"):
        image_identifiers([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])
    with pytest.raises(MediaError, match="uuid"):
        image_identifiers([{"role": "user", "content": [{"type": "image_url", "image_url": None}]}])


def test_each_placeholder_becomes_the_images_tokens() -> None:
    def encode(text: str) -> tuple[int, ...]:
        return tuple(len(w) for w in text.split())

    tokens, spans = expand_images("ab <image> cde <image> f", ["x", "y"], encode, [3, 3])
    assert tokens == (2, IMAGE_TOKEN_ID, IMAGE_TOKEN_ID, IMAGE_TOKEN_ID, 3,
                      IMAGE_TOKEN_ID, IMAGE_TOKEN_ID, IMAGE_TOKEN_ID, 1)
    assert spans == (("x", 1, 3), ("y", 5, 3))
    with pytest.raises(MediaError, match="more '<image>' placeholders"):
        expand_images("<image> <image>", ["x"], encode, [3])


def test_a_chat_with_an_image_and_a_bad_part_through_the_api_parser() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image("p")]}]}
    parsed = api.parse_inference("chat", body, "m")
    assert parsed.prompt_tokens.count(IMAGE_TOKEN_ID) == DEFAULT_IMAGE_TOKENS
    assert [s[0] for s in parsed.media] == ["p"]
    plain = api.parse_inference("chat", {"messages": [{"role": "user", "content": "hi"}]}, "m")
    assert plain.media == ()
    bad = {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "v"}}]}]}
    with pytest.raises(ApiError) as err:
        api.parse_inference("chat", bad, "m")
    assert err.value.status == 400


def test_two_images_behind_the_same_tokens_are_other_blocks() -> None:
    engine = make_engine(kv_events=True, num_gpu_blocks=128, block_size=16)
    encode = file_encoder(BUNDLED)

    def submit(rid: str, uuid: str, now: float) -> float:
        content = [image(uuid), {"type": "text", "text": "the and " * 20}]
        body = {"messages": [{"role": "user", "content": content}]}
        parsed = api.parse_inference("chat", body, "m", encode)
        engine.submit(SimRequest(rid, parsed.prompt_tokens, 1, media=parsed.media), now)
        return _drain(engine, now)[0]

    now = submit("a", "one", 0.0)
    first = [e for e in engine.take_kv_events() if isinstance(e, Stored)]
    assert any(e.media for e in first)
    now = submit("b", "one", now)
    assert not [e for e in engine.take_kv_events() if isinstance(e, Stored)]  # all hit
    submit("c", "two", now)
    again = [e for e in engine.take_kv_events() if isinstance(e, Stored)]
    assert again  # the other image's blocks, and every one after them, are new
    assert all(e.media == () or e.media[0][0] == "two" for e in again)


@pytest.mark.parametrize("count", ["fixed", "grid"])
def test_the_pickers_keys_match_a_conversation_the_simulator_stored_past_its_image(count: str) -> None:
    """The simulated engine (the repository's tokenizer file) serves a chat with a named image; its
    events go through vLLM's wire format into the picker's index; the next turn's keys as the
    picker computes them (the model directory's template, ``media`` as the profile would name it)
    match every block of the first turn's prompt, past the image; an unnamed image only before it.
    ``grid``: the image's count follows its size (a 300 x 200 PNG) on both sides (Qwen2-VL's)."""
    encode = file_encoder(BUNDLED)
    url = png_url(300, 200) if count == "grid" else "data:image/png;base64,AAAA"
    engine_tokens: ImageTokens = ImageGrid() if count == "grid" else DEFAULT_IMAGE_TOKENS
    grid = VisionGrid() if count == "grid" else None
    engine = make_engine(kv_events=True, num_gpu_blocks=256, block_size=16)
    system = {"role": "system", "content": "the and for are but not you all " * 20}

    def turn(first_image: dict[str, Any]) -> list[dict[str, Any]]:
        return [system, {"role": "user", "content": [{"type": "text", "text": "can had her was one " * 6},
                                                     first_image]}]

    body = {"messages": turn(image("photo-1", url))}
    parsed = api.parse_inference("chat", body, "m", encode, engine_tokens)
    if grid is not None:
        assert parsed.prompt_tokens.count(IMAGE_TOKEN_ID) == 11 * 7  # 300 x 200 -> 308 x 196 pixels
    engine.submit(SimRequest("t1", parsed.prompt_tokens, 1, media=parsed.media), 0.0)
    now, _ = _drain(engine, 0.0)
    index = EngineBlockIndex()
    payload = msgspec.msgpack.encode({"ts": now, "events": vllm_events(engine.take_kv_events(), 16)})
    apply_batch(index, "r0", decode_batch("", 0, payload))
    stored = len(parsed.prompt_tokens) // 16
    assert index.blocks("r0") == stored

    model = ModelTokenizer.load(Path(BUNDLED).parent)
    template = model.chat_template
    assert template is not None
    media = {"image": MediaTokens(IMAGE_PLACEHOLDER, DEFAULT_IMAGE_TOKENS, IMAGE_TOKEN_ID, grid)}

    def picker_keys(first_image: dict[str, Any]) -> list[int]:
        messages = [*turn(first_image), {"role": "assistant", "content": "get has him his " * 5},
                    {"role": "user", "content": "how man new now old see two way " * 4}]
        text = template.render(messages, {"image": IMAGE_PLACEHOLDER})
        def encode_piece(piece: str) -> list[int]:
            return model.tokenizer.encode(piece, add_special_tokens=False).ids

        ids = {"image": IMAGE_TOKEN_ID}
        prompt = media_prompt_tokens(text, media_items(messages), media, ids, encode_piece)
        assert prompt is not None
        return media_block_keys(prompt[0], 16, chain_root(), prompt[1], None, None)

    assert index.matches(picker_keys(image("photo-1", url))) == {"r0": stored}
    image_block = parsed.media[0][1] // 16
    assert index.matches(picker_keys(image(None, url))).get("r0", 0) == image_block
    assert index.matches(picker_keys(image("photo-2", url))).get("r0", 0) == image_block


async def test_a_replica_expands_images_to_its_configured_count(http: aiohttp.ClientSession) -> None:
    """``kvgate sim --image-tokens N``: the count reaches the replica's chat, /tokenize and usage."""
    config = fleet_config(1)
    replica = dataclasses.replace(config.replicas[0], image_tokens=10)
    fleet = Fleet(dataclasses.replace(config, replicas=(replica,)))
    await fleet.start()
    try:
        messages = [{"role": "user", "content": [{"type": "text", "text": "what"}, image("p")]}]
        ask = {"model": MODEL, "messages": messages}
        async with http.post(fleet.urls[0] + "/tokenize", json=ask) as response:
            tokens = (await response.json())["tokens"]
        assert tokens.count(IMAGE_TOKEN_ID) == 10
        body = {"model": MODEL, "messages": messages, "max_tokens": 2}
        async with http.post(fleet.urls[0] + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            assert (await response.json())["usage"]["prompt_tokens"] == len(tokens)
    finally:
        await fleet.stop()
    args = build_parser().parse_args(["--image-tokens", "576"])
    assert {r.image_tokens for r in cli_fleet_config(args).replicas} == {576}
    with pytest.raises(ValueError, match="image-tokens"):
        cli_fleet_config(build_parser().parse_args(["--image-tokens", "0"]))



def test_a_grid_models_count_follows_each_images_size_and_needs_its_bytes() -> None:
    """``kvgate sim --image-grid``: Qwen2-VL's count per image (224 x 224: 64 tokens; 640 x 480:
    391), read from a data URL; an image by address, one that is not an image, or one more elongated
    than 200:1 is a 400 (vLLM cannot take it either)."""
    grid = ImageGrid()
    def parse(*urls: str) -> Any:
        content = [{"type": "text", "text": "what"}, *(image(f"u{i}", u) for i, u in enumerate(urls))]
        return api.parse_inference("chat", {"messages": [{"role": "user", "content": content}]}, "m",
                                   image_tokens=grid)

    parsed = parse(png_url(224, 224), png_url(640, 480))
    assert [n for _, _, n in parsed.media] == [64, 391]
    assert parsed.prompt_tokens.count(IMAGE_TOKEN_ID) == 64 + 391
    for url in ("https://example.com/cat.png", "data:image/png;base64,bm90IGFuIGltYWdl", png_url(10, 2001)):
        with pytest.raises(ApiError) as err:
            parse(url)
        assert err.value.status == 400
    args = build_parser().parse_args(["--image-grid"])
    assert {r.image_tokens for r in cli_fleet_config(args).replicas} == {ImageGrid()}
