"""A Responses API request's conversation as vLLM builds it (``extproc.responses_messages``), and
the picker keying it like a chat's: the engine that holds the conversation draws the request."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from kvgate.extproc.decision import prepare
from kvgate.extproc.responses_messages import responses_messages
from kvgate.policies.engine_blocks import EngineBlockIndex
from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.policies.profile import build_profile, read_profile_document
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import ApiKind
from tests.extproc.fakes import FakePool
from tests.policies.helpers import NOW, view
from tests.policies.test_engine_prefix import View

SIM_MODEL = Path(__file__).resolve().parents[2] / "simulator" / "data"


def test_instructions_and_input_become_the_messages_vllm_renders() -> None:
    assert responses_messages({"instructions": "be brief", "input": "hello"}) == (
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"})
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "b"}], "id": "m1",
              "status": "completed"},
             {"role": "user", "content": "c"}]
    assert responses_messages({"input": items}) == (
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "b"}]},
        {"role": "user", "content": "c"})
    assert responses_messages({"input": "x", "tools": [{"type": "function", "name": "f"}],
                               "tool_choice": "none"}) == ({"role": "user", "content": "x"},)


@pytest.mark.parametrize("document", [
    {"input": "x", "previous_response_id": "resp_1"},
    {"input": "x", "tools": [{"type": "function", "name": "f"}]},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": "o"}]},
    {"input": [{"type": "reasoning", "summary": []}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]},
    {"input": [{"role": "assistant", "content": "half", "status": "in_progress"}]},
    {"input": [{"role": "assistant", "content": [{"type": "output_text", "text": "a"},
                                                 {"type": "output_text", "text": "b"}]}]},
    {"input": []}, {"input": 5}, {"instructions": 5, "input": "x"},
])
def test_what_is_not_built_exactly_is_left_to_the_approximate_index(document: dict[str, Any]) -> None:
    assert responses_messages(document) is None


def test_a_responses_request_is_matched_on_the_engines_report_like_a_chat() -> None:
    model = ModelTokenizer.load(SIM_MODEL)
    template = model.chat_template
    assert template is not None
    history = [{"role": "system", "content": "you answer in the harbour's ledger " * 30},
               {"role": "user", "content": "which ships came in"}]
    rendered = template.render(history, options={"add_generation_prompt": False})
    tokens = model.tokenizer.encode(rendered, add_special_tokens=False).ids
    whole = len(tokens) // 16
    index = EngineBlockIndex()
    a, b = view(1), view(2)
    index.stored(a.address, list(range(whole)), None, tokens[:whole * 16], 16)
    profile = build_profile(yaml.safe_load(yaml.safe_dump(dict(read_profile_document("default")))))
    followed = View(index, {a.address, b.address}, model)
    s = ProfileScheduler(profile, rng=random.Random(1), engine_cache=followed)
    body = {"model": "m", "instructions": history[0]["content"],
            "input": [{"role": "user", "content": "which ships came in"},
                      {"role": "assistant", "content": "two"},
                      {"role": "user", "content": "and their cargo?"}]}
    prepared = prepare(pool=FakePool("p", ("10.0.0.1:8000",)), api=ApiKind.RESPONSES,
                       headers=MappingProxyType({}), body=json.dumps(body).encode(), subset=None,
                       inject_usage=False, request_id="r")
    result = s.schedule(prepared.request, [a, b], NOW)
    assert result.pick.address == a.address
    assert (result.predicted_cached_tokens or 0) >= (whole - 4) * 16
