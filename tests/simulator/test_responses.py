"""``POST /v1/responses``: the request as the chat vLLM makes of it, and its replies as the OpenAI
SDK reads them (a whole response, and a stream of events)."""

from __future__ import annotations

import json
import time

import aiohttp
import openai
import pytest

from kvgate.simulator.request_fields import ApiError
from kvgate.simulator.responses_api import chat_body
from tests.simulator.conftest import MODEL, FleetFactory


def test_instructions_and_a_string_input_are_a_system_and_a_user_message() -> None:
    chat = chat_body({"model": MODEL, "instructions": "Be brief", "input": "Hi", "max_output_tokens": 7,
                      "stream": True, "cache_salt": "s"})
    assert chat == {"messages": [{"role": "system", "content": "Be brief"},
                                 {"role": "user", "content": "Hi"}],
                    "stream": True, "model": MODEL, "cache_salt": "s", "max_completion_tokens": 7}


def test_input_items_become_chat_messages_as_vllm_builds_them() -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                     {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "first", "annotations": []},
                     {"type": "output_text", "text": "second", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
    ]
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    chat = chat_body({"input": items, "tools": tools})
    assert chat["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
        {"role": "assistant", "content": "first"},  # an output message: its first part's text
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "content": "2", "tool_call_id": "c1"},
    ]
    assert chat["tools"] == [{"type": "function", "function": tools[0]}]
    assert "tools" not in chat_body({"input": "x", "tools": tools, "tool_choice": "none"})


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": "x", "previous_response_id": "resp_1"}, 404, "previous_response_id"),  # nothing is stored
    ({"input": []}, 400, "input"),
    ({}, 400, "input"),
    ({"input": [{"type": "web_search_call"}]}, 400, "input"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "x", "instructions": 3}, 400, "instructions"),
])
def test_what_vllm_refuses_is_refused_with_its_status(
    body: dict[str, object], status: int, param: str
) -> None:
    with pytest.raises(ApiError) as refused:
        chat_body(body)
    assert refused.value.status == status
    assert refused.value.param == param


async def test_a_response_has_the_prompt_of_its_chat_and_reuses_its_cache(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    system = "You answer questions about the simulator. " * 40
    chat = {"model": MODEL, "max_tokens": 3,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Why?"}]}
    async with http.post(url + "/v1/chat/completions", json=chat) as reply:
        answer = await reply.json()
    prompt_tokens = answer["usage"]["prompt_tokens"]
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none")
    response = await client.responses.create(model=MODEL, instructions=system, input="Why?",
                                             max_output_tokens=3)
    assert response.status == "incomplete"  # it made max_output_tokens tokens
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.input_tokens == prompt_tokens
    assert response.usage.output_tokens == 3
    assert response.usage.input_tokens_details.cached_tokens >= prompt_tokens - 16  # the chat's blocks
    assert response.output_text == answer["choices"][0]["message"]["content"]
    await client.close()


async def test_a_streamed_response_opens_before_its_first_token_and_ends_with_the_whole_response(
    make_fleet: FleetFactory,
) -> None:
    fleet = await make_fleet(time_scale=1.0)  # real time: a long prompt's prefill takes ~0.3 s
    client = openai.AsyncOpenAI(base_url=fleet.urls[0] + "/v1", api_key="none")
    started = time.monotonic()
    stream = await client.responses.create(model=MODEL, input="word " * 16_000, stream=True)
    arrivals: list[tuple[str, float, int]] = []
    async for event in stream:
        arrivals.append((event.type, time.monotonic() - started, event.sequence_number))
    kinds = [kind for kind, _, _ in arrivals]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [n for _, _, n in arrivals] == list(range(len(arrivals)))
    deltas = kinds.count("response.output_text.delta")
    assert deltas == 128  # the simulator's default reply length
    # vLLM sends the first two as the request starts: well before the prefill of 16k tokens ends
    assert arrivals[2][1] - arrivals[1][1] > 0.1
    await client.close()


async def test_a_responses_request_the_simulator_cannot_serve_is_a_json_error(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    async with http.post(fleet.urls[0] + "/v1/responses", data=b"{not json",
                         headers={"Content-Type": "application/json"}) as reply:
        assert reply.status == 400
        assert json.loads(await reply.text())["error"]["code"] == 400
    async with http.post(fleet.urls[0] + "/v1/responses", json={"model": "other", "input": "x"}) as reply:
        assert reply.status == 404


async def test_a_stored_response_is_continued_where_it_is_stored_and_nowhere_else(
    make_fleet: FleetFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_RESPONSES_API_STORE", "1")  # vLLM's switch (off by default)
    fleet = await make_fleet(2)
    here, there = (openai.AsyncOpenAI(base_url=url + "/v1", api_key="none") for url in fleet.urls)
    first = await here.responses.create(model=MODEL, instructions="You keep the books. " * 20,
                                        input="Which ships?", max_output_tokens=4)
    second = await here.responses.create(model=MODEL, input="And tomorrow?", previous_response_id=first.id,
                                         max_output_tokens=4, extra_body={"request_id": "resp_mine"})
    assert second.id == "resp_mine"  # the client's request_id is the response's id, as in vLLM
    assert first.usage is not None
    assert second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + 4  # the stored conversation in front
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16
    with pytest.raises(openai.NotFoundError):
        await there.responses.create(model=MODEL, input="And tomorrow?", previous_response_id=first.id)
    retrieved = await here.responses.retrieve(second.id)
    assert retrieved.model_dump() == second.model_dump()
    with pytest.raises(openai.NotFoundError):
        await there.responses.retrieve(second.id)
    with pytest.raises(openai.BadRequestError):  # a finished response cannot be cancelled (vLLM's 400)
        await here.responses.cancel(second.id)
    unstored = await here.responses.create(model=MODEL, input="x", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        await here.responses.create(model=MODEL, input="y", previous_response_id=unstored.id)
    await here.close()
    await there.close()
