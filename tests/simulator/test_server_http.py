"""vLLM's HTTP surface over raw HTTP: errors, SSE framing, models, LoRA, tokenizer, render, peek."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from kvgate.simulator.tokenizer import render_chat
from tests.simulator.conftest import MODEL, FleetFactory


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as response:
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


async def test_malformed_json_is_400_openai_error(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    status, body = await post(http, fleet.urls[0] + "/v1/completions", b"{not json")
    assert status == 400
    assert body["error"]["code"] == 400
    assert body["error"]["type"] == "BadRequestError"
    assert isinstance(body["error"]["message"], str)


async def test_unknown_model_is_404(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    status, body = await post(
        http,
        fleet.urls[0] + "/v1/chat/completions",
        {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 404
    assert body["error"]["type"] == "NotFoundError"


async def test_bad_fields_are_400(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    assert (await post(http, url + "/v1/completions", {"model": MODEL}))[0] == 400
    assert (await post(http, url + "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}))[
        0
    ] == 400
    assert (await post(http, url + "/v1/chat/completions", {"model": MODEL, "messages": []}))[0] == 400
    assert (await post(http, url + "/v1/completions", [1, 2]))[0] == 400


async def test_sse_framing_usage_chunk_and_done(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    body = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(fleet.urls[0] + "/v1/completions", json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = (await response.read()).decode()
    events = raw.split("\n\n")
    assert events[-1] == ""
    lines = events[:-1]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["the ", "and ", "for "]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:3]] == [None, None, "length"]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("cmpl-")
    usage_chunk = chunks[3]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": 2,
        "total_tokens": 5,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_models_lists_adapters_with_parent(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(served_loras=("a",))
    async with http.get(fleet.urls[0] + "/v1/models") as response:
        body = await response.json()
    assert body["object"] == "list"
    cards = {card["id"]: card for card in body["data"]}
    assert cards[MODEL]["parent"] is None
    assert cards[MODEL]["root"] == MODEL
    assert cards["a"]["parent"] == MODEL
    assert cards["a"]["object"] == "model"


async def test_load_and_unload_lora(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    status, _ = await post(http, url + "/v1/completions", {"model": "new", "prompt": "x"})
    assert status == 404
    status, text = await post(
        http, url + "/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "/p/new"}
    )
    assert status == 200
    assert "Success" in text
    status, _ = await post(http, url + "/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "/p/new"})
    assert status == 400
    status, body = await post(http, url + "/v1/completions", {"model": "new", "prompt": "x", "max_tokens": 2})
    assert status == 200
    assert body["model"] == "new"
    async with http.get(url + "/v1/models") as response:
        cards = (await response.json())["data"]
    assert [c["id"] for c in cards] == [MODEL, "new"]
    assert cards[1]["root"] == "/p/new"
    status, _ = await post(http, url + "/v1/unload_lora_adapter", {"lora_name": "new"})
    assert status == 200
    assert (await post(http, url + "/v1/unload_lora_adapter", {"lora_name": "new"}))[0] == 404
    assert (await post(http, url + "/v1/completions", {"model": "new", "prompt": "x"}))[0] == 404
    assert (await post(http, url + "/v1/load_lora_adapter", {"lora_name": "x"}))[0] == 400  # no path


async def test_tokenize_detokenize(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    status, body = await post(http, url + "/tokenize", {"model": MODEL, "prompt": "abcdefghi"})
    assert status == 200
    assert body["count"] == 3
    assert len(body["tokens"]) == 3
    status, chat = await post(
        http, url + "/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 200
    assert chat["count"] > 3
    status, text = await post(http, url + "/detokenize", {"model": MODEL, "tokens": body["tokens"]})
    assert status == 200
    assert len(text["prompt"]) == 12


async def test_render_shapes_match_vllm(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    status, rendered = await post(
        http, url + "/v1/completions/render", {"model": MODEL, "prompt": "abcdefgh"}
    )
    assert status == 200
    assert isinstance(rendered, list)
    assert len(rendered) == 1
    _, tokens = await post(http, url + "/tokenize", {"model": MODEL, "prompt": "abcdefgh"})
    assert rendered[0]["token_ids"] == tokens["tokens"]
    assert rendered[0]["request_id"].startswith("cmpl-")
    assert rendered[0]["model"] == MODEL
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    status, chat = await post(
        http, url + "/v1/chat/completions/render", {"model": MODEL, "messages": messages}
    )
    assert status == 200
    assert isinstance(chat, dict)
    assert chat["request_id"].startswith("chatcmpl-")
    assert len(chat["token_ids"]) > 5
    _, chat_tokens = await post(http, url + "/tokenize", {"model": MODEL, "messages": messages})
    assert chat["token_ids"] == chat_tokens["tokens"]
    assert (await post(http, url + "/v1/completions/render", {"model": "zzz", "prompt": "a"}))[0] == 404


async def test_peek_changes_nothing(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    prompt = "shared prefix " * 200
    await post(http, url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    async with http.get(url + "/metrics") as response:
        metrics_before = await response.text()
    async with http.get(url + "/sim/stats") as response:
        stats_before = await response.json()
    status, peek = await post(http, url + "/sim/peek", {"model": MODEL, "prompt": prompt + "tail"})
    assert status == 200
    assert peek["prompt_tokens"] == 701
    assert peek["cached_tokens"] >= 688
    assert peek["waiting"] == 0
    assert peek["running"] == 0
    assert peek["estimated_wait_s"] >= 0
    status, chat_peek = await post(
        http, url + "/sim/peek", {"model": MODEL, "messages": [{"role": "user", "content": "new"}]}
    )
    assert status == 200
    assert chat_peek["cached_tokens"] == 0
    async with http.get(url + "/metrics") as response:
        metrics_after = await response.text()
    async with http.get(url + "/sim/stats") as response:
        stats_after = await response.json()
    strip = ("sim_time_s", "loop_lag")
    assert {k: v for k, v in stats_before.items() if k not in strip} == {
        k: v for k, v in stats_after.items() if k not in strip
    }
    counters = [line for line in metrics_before.splitlines() if "prefix_cache" in line]
    assert counters
    assert all(line in metrics_after.splitlines() for line in counters)


async def test_health_and_stats(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    async with http.get(url + "/health") as response:
        assert response.status == 200
    await post(http, url + "/v1/completions", {"model": MODEL, "prompt": "abcd", "max_tokens": 3})
    async with http.get(url + "/sim/stats") as response:
        stats = await response.json()
    assert stats["requests_served"] == 1
    assert stats["requests_received"] == 1
    assert stats["prompt_tokens"] == 1
    assert stats["generation_tokens"] == 3
    assert stats["loop_lag"]["samples"] >= 0


async def test_client_disconnect_aborts_the_request(make_fleet: FleetFactory) -> None:
    fleet = await make_fleet(time_scale=1.0)  # real time: 5,000 tokens would take ~30 s
    replica = fleet.replicas[0]
    body = {"model": MODEL, "prompt": "a", "max_tokens": 5000, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(fleet.urls[0] + "/v1/completions", json=body) as response,
    ):
        await response.content.readuntil(b"\n\n")
        assert replica.engine.metrics().running == 1
    for _ in range(200):  # the server notices the closed connection on its next write
        if replica.engine.metrics().running == 0:
            break
        await asyncio.sleep(0.02)
    assert replica.engine.metrics().running == 0
    assert replica.counters.requests_aborted == 1
    assert replica.driver.in_flight == 0


async def test_long_prompt_renders_alike_on_every_replica_through_the_shared_memo(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(replicas=2)
    prompt = "0123456789abcdef" * 2048  # 32 KB: long enough to be memoised
    answers = [await post(http, url + "/v1/completions/render", {"model": MODEL, "prompt": prompt})
               for url in fleet.urls]
    _, tokens = await post(http, fleet.urls[0] + "/tokenize", {"model": MODEL, "prompt": prompt})
    assert [status for status, _ in answers] == [200, 200]
    assert answers[0][1][0]["token_ids"] == answers[1][1][0]["token_ids"] == tokens["tokens"]
    assert answers[0][1][0]["request_id"] != answers[1][1][0]["request_id"]
    assert fleet.encode_memo.hits >= 2


async def test_a_chats_next_turn_hits_the_blocks_of_the_reply_it_resends(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    """vLLM caches the full blocks of generated tokens too: the next turn, which resends the reply,
    finds them (the simulator gives its output the ids the reply has in that next turn)."""
    fleet = await make_fleet(block_size=16)
    question = "tell me about the harbour and its ships "
    messages = [{"role": "user", "content": question}]
    while len(render_chat(messages)) % 4:  # the simulator's own tokenizer cuts the text every 4 chars
        messages[0]["content"] += "x"
    url = fleet.urls[0] + "/v1/chat/completions"
    status, first = await post(http, url, {"model": MODEL, "messages": messages, "max_tokens": 40})
    assert status == 200
    prompt = first["usage"]["prompt_tokens"]
    reply = first["choices"][0]["message"]["content"]
    turn2 = [*messages, {"role": "assistant", "content": reply},
             {"role": "user", "content": "and then? " * 8}]
    status, second = await post(http, url, {"model": MODEL, "messages": turn2, "max_tokens": 1})
    assert status == 200
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (prompt + 39) // 16 * 16  # every full block of prompt and computed output
    assert cached > prompt // 16 * 16  # more than the prompt's own blocks


async def test_cors_as_vllm_answers_it_by_default(
    make_fleet: FleetFactory, http: aiohttp.ClientSession,
) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type"}
    async with http.options(f"{url}/v1/completions", headers=preflight) as response:
        assert (response.status, await response.text()) == (200, "OK")
        assert response.headers["access-control-allow-origin"] == "*"
        methods = response.headers["access-control-allow-methods"]
        assert methods == "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
        assert response.headers["access-control-allow-headers"] == "content-type"
    async with http.get(f"{url}/v1/models", headers={"origin": "https://app.example"}) as response:
        assert response.status == 200
        assert response.headers["access-control-allow-origin"] == "*"
    async with http.get(f"{url}/v1/models") as response:  # no origin: no CORS headers
        assert "access-control-allow-origin" not in response.headers
