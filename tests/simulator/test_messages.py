"""``POST /v1/messages`` (Anthropic's Messages API): served as the chat vLLM makes of it, answered in
Anthropic's shape (a whole message, or its stream of events), errors included."""

from __future__ import annotations

import json

import aiohttp

from tests.simulator.conftest import MODEL, FleetFactory

SYSTEM = "You answer questions about the simulator. " * 30


async def test_a_message_has_the_prompt_of_its_chat(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    chat = {"model": MODEL, "max_tokens": 3,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Why?"}]}
    async with http.post(url + "/v1/chat/completions", json=chat) as reply:
        answer = await reply.json()
    body = {"model": MODEL, "max_tokens": 3, "system": [{"type": "text", "text": SYSTEM}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Why?"}]}]}
    async with http.post(url + "/v1/messages", json=body) as reply:
        assert reply.status == 200
        message = await reply.json()
    assert message["type"] == "message"
    assert message["role"] == "assistant"
    assert message["stop_reason"] == "max_tokens"
    assert message["content"] == [{"type": "text", "text": answer["choices"][0]["message"]["content"]}]
    assert message["usage"] == {"input_tokens": answer["usage"]["prompt_tokens"], "output_tokens": 3}


async def test_a_streamed_message_is_anthropics_events(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    body = {"model": MODEL, "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(fleet.urls[0] + "/v1/messages", json=body) as reply:
        text = await reply.text()
    events = [block for block in text.split("\n\n") if block]
    assert events[-1] == "data: [DONE]"  # vLLM's, after message_stop
    parsed = [(e.split("\n")[0].removeprefix("event: "), json.loads(e.split("\n")[1].removeprefix("data: ")))
              for e in events[:-1]]
    kinds = [kind for kind, _ in parsed]
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * 5,
                     "content_block_stop", "message_delta", "message_stop"]
    assert all(kind == data["type"] for kind, data in parsed)
    start, delta = parsed[0][1], parsed[-2][1]
    assert start["message"]["usage"]["input_tokens"] == delta["usage"]["input_tokens"] > 0
    assert delta["usage"]["output_tokens"] == 5
    assert delta["delta"] == {"stop_reason": "max_tokens"}


async def test_errors_are_in_anthropics_shape_with_vllms_types(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0] + "/v1/messages"
    turn = [{"role": "user", "content": "x"}]
    refused = [({"model": MODEL, "messages": turn}, 400, "BadRequestError"),  # no max_tokens
               ({"model": MODEL, "max_tokens": 2, "messages": []}, 400, "BadRequestError"),
               ({"model": "nope", "max_tokens": 2, "messages": turn}, 404, "NotFoundError")]
    for body, status, kind in refused:
        async with http.post(url, json=body) as reply:
            assert reply.status == status
            error = await reply.json()
        assert error["type"] == "error"
        assert error["error"]["type"] == kind
        assert error["error"]["message"]


async def test_count_tokens_is_the_prompt_a_message_would_have(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    body = {"model": MODEL, "system": SYSTEM, "messages": [{"role": "user", "content": "Why?"}],
            "tools": [{"name": "ledger", "input_schema": {"properties": {}}}]}
    async with http.post(url + "/v1/messages/count_tokens", json=body) as reply:
        assert reply.status == 200
        counted = await reply.json()
    async with http.post(url + "/v1/messages", json={**body, "max_tokens": 2}) as reply:
        served = await reply.json()
    assert counted == {"input_tokens": served["usage"]["input_tokens"]}
    async with http.post(url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": []}) as reply:
        assert reply.status == 400
        assert (await reply.json())["type"] == "error"


async def test_fields_are_read_as_vllms_pydantic_models_read_them(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    # lax mode: "true" is a stream and "4" four tokens to vLLM; what it cannot read is its 400
    fleet = await make_fleet()
    url = fleet.urls[0]
    chat = {"model": MODEL, "max_completion_tokens": "4", "stream": "true",
            "stream_options": {"include_usage": 1}, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(url + "/v1/chat/completions", json=chat) as reply:
        assert reply.status == 200
        assert reply.content_type == "text/event-stream"
        chunks = [json.loads(line[6:]) for line in (await reply.text()).splitlines()
                  if line.startswith("data: {")]
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    message = {"model": MODEL, "max_tokens": "4", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(url + "/v1/messages", json=message) as reply:
        assert reply.status == 200
        assert (await reply.json())["usage"]["output_tokens"] == 4
    for body, param in (({**chat, "stream": "maybe"}, "stream"),
                        ({**chat, "max_completion_tokens": "four"}, "max_completion_tokens")):
        async with http.post(url + "/v1/chat/completions", json=body) as reply:
            assert reply.status == 400
            assert (await reply.json())["error"]["param"] == param
