"""Multimodal chat prompts as vLLM builds them (``policies.media``, ``policies.media_prompt``) and
the precise scorer past a media item (``engine-prefix-matches`` with ``media``).

The engine side of the composition tests is an independent transcription of vLLM's
``kv_cache_utils._gen_mm_extra_hash_keys`` / ``generate_block_hash_extra_keys`` (``vllm_extra_keys``
below) feeding ``EngineBlockIndex`` as the KV-event subscriber does."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from kvgate.policies.engine_blocks import EngineBlockIndex, chain_root
from kvgate.policies.media import (
    MediaItem,
    MediaTokens,
    detect_content_format,
    media_items,
    string_content,
)
from kvgate.policies.media_prompt import media_block_keys, media_prompt_tokens
from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.policies.profile import build_profile, read_profile_document
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import InferenceRequest
from tests.policies.helpers import NOW, request, view
from tests.policies.test_engine_prefix import View

WORDS = [f"w{i}" for i in range(300)]
IMAGE_TOKENS = 40
STRING_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </s> {% endfor %}"
                   "{% if add_generation_prompt %}<assistant> {% endif %}")
OPENAI_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {% for part in m['content'] %}"
                   "{% if part['type'] == 'image' %}<image> {% else %}{{ part['text'] }} {% endif %}"
                   "{% endfor %}</s> {% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}")


def image(uuid: str | None = None, url: str = "data:image/png;base64,AAAA") -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if uuid is not None:
        part["uuid"] = uuid
    return part


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


@pytest.fixture(params=["string", "openai"])
def model_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A model directory: a word-level tokenizer.json with ``<image>`` a token of its own, and a
    chat template of either content format."""
    vocab = ["[UNK]", *WORDS, "<image>", "</s>", "<assistant>", "<user>", "<system>"]
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    template = STRING_TEMPLATE if request.param == "string" else OPENAI_TEMPLATE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return tmp_path


def test_the_content_format_is_detected_as_vllm_detects_it() -> None:
    assert detect_content_format(STRING_TEMPLATE) == "string"
    assert detect_content_format(OPENAI_TEMPLATE) == "openai"
    assert detect_content_format("{% for p in message.content | default([]) %}{% endfor %}") == "openai"
    assert detect_content_format("{{ messages[0]['content'] }}") == "string"
    assert detect_content_format("{% for x in %}") == "string"  # does not parse: vLLM's default


def test_string_content_puts_missing_placeholders_in_front_joined_by_newlines() -> None:
    placeholders = {"image": "<image>", "audio": "<audio>"}
    parts = [text("look"), image(), {"type": "input_audio", "input_audio": {}}, image(), text("here")]
    assert string_content(parts, placeholders) == "<image>\n<image>\n<audio>\nlook\nhere"
    # one the text holds already is left where it is
    assert string_content([text("a <image> b"), image(), image()], placeholders) == "<image>\na <image> b"
    assert string_content([image()], placeholders) == "<image>\n"
    assert string_content([text("x"), image()], {}) == "x"  # no placeholder named: text parts only
    assert string_content("plain", placeholders) == "plain"


def test_openai_content_gives_the_template_typed_parts() -> None:
    from kvgate.policies.chat_messages import vllm_conversation

    def content(value: object) -> object:
        return vllm_conversation([{"role": "user", "content": value}], "openai", {})[0]["content"]

    assert content([text("a"), image(), "b"]) == [
        {"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]
    assert content("plain") == [{"type": "text", "text": "plain"}]
    assert content(None) == []


def test_media_items_are_in_prompt_order_with_the_clients_uuids() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [image("cat"), text("x"), {"type": "video_url", "uuid": ""}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "audio_url", "uuid": "song"}]}]
    assert media_items(messages) == [MediaItem("image", "cat", "data:image/png;base64,AAAA"),
                                     MediaItem("video", None), MediaItem("audio", "song")]


def encode_words(piece: str) -> list[int]:
    return [len(w) for w in piece.split()]


def test_tokens_expand_each_placeholder_and_pair_items_per_modality() -> None:
    media = {"image": MediaTokens("<I>", 3), "audio": MediaTokens("<A>", 2)}
    items = [MediaItem("image", "i1"), MediaItem("audio", "a1"), MediaItem("image", "i2")]
    prompt = media_prompt_tokens("x <I> yy <I> zzz <A> w", items, media, {"image": 7, "audio": 9},
                                 encode_words)
    assert prompt == ([1, 7, 7, 7, 2, 7, 7, 7, 3, 9, 9, 1],
                      [("i1", 1, 3), ("i2", 5, 3), ("a1", 9, 2)])
    # a count that differs from the items': nothing modelled
    assert media_prompt_tokens("<I>", items, media, {"image": 7, "audio": 9}, encode_words) is None
    assert media_prompt_tokens("<I> <I> <A>", items, media, {"image": 7}, encode_words) is None


