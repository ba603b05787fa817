"""``policies.chat_messages``: messages as vLLM hands them to the chat template (its
``_parse_chat_message_content`` and ``_postprocess_messages``), and what that changes for an
agent's conversation matched on the engines' reports."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.policies.chat_messages import vllm_conversation
from kvgate.policies.engine_blocks import EngineBlockIndex
from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.policies.profile import build_profile, read_profile_document
from kvgate.policies.scheduler import ProfileScheduler
from tests.policies.helpers import NOW, request, view
from tests.policies.test_engine_prefix import View
from tests.policies.test_model_tokenizer import model_dir

CALL: dict[str, Any] = {"id": "call_1", "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
AGENT: list[dict[str, Any]] = [
    {"role": "system", "content": "you are an agent"},
    {"role": "user", "content": "weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL], "refusal": None, "audio": None,
     "function_call": None, "annotations": []},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "rain"},
                                                           {"type": "text", "text": "9 C"}]},
]


def test_messages_are_rebuilt_as_vllm_rebuilds_them() -> None:
    sent = copy.deepcopy(AGENT)
    string = vllm_conversation(sent, "string", {})
    assert sent == AGENT  # the request's own messages are left as they are
    parsed_call = {**CALL, "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    assert string[2] == {"role": "assistant", "content": "", "tool_calls": [parsed_call]}
    assert string[3] == {"role": "tool", "content": "rain\n9 C", "tool_call_id": "call_1"}
    openai = vllm_conversation(sent, "openai", {})
    assert openai[0]["content"] == [{"type": "text", "text": "you are an agent"}]
    assert openai[2]["content"] == []
    assert openai[3]["content"] == "rain\n9 C"  # a tool message's text parts joined in either format


def test_tool_call_arguments_reasoning_names_and_parts() -> None:
    calls = [{"function": {"name": "a", "arguments": "not json"}},
             {"function": {"name": "b", "arguments": None}},
             {"function": {"name": "c", "arguments": [1]}}]
    messages: list[dict[str, Any]] = [
        {"role": "assistant", "content": "x", "tool_calls": calls, "reasoning": "think"},
        {"role": "assistant", "content": "y", "tool_calls": []},
        {"role": "developer", "content": "d", "tools": [{"name": "t"}], "name": "dev", "extra": 1},
        {"role": "user", "content": [
            {"type": "refusal", "refusal": "no"}, {"type": "thinking", "thinking": "hm"},
            {"type": "input_text", "text": "i"}, {"type": "text", "text": None}, "s"]},
    ]
    out = vllm_conversation(messages, "string", {})
    assert [c["function"]["arguments"] for c in out[0]["tool_calls"]] == [{}, {}, [1]]
    assert (out[0]["reasoning"], out[0]["reasoning_content"]) == ("think", "think")
    assert "tool_calls" not in out[1]  # an empty list is dropped
    assert out[2] == {"role": "developer", "content": "d", "name": "dev", "tools": [{"name": "t"}]}
    assert out[3]["content"] == "no\nhm\ni\ns"
    with pytest.raises(ValueError, match="does not take"):
        vllm_conversation([{"role": "user", "content": [{"type": "sticker"}]}], "string", {})
    with pytest.raises(ValueError, match="does not take"):
        vllm_conversation([{"role": "user", "content": [{"text": "no type"}]}], "string", {})


TOOL_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %}"
    "<call>{{ c['function']['name'] }} {{ c['function']['arguments'] | tojson }}</call>"
    "{% endfor %}{% endif %}"
    "</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


def test_an_agents_next_turn_is_matched_past_its_tool_calls(tmp_path: Path) -> None:
    """The engine rendered the conversation as vLLM gives it to the template (the call's arguments
    an object); the picker, rendering it the same way, matches the next turn past the tool call and
    its result. Rendered from the messages as sent (the arguments a JSON string), it matched only up
    to the call."""
    model = ModelTokenizer.load(model_dir(tmp_path, {"chat_template": TOOL_TEMPLATE}))
    template = model.chat_template
    assert template is not None
    long_system = {"role": "system", "content": "the and for are but not " * 30}
    history = [long_system, *AGENT[1:]]
    rendered = template.render(history, options={"add_generation_prompt": False})
    assert '<call>weather {"city": "Oslo"}</call>' in rendered
    tokens = model.tokenizer.encode(rendered, add_special_tokens=False).ids
    whole = len(tokens) // 16
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(whole)), None, tokens[:whole * 16], 16)
    document = dict(read_profile_document("default"))
    s = ProfileScheduler(build_profile(yaml.safe_load(yaml.safe_dump(document))), rng=random.Random(1),
                         engine_cache=View(index, {a.address, b.address}, model))
    turn = [*history, {"role": "assistant", "content": "it rains"},
            {"role": "user", "content": "and tomorrow?"}]
    chat = dataclasses.replace(request("r", "flattened"), messages=json.loads(json.dumps(turn)))
    result = s.schedule(chat, [a, b], NOW)
    assert result.pick.address == a.address
    assert (result.predicted_cached_tokens or 0) >= (whole - 4) * 16
