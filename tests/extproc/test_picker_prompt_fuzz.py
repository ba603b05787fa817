"""No request that the gateway admits makes ``engine-prefix-matches`` raise: whatever a chat's
messages, content parts, tool calls, tools or template options hold, the pick is made (a prompt the
picker cannot build as vLLM does is left to the approximate index). Property tests (Hypothesis)
through the gateway's own parsing (``extproc.decision.prepare``) into a scheduler with the default
profile, the simulated model's tokenizer and template, images modelled, every endpoint followed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.extproc.decision import prepare
from kvgate.policies.engine_blocks import EngineBlockIndex
from kvgate.policies.errors import KvgateError
from kvgate.policies.model_tokenizer import ModelTokenizer
from kvgate.policies.profile import build_profile, read_profile_document
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import ApiKind
from tests.extproc.fakes import FakePool
from tests.policies.helpers import NOW, view
from tests.policies.test_engine_prefix import View

MODEL = ModelTokenizer.load(Path(__file__).resolve().parents[2] / "simulator" / "data")
scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12,
)
kinds = st.sampled_from(["text", "image_url", "input_audio", "video_url", "refusal", "thinking", "input_text",
                         "image_embeds", "sticker"]) | st.lists(scalars, max_size=2) | json_values
part = st.fixed_dictionaries({"type": kinds}, optional={
    "text": json_values | st.text(max_size=20), "uuid": json_values | st.text(max_size=8),
    "image_url": json_values, "refusal": json_values, "thinking": json_values})
call = st.fixed_dictionaries({}, optional={
    "id": json_values, "type": json_values,
    "function": st.fixed_dictionaries({}, optional={"name": json_values,
                                                   "arguments": st.text(max_size=20) | json_values})})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | json_values},
    optional={"content": st.text(max_size=40) | st.lists(part | st.text(max_size=8) | json_values, max_size=3)
              | json_values,
              "tool_calls": st.lists(call | json_values, max_size=2) | json_values,
              "tool_call_id": json_values, "name": json_values, "reasoning": json_values},
)
options: dict[str, Any] = {
    "tools": st.lists(st.fixed_dictionaries({}, optional={"type": json_values, "function": json_values})
                      | json_values, max_size=2) | json_values,
    "documents": json_values,
    "add_generation_prompt": json_values,
    "continue_final_message": json_values,
    "chat_template_kwargs": st.dictionaries(st.text(max_size=6), json_values, max_size=2) | json_values,
    "add_special_tokens": json_values,
    "truncate_prompt_tokens": json_values,
}
bodies = st.fixed_dictionaries({"model": st.just("m"), "messages": st.lists(message, min_size=1, max_size=4)},
                               optional=options)


def scheduler() -> ProfileScheduler:
    document = dict(read_profile_document("default"))
    media = {"image": {"placeholder": "<image>", "tokens": 8, "token_id": 128_255},
             "audio": {"placeholder": "<audio>", "tokens": 4, "token_id": 128_254}}
    document["plugins"] = [
        {**plugin, "parameters": {"media": media}} if plugin["type"] == "engine-prefix-matches" else plugin
        for plugin in document["plugins"]]
    index = EngineBlockIndex()
    ids = MODEL.tokenizer.encode("<|begin_of_text|><|start_header_id|>system", add_special_tokens=False).ids
    index.stored(view(1).address, [1], None, (ids * 16)[:16], 16)
    return ProfileScheduler(build_profile(yaml.safe_load(yaml.safe_dump(document))), rng=random.Random(1),
                            engine_cache=View(index, {view(1).address, view(2).address}, MODEL))


SCHEDULER = scheduler()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_any_admitted_chat_is_scheduled(body: dict[str, Any]) -> None:
    try:
        prepared = prepare(pool=FakePool("p", ("10.0.0.1:8000",)), api=ApiKind.CHAT_COMPLETIONS,
                           headers=MappingProxyType({}), body=json.dumps(body).encode(), subset=None,
                           inject_usage=False, request_id="r")
    except KvgateError:
        return  # refused by the gateway (a 4xx): never reaches the picker
    result = SCHEDULER.schedule(prepared.request, [view(1), view(2)], NOW)
    assert result.pick is not None


completion_bodies = st.fixed_dictionaries(
    {"model": st.just("m"),
     "prompt": st.text(max_size=40) | st.lists(st.integers(0, 200_000), max_size=40)
     | st.lists(st.text(max_size=10) | st.lists(st.integers(0, 50), max_size=5), max_size=3) | json_values},
    optional={"add_special_tokens": json_values, "truncate_prompt_tokens": json_values,
              "cache_salt": json_values})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion_bodies)
def test_any_admitted_completion_is_scheduled(body: dict[str, Any]) -> None:
    try:
        prepared = prepare(pool=FakePool("p", ("10.0.0.1:8000",)), api=ApiKind.COMPLETIONS,
                           headers=MappingProxyType({}), body=json.dumps(body).encode(), subset=None,
                           inject_usage=False, request_id="r")
    except KvgateError:
        return
    assert SCHEDULER.schedule(prepared.request, [view(1), view(2)], NOW).pick is not None


responses_bodies = st.fixed_dictionaries(
    {"model": st.just("m"),
     "input": st.text(max_size=30) | st.lists(message | st.fixed_dictionaries(
         {"type": st.sampled_from(["message", "function_call_output", "reasoning"]) | json_values},
         optional={"role": json_values | st.sampled_from(["user", "assistant"]), "content": json_values,
                   "status": json_values}), max_size=3) | json_values},
    optional={"instructions": st.text(max_size=20) | json_values, "tools": json_values,
              "tool_choice": json_values, "previous_response_id": json_values})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses_bodies)
def test_any_admitted_responses_request_is_scheduled(body: dict[str, Any]) -> None:
    try:
        prepared = prepare(pool=FakePool("p", ("10.0.0.1:8000",)), api=ApiKind.RESPONSES,
                           headers=MappingProxyType({}), body=json.dumps(body).encode(), subset=None,
                           inject_usage=False, request_id="r")
    except KvgateError:
        return
    assert SCHEDULER.schedule(prepared.request, [view(1), view(2)], NOW).pick is not None