def vllm_extra_keys(spans: list[tuple[str, int, int]], start: int, end: int, lora: str | None,
                    salt: str | None) -> tuple[Any, ...] | None:
    """vLLM's ``generate_block_hash_extra_keys`` for one block (its ``_gen_mm_extra_hash_keys`` loop,
    transcribed: items sorted by offset, each one the block overlaps as (identifier, offset - start))."""
    mm: list[Any] = []
    for identifier, offset, length in spans:
        if end > offset:
            if start >= offset + length:
                continue
            mm.append((identifier, offset - start))
            if end < offset + length:
                break
        else:
            break
    keys = ([lora] if lora else []) + mm + ([salt] if start == 0 and salt else [])
    return tuple(keys) if keys else None


def engine_store(index: EngineBlockIndex, endpoint: str, tokens: list[int], spans: list[tuple[str, int, int]],
                 lora: str | None = None, salt: str | None = None, split: int | None = None) -> None:
    """What vLLM reports for a prompt's whole blocks (in two events when ``split`` is given: a
    continuation names the last block of the first as its parent), as the subscriber decodes it
    (msgpack arrays are lists)."""
    whole = len(tokens) // 16
    extras = [vllm_extra_keys(spans, b * 16, b * 16 + 16, lora, salt) for b in range(whole)]
    decoded = [json.loads(json.dumps(e)) if e is not None else None for e in extras]
    cut = whole if split is None else split
    index.stored(endpoint, list(range(cut)), None, tokens[:cut * 16], 16, lora=lora, extra_keys=decoded[:cut])
    if cut < whole:
        index.stored(endpoint, list(range(cut, whole)), cut - 1, tokens[cut * 16:whole * 16], 16, lora=lora,
                     extra_keys=decoded[cut:])


