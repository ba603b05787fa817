"""A request's fields that shape the engine's prompt, as vLLM builds it: a chat's other
chat-template inputs (``tools``, ``documents``, ``add_generation_prompt``, ``continue_final_message``,
``chat_template_kwargs``), and ``add_special_tokens``. Before, kvgate rendered every chat without
them, so a request with tools (whose definitions a Llama-3.1 or Qwen template puts in front of the
conversation) matched nothing the engines reported."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.policies.engine_blocks import EngineBlockIndex
from kvgate.policies.model_tokenizer import ChatTemplateError, ModelTokenizer, vllm_tool
from kvgate.policies.profile import build_profile, read_profile_document
from kvgate.policies.scheduler import ProfileScheduler
from tests.policies.helpers import NOW, request, view
from tests.policies.test_engine_prefix import View
from tests.policies.test_model_tokenizer import model_dir

TEMPLATE = (
    "{{ bos_token }}{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
    "{% if documents %}<docs>{{ documents | tojson }}</docs>{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<no_think>{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.fixture
def model(tmp_path: Path) -> ModelTokenizer:
    return ModelTokenizer.load(model_dir(tmp_path, {"bos_token": "<s>", "chat_template": TEMPLATE}))


def test_tools_reach_the_template_as_vllms_request_model_dumps_them(model: ModelTokenizer) -> None:
    assert vllm_tool({**WEATHER, "x-extra": 1}) == {
        "type": "function", "function": {"name": "weather", "description": None,
                                         "parameters": {"type": "object"}, "strict": None}, "x-extra": 1}
    assert model.chat_template is not None
    rendered = model.chat_template.render([{"role": "user", "content": "hi"}], options={"tools": [WEATHER]})
    dumped = json.dumps([vllm_tool(WEATHER)], ensure_ascii=False)
    assert rendered == f"<s><tools>{dumped}</tools><user>hi</s><assistant>"


def test_the_other_inputs_as_vllm_passes_them(model: ModelTokenizer) -> None:
    template = model.chat_template
    assert template is not None
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon "}]
    assert template.render(chat, options={"add_generation_prompt": False}) == (
        "<s><user>hi</s><assistant>Once upon </s>")
    # continue_final_message: cut after the last message's content (stripped), as transformers cuts it
    assert template.render(chat, options={"continue_final_message": True}) == (
        "<s><user>hi</s><assistant>Once upon")
    assert template.render(chat[:1], options={"chat_template_kwargs": {"enable_thinking": False},
                                              "documents": [{"title": "a"}]}) == (
        '<s><docs>[{"title": "a"}]</docs><no_think><user>hi</s><assistant>')
    with pytest.raises(ChatTemplateError, match="own chat template"):
        template.render(chat, options={"chat_template": "{{ messages }}"})


def test_a_request_with_tools_matches_what_the_engine_stored_for_it(model: ModelTokenizer) -> None:
    """The engine rendered the conversation with the tools (as vLLM does); the next request with the
    same tools is matched there, past the tool definitions; without its tools it would not be."""
    tools = [WEATHER, {"type": "function", "function": {"name": "search", "description": "the web " * 40}}]
    history = [{"role": "system", "content": "you help " * 60}, {"role": "user", "content": "rain today?"}]
    template = model.chat_template
    assert template is not None
    rendered = template.render(history, options={"tools": tools, "add_generation_prompt": False})
    tokens = model.tokenizer.encode(rendered, add_special_tokens=False).ids
    whole = len(tokens) // 16
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(whole)), None, tokens[:whole * 16], 16)
    document = dict(read_profile_document("default"))
    s = ProfileScheduler(build_profile(yaml.safe_load(yaml.safe_dump(document))), rng=random.Random(1),
                         engine_cache=View(index, {a.address, b.address}, model))

    def predicted(options: dict[str, Any] | None) -> int:
        messages = [*history, {"role": "assistant", "content": "no"}, {"role": "user", "content": "sure?"}]
        chat = dataclasses.replace(request("r", "flattened"), messages=messages, prompt_options=options)
        result = s.schedule(chat, [a, b], NOW)
        return (result.predicted_cached_tokens or 0) if result.pick.address == a.address else 0

    assert predicted({"tools": tools}) >= (whole - 4) * 16
    assert predicted(None) == 0  # the tools were in front: nothing else matches


def test_add_special_tokens_as_vllm_defaults_it_per_api(tmp_path: Path) -> None:
    """vLLM adds the tokenizer's special tokens (a BOS) to a completion's prompt unless
    ``add_special_tokens`` is false, and to a rendered chat only when it is true."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from tokenizers.processors import TemplateProcessing

    words = [f"w{i}" for i in range(100)]
    vocab = {w: i for i, w in enumerate(["[UNK]", "[BOS]", *words])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.post_processor = TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    bos = ModelTokenizer.load(tmp_path / "tokenizer.json")
    text = " ".join(words[:64])
    with_bos = bos.tokenizer.encode(text).ids
    assert with_bos[0] == 1
    a, b = view(1), view(2)
    index = EngineBlockIndex()
    index.stored(a.address, list(range(4)), None, with_bos[:64], 16)
    index.stored(b.address, [10, 11, 12, 13], None, with_bos[1:65], 16)  # the same prompt without it
    document = dict(read_profile_document("default"))
    s = ProfileScheduler(build_profile(yaml.safe_load(yaml.safe_dump(document))), rng=random.Random(1),
                         engine_cache=View(index, {a.address, b.address}, bos))
    default = request("r1", text + " w99")
    assert s.schedule(default, [a, b], NOW).pick.address == a.address
    without = dataclasses.replace(request("r2", text + " w98"), prompt_options={"add_special_tokens": False})
    assert s.schedule(without, [a, b], NOW).pick.address == b.address


def test_a_truncated_prompt_is_left_to_the_approximate_index(tmp_path: Path) -> None:
    """vLLM keeps the last ``truncate_prompt_tokens`` tokens: the blocks are not the prompt's, so the
    followed endpoints' reports must not replace the approximate guess."""
    from tests.policies.test_engine_prefix import scheduler as plain_scheduler

    model = ModelTokenizer.load(model_dir(tmp_path, {"chat_template": TEMPLATE}))
    document = "the and for are but not " * 40
    a, b = view(1), view(2)
    s = plain_scheduler(None, View(EngineBlockIndex(), {a.address, b.address}, model))
    s.on_picked(request("warm", document), b.endpoint, NOW)
    s.on_finished(request("warm", document), b.endpoint, ok=True, now=NOW)
    options = {"truncate_prompt_tokens": 50}
    truncated = dataclasses.replace(request("r", document + " you"), prompt_options=options)
    assert (s.schedule(truncated, [a, b], NOW).predicted_cached_tokens or 0) > 0
    assert s.schedule(request("r2", document + " all"), [a, b], NOW).predicted_cached_tokens == 0


def test_template_inputs_of_a_shape_vllm_refuses_are_not_predicted(model: ModelTokenizer) -> None:
    template = model.chat_template
    assert template is not None
    for options in ({"tools": "weather"}, {"documents": {"a": 1}}, {"chat_template_kwargs": [1]}):
        with pytest.raises(ChatTemplateError, match="refuses"):
            template.render([{"role": "user", "content": "hi"}], options=options)
