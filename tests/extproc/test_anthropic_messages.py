"""A Messages API request as the chat vLLM serves it (``extproc.anthropic_messages``), checked against
the simulator's own conversion (which follows vLLM's ``_convert_anthropic_to_openai_request``) and
for what is left to the approximate index."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvgate.extproc.anthropic_messages import anthropic_chat
from kvgate.extproc.openai_request import api_kind, parse_request_body
from kvgate.policies.errors import BadRequestError
from kvgate.policies.types import ApiKind
from kvgate.simulator.anthropic_api import chat_body
from tests.extproc.fakes import feed, make_machine, make_pool, request_body, request_headers

TOOLS = [{"name": "ledger", "description": "the harbour's ledger", "input_schema": {"properties": {}}},
         {"name": "tide", "input_schema": {"type": "object", "properties": {"port": {"type": "string"}}}}]
AGENT = [
    {"role": "user", "content": "which ships came in?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "ledger",
                                       "input": {"day": "today"}}]},
    {"role": "user", "content": [{"type": "tool_result", "id": "toolu_1", "content": "the brig"},
                                 {"type": "text", "text": "and tomorrow?"}, {"type": "text", "text": ""}]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "tide", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "id": "toolu_2", "is_error": False, "content": [
        {"type": "text", "text": "high at 6", "cache_control": None}]}]},
]


@pytest.mark.parametrize("body", [
    {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "max_tokens": 8, "system": "you keep the books", "messages": AGENT, "tools": TOOLS},
    {"model": "m", "max_tokens": 8,
     "system": [{"type": "text", "text": "you keep "}, {"type": "text", "text": "books"}],
     "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                  {"role": "assistant", "content": []}, {"role": "user", "content": "c"}]},
])
def test_the_chat_is_the_one_vllm_makes_of_it(body: dict[str, Any]) -> None:
    chat = anthropic_chat(body)
    assert chat is not None
    served = chat_body(body)
    assert list(chat[0]) == served["messages"]
    assert (list(chat[1]) if chat[1] is not None else None) == served.get("tools")


def test_tool_results_go_in_front_of_their_turn_and_calls_carry_their_input_as_json() -> None:
    chat = anthropic_chat({"system": "s", "messages": AGENT, "tools": TOOLS})
    assert chat is not None
    messages, tools = chat
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user", "assistant",
                                             "tool"]
    assert messages[2]["tool_calls"][0]["function"] == {"name": "ledger", "arguments": '{"day": "today"}'}
    assert messages[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "the brig"}
    assert messages[4] == {"role": "user", "content": "and tomorrow?"}
    # blocks as a tool's output: Python's str() of them, as vLLM's model renders its content
    assert messages[6]["content"] == "[{'type': 'text', 'text': 'high at 6', 'cache_control': None}]"
    assert tools is not None
    # "type" added last where missing, as vLLM's validator adds it
    assert tools[0]["function"]["parameters"] == {"properties": {}, "type": "object"}


@pytest.mark.parametrize("turn", [
    {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}]},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}]},
    {"role": "assistant", "content": [{"type": "tool_use", "name": "ledger"}]},  # no id: named by the clock
    {"role": "system", "content": "x"},
])
def test_what_is_not_followed_exactly_is_left_to_the_approximate_index(turn: dict[str, Any]) -> None:
    assert anthropic_chat({"messages": [{"role": "user", "content": "hi"}, turn]}) is None


def test_a_messages_request_is_hashed_system_tools_then_turns_each_turn_extending_the_last() -> None:
    assert api_kind("/v1/messages") is ApiKind.MESSAGES
    assert api_kind("/v1/messages/count_tokens") is ApiKind.OTHER
    first = {"model": "m", "max_tokens": 8, "system": "you keep the books", "tools": TOOLS,
             "messages": AGENT[:1]}
    later = {**first, "messages": AGENT}
    a = parse_request_body(ApiKind.MESSAGES, json.dumps(first).encode())
    b = parse_request_body(ApiKind.MESSAGES, json.dumps(later).encode())
    assert a.prompt.startswith("you keep the books\n")
    assert "ledger" in a.prompt.split("\n")[1]
    assert b.prompt.startswith(a.prompt)
    assert a.max_tokens == 8


def test_the_pickers_own_errors_on_the_messages_api_are_in_anthropics_shape() -> None:
    pool = make_pool(served_models=frozenset({"m"}), undeclared=False)
    unknown = b'{"model": "other", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}'
    for body, status, kind in ((b'{"model": "m", "max_tokens": 8}', 400, "invalid_request_error"),
                               (unknown, 404, "not_found_error")):
        out = feed(make_machine(pool), [request_headers("/v1/messages"), request_body(body, eos=True)])
        reply = out[0].immediate_response
        assert reply.status.code == status
        document = json.loads(reply.body)
        assert document["type"] == "error"
        assert document["error"]["type"] == kind
        assert document["error"]["message"]
    out = feed(make_machine(pool), [request_headers("/v1/chat/completions"), request_body(b"{}", eos=True)])
    assert "code" in json.loads(out[0].immediate_response.body)["error"]  # OpenAI's shape elsewhere


@pytest.mark.parametrize(("path", "body", "said"), [
    ("/v1/messages", {"model": "m", "max_tokens": 8, "system": 5, "messages": [{"role": "user"}]},
     "'system' must be a string or a list of text blocks"),
    ("/v1/responses", {"model": "m", "input": 5}, "'input' must be a string or a list of input items"),
    ("/v1/responses", {"model": "m"}, "'input' must be a string or a list of input items"),
])
def test_a_misshapen_field_is_named_in_the_400(path: str, body: dict[str, Any], said: str) -> None:
    api = api_kind(path)
    with pytest.raises(BadRequestError) as refused:
        parse_request_body(api, json.dumps(body).encode())
    assert str(refused.value) == said


@pytest.mark.parametrize(("tools", "options"), [(None, None), ([], {"tools": []}),
                                                (TOOLS[:1], {"tools": [{"type": "function", "function": {
                                                    "name": "ledger", "description": "the harbour's ledger",
                                                    "parameters": {"properties": {}, "type": "object"}}}]})])
def test_a_messages_requests_tools_reach_the_template_as_vllm_hands_them(
    tools: list[dict[str, Any]] | None, options: dict[str, Any] | None
) -> None:
    pool = make_pool()
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    if tools is not None:
        body["tools"] = tools
    raw = json.dumps(body).encode()
    feed(make_machine(pool), [request_headers("/v1/messages"), request_body(raw, eos=True)])
    request = pool.scheduler.seen[0][0]
    assert (dict(request.prompt_options) if request.prompt_options is not None else None) == options
    assert request.messages == ({"role": "user", "content": "x"},)