def test_keys_of_a_multimodal_prompt_match_what_the_engine_stored() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(100) for _ in range(200)]
    spans = [("cat", 20, 40), ("dog", 60, 10), ("cat", 150, 40)]  # dog shares blocks 3 and 4 with cat
    for lora, salt, split in ((None, None, None), ("sql", None, 5), (None, "s1", 3), ("sql", "s1", None)):
        index = EngineBlockIndex()
        engine_store(index, "a", tokens, spans, lora, salt, split)
        if lora:
            assert index.knows_adapter(lora)
        keys = media_block_keys(tokens, 16, chain_root(lora, salt), spans, lora, salt)
        assert len(keys) == 200 // 16
        assert index.matches(keys) == {"a": 200 // 16}, (lora, salt, split)
        other = media_block_keys(tokens, 16, chain_root(lora, salt), [("cat", 20, 40), ("cow", 60, 10),
                                                                     ("cat", 150, 40)], lora, salt)
        assert index.matches(other) == {"a": 3}  # up to the first block that holds the other image


def test_keys_stop_before_the_first_block_holding_an_unnamed_item() -> None:
    tokens = list(range(100))
    keys = media_block_keys(tokens, 16, chain_root(), [("a", 10, 5), (None, 40, 20)], None, None)
    assert len(keys) == 2  # blocks 0-1; block 2 holds the unnamed item
    assert media_block_keys(tokens, 16, chain_root(), [(None, 0, 4)], None, None) == []


def scheduler(cache: View, media: dict[str, Any]) -> ProfileScheduler:
    document = dict(read_profile_document("default"))
    document["plugins"] = [
        {**plugin, "parameters": {"media": media}} if plugin["type"] == "engine-prefix-matches" else plugin
        for plugin in document["plugins"]]
    return ProfileScheduler(build_profile(yaml.safe_load(yaml.safe_dump(document))), rng=random.Random(1),
                            engine_cache=cache)


def conversation(first_image: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": " ".join(WORDS[:50])},
            {"role": "user", "content": [text(" ".join(WORDS[50:70])), first_image]},
            {"role": "assistant", "content": " ".join(WORDS[70:150])}]


def test_a_conversation_past_its_image_is_matched_where_the_client_named_the_image(model_dir: Path) -> None:
    """The engine stored the conversation as vLLM renders and expands it; the next turn's request
    matches past the image (both content formats), an unnamed image or another one only before it."""
    model = ModelTokenizer.load(model_dir)
    assert model.chat_template is not None
    image_id = model.tokenizer.token_to_id("<image>")
    assert image_id is not None
    history = conversation(image("photo-1"))
    rendered = model.chat_template.render(history, {"image": "<image>"})
    engine = MediaTokens("<image>", IMAGE_TOKENS)
    items = media_items(history)
    prompt = media_prompt_tokens(rendered, items, {"image": engine}, {"image": image_id},
                                 lambda piece: model.tokenizer.encode(piece, add_special_tokens=False).ids)
    assert prompt is not None
    tokens, spans = prompt
    assert tokens.count(image_id) == IMAGE_TOKENS
    assert spans[0][0] == "photo-1"
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    engine_store(index, a.address, tokens, [(str(i), o, n) for i, o, n in spans])
    whole = len(tokens) // 16
    s = scheduler(View(index, {a.address, b.address}, model), {"image": {"placeholder": "<image>",
                                                                       "tokens": IMAGE_TOKENS}})
    before_image = spans[0][1] // 16

    def cached(first_image: dict[str, Any]) -> int:
        messages = [*conversation(first_image), {"role": "user", "content": " ".join(WORDS[150:160])}]
        chat = dataclasses.replace(request("r", "flattened"), messages=messages)
        result = s.schedule(chat, [a, b], NOW)
        return (result.predicted_cached_tokens or 0) // 16 if result.pick.address == a.address else 0

    named = cached(image("photo-1"))
    assert named >= whole - 4  # the 64-token units of the approximate index
    assert cached(image("photo-1")) == named  # the remembered chunks were left as they were
    assert cached(image()) <= before_image  # unnamed: the engine's identifier is unknown
    assert cached(image("photo-2")) <= before_image


def test_media_parameters_are_checked() -> None:
    from kvgate.policies.errors import ConfigError
    from kvgate.policies.plugins.engine_prefix import EnginePrefixBlueprint

    with pytest.raises(ConfigError):
        EnginePrefixBlueprint.from_parameters({"media": {"image": {"placeholder": "<image>", "tokens": 0}}})
    blueprint = EnginePrefixBlueprint.from_parameters(
        {"media": {"image": {"placeholder": "<image>", "tokens": 576, "token_id": 32000}}})
    assert blueprint.media == {"image": MediaTokens("<image>", 576, 32000)}


def chat_request(rid: str, messages: list[dict[str, Any]]) -> InferenceRequest:
    """A chat request as the gateway builds it (its prompt the messages flattened, images as digests)."""
    from kvgate.extproc.openai_request import parse_request_body
    from kvgate.policies.types import ApiKind

    body = json.dumps({"model": "m", "messages": messages}).encode()
    prompt = parse_request_body(ApiKind.CHAT_COMPLETIONS, body).prompt
    return dataclasses.replace(request(rid, prompt), messages=messages)


@pytest.mark.parametrize("media", [{"image": {"placeholder": "<image>", "tokens": IMAGE_TOKENS}}, {}],
                         ids=["unnamed image", "modality not modelled"])
def test_past_an_item_kvgate_cannot_key_the_approximate_guess_still_counts(
        model_dir: Path, media: dict[str, Any]) -> None:
    """An image without a name (or a modality the profile does not name): the engines' report says
    who holds the conversation up to it, the approximate index (which kvgate keeps from its own
    picks, the image as a digest) who holds it past it. An endpoint that holds all kvgate can key
    keeps the approximate index's longer guess; before, the report replaced it and the turn lost
    its affinity past the image."""
    model = ModelTokenizer.load(model_dir)
    template = model.chat_template
    assert template is not None
    history = conversation(image())  # no uuid
    a, b = view(1), view(2)
    index = EngineBlockIndex()
    s = scheduler(View(index, {a.address, b.address}, model), media)
    rendered = template.render(history, {"image": "<image>"}, {"add_generation_prompt": False})
    before = rendered[:rendered.index("<image>")]  # the engine's prompt up to the image
    tokens = model.tokenizer.encode(before, add_special_tokens=False).ids
    whole = len(tokens) // 16
    for endpoint in (a, b):  # both hold the conversation up to the image, as their engines report
        hashes = [(endpoint.address, i) for i in range(whole)]
        index.stored(endpoint.address, hashes, None, tokens[:whole * 16], 16)
    warm = chat_request("warm", history)
    s.on_picked(warm, b.endpoint, NOW)  # kvgate sent the conversation to b: its approximate index knows
    s.on_finished(warm, b.endpoint, ok=True, now=NOW)
    chat = chat_request("r", [*history, {"role": "user", "content": "and the crews"}])
    result = s.schedule(chat, [a, b], NOW)
    assert result.pick.address == b.address
    assert (result.predicted_cached_tokens or 0) > whole * 16
