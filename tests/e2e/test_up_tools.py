"""An agent's conversations, end to end (issue 37): ``kvgate up -f DIR --sim 2`` through real Envoy,
the pool publishing KV events and naming the simulated model's directory as its tokenizer (its
template puts the tools in front and tool calls after ``<|python_tag|>``, as Llama 3.1's does). Each
replica holds, behind kvgate's back, a conversation with the same tools, question and tool call
(arguments sent as a JSON string, as OpenAI clients send them), told apart only by the tool's
result after the call. Each conversation's next turns go to the replica that holds it, which needs
the tools rendered in front and the call's arguments parsed as vLLM parses them."""

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
PARAMETERS = {"type": "object", "properties": {"day": {"type": "string"}}}
LEDGER = {"name": "ledger", "description": "the harbour's ledger " * 20, "parameters": PARAMETERS}
TOOLS = [{"type": "function", "function": LEDGER}]


def agent(result: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "ledger", "arguments": '{"day": "today"}'}}
    return [{"role": "system", "content": "you keep the harbour's books"},
            {"role": "user", "content": "which ships came in today?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": result}]


async def chat(http: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": EXAMPLE_MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 8}
    async with http.post(f"{url}/v1/chat/completions", data=json.dumps(body),
                         headers={"content-type": "application/json"}) as response:
        assert response.status == 200, await response.text()
        reply: str = (await response.json())["choices"][0]["message"]["content"]
    return reply


async def test_an_agents_next_turns_go_where_its_conversation_is_held(tmp_path: Path,
                                                                       http: aiohttp.ClientSession) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    pool = POOL.format(events=free_port()).replace(
        '{"kvgate.io/kv-events-port"', f'{{"kvgate.io/tokenizer": "{MODEL_DIR}", "kvgate.io/kv-events-port"')
    (config / "pool.yaml").write_text(pool)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.61", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        first, second = sorted(await endpoints(http, up))
        histories: dict[str, list[dict[str, Any]]] = {}
        for address, result in ((first, "the ketch and the brig, from the north " * 20),
                                (second, "a schooner with salt and two with grain " * 20)):
            history = agent(result)  # behind kvgate's back
            history.append({"role": "assistant", "content": await chat(http, f"http://{address}", history)})
            histories[address] = history
        for _ in range(100):  # both followed in step, each holding its conversation
            seen = await endpoints(http, up)
            if all(seen[a]["kv_events"]["in_step"] and seen[a]["kv_events"]["blocks"] >= 60
                   for a in (first, second)):
                break
            await asyncio.sleep(0.05)
        went: dict[str, list[int]] = {}
        for address in (second, first):
            before = [await received(http, a) for a in (first, second)]
            for i in range(2):
                turn = {"role": "user", "content": f"and tomorrow {i}?"}
                await chat(http, up.url, [*histories[address], turn])
            now = [await received(http, a) for a in (first, second)]
            went[address] = [now[0] - before[0], now[1] - before[1]]
    finally:
        await up.stop()
    assert went == {first: [2, 0], second: [0, 2]}, went
