"""Anthropic's Messages API, end to end: ``kvgate up -f DIR --sim 2`` through real Envoy, the pool
publishing KV events and naming the simulated model's directory as its tokenizer. Each replica
holds, behind kvgate's back, an agent's conversation in Anthropic's shape (a system prompt and
tools, a tool call and its result), told apart only by the result. The next turns, sent through
the gateway, go to the replica that holds their conversation: kvgate must build the chat vLLM
makes of a Messages request, tools and tool calls included, token for token. The picker's own
errors are in Anthropic's shape, and a stream arrives whole."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from tests.e2e.test_up_engine_prefix import MODEL_DIR, received
from tests.e2e.test_up_kv_events import POOL, endpoints
from tests.e2e.test_up_routing import gateway_yaml, wait_ready

pytestmark = pytest.mark.e2e
TOOLS = [{"name": "ledger", "description": "the harbour's ledger " * 20,
          "input_schema": {"type": "object", "properties": {"day": {"type": "string"}}}}]


def agent(result: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "which ships came in today?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ledger",
                                               "input": {"day": "today"}}]},
            {"role": "user", "content": [{"type": "tool_result", "id": "toolu_1", "content": result}]}]


async def message(http: aiohttp.ClientSession, url: str, turns: list[dict[str, Any]],
                  stream: bool = False) -> tuple[int, str]:
    body = {"model": EXAMPLE_MODEL, "max_tokens": 6, "system": "you keep the harbour's books",
            "tools": TOOLS, "messages": turns, "stream": stream}
    async with http.post(f"{url}/v1/messages", data=json.dumps(body),
                         headers={"content-type": "application/json"}) as response:
        return response.status, await response.text()


async def test_an_anthropic_agents_next_turns_go_where_its_conversation_is_held(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    pool = POOL.format(events=free_port()).replace(
        '{"kvgate.io/kv-events-port"', f'{{"kvgate.io/tokenizer": "{MODEL_DIR}", "kvgate.io/kv-events-port"')
    (config / "pool.yaml").write_text(pool)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.81", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        first, second = sorted(await endpoints(http, up))
        histories: dict[str, list[dict[str, Any]]] = {}
        for address, result in ((first, "the ketch and the brig, from the north " * 20),
                                (second, "a schooner with salt and two with grain " * 20)):
            history = agent(result)
            status, text = await message(http, f"http://{address}", history)  # behind kvgate's back
            assert status == 200, text
            history.append({"role": "assistant", "content": json.loads(text)["content"]})
            histories[address] = history
        for _ in range(100):  # both followed in step, each holding its conversation
            seen = await endpoints(http, up)
            if all(seen[a]["kv_events"]["in_step"] and seen[a]["kv_events"]["blocks"] >= 30
                   for a in (first, second)):
                break
            await asyncio.sleep(0.05)
        went: dict[str, list[int]] = {}
        streamed = ""
        for address in (second, first):
            before = [await received(http, a) for a in (first, second)]
            turn = [*histories[address], {"role": "user", "content": "and tomorrow?"}]
            status, text = await message(http, up.url, turn)
            assert status == 200, text
            assert json.loads(text)["usage"]["input_tokens"] > 0
            status, streamed = await message(http, up.url, turn, stream=True)
            assert status == 200, streamed
            now = [await received(http, a) for a in (first, second)]
            went[address] = [now[0] - before[0], now[1] - before[1]]
        status, refused = await message(http, up.url, [])
    finally:
        await up.stop()
    assert went == {first: [2, 0], second: [0, 2]}, went
    assert streamed.count("event: content_block_delta") == 6
    assert streamed.rstrip().endswith("data: [DONE]")
    assert status == 400, refused  # (the picker's own: a Messages request needs messages)
    assert json.loads(refused)["error"]["type"] == "invalid_request_error"
