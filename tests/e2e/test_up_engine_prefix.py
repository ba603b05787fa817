"""Routing on the engines' own reports, end to end (issue 37): ``kvgate up -f DIR --sim 2`` where
the pool publishes KV events and names its model's tokenizer (``kvgate.io/tokenizer``: the
simulated model's directory, its chat template too), with the default profile. A document or a
conversation cached on one replica behind kvgate's back (requests sent to it directly: another
router's traffic) is unknown to kvgate's own approximate index, but the replica's events report it:
the requests for that document, and the conversation's next turns, go there."""

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
from tests.e2e.test_up_kv_events import POOL, endpoints
from tests.e2e.test_up_routing import gateway_yaml, wait_ready

pytestmark = pytest.mark.e2e
MODEL_DIR = Path(__file__).resolve().parents[2] / "simulator" / "data"  # tokenizer.json, chat template


async def complete(http: aiohttp.ClientSession, url: str, prompt: str) -> None:
    body = {"model": EXAMPLE_MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{url}/v1/completions", data=json.dumps(body),
                         headers={"content-type": "application/json"}) as response:
        assert response.status == 200, await response.text()


async def chat(http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> str:
    body = {"model": EXAMPLE_MODEL, "messages": messages, "max_tokens": 8}
    async with http.post(f"{url}/v1/chat/completions", data=json.dumps(body),
                         headers={"content-type": "application/json"}) as response:
        assert response.status == 200, await response.text()
        reply: str = (await response.json())["choices"][0]["message"]["content"]
    return reply


async def received(http: aiohttp.ClientSession, address: str) -> int:
    async with http.get(f"http://{address}/sim/stats") as response:
        stats: dict[str, Any] = await response.json()
    return int(stats["requests_received"])


async def settled_blocks(http: aiohttp.ClientSession, up: KvgateUp, address: str, before: int) -> None:
    """Until the picker's count of ``address``'s blocks has grown past ``before`` and held still for
    a few polls: a loaded machine's publisher may split one request's blocks over several batches
    (once in a clean-clone CI run the requests were routed while half of them had come)."""
    last, still = before, 0
    for _ in range(200):
        blocks = (await endpoints(http, up))[address]["kv_events"]["blocks"]
        still = still + 1 if blocks == last and blocks > before else 0
        if still >= 4:
            return
        last = blocks
        await asyncio.sleep(0.05)


async def test_a_document_cached_behind_kvgates_back_is_found_through_the_engines_events(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    pool = POOL.format(events=free_port()).replace(
        '{"kvgate.io/kv-events-port"', f'{{"kvgate.io/tokenizer": "{MODEL_DIR}", "kvgate.io/kv-events-port"')
    (config / "pool.yaml").write_text(pool)
    # the default profile; the simulated replicas take the pool's tokenizer too
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.41", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        first, second = sorted(await endpoints(http, up))
        for address in (first, second):  # each publisher's first batch: both followed in step
            await complete(http, f"http://{address}", f"warm up {address} " * 30)
        for _ in range(100):
            seen = await endpoints(http, up)
            if all(seen[a]["kv_events"]["in_step"] for a in (first, second)):
                break
            await asyncio.sleep(0.05)
        before = (await endpoints(http, up))[second]["kv_events"]["blocks"]
        document = "the ledger of the northern harbour records every ship and its cargo " * 30
        await complete(http, f"http://{second}", document)  # behind kvgate's back
        await settled_blocks(http, up, second, before)
        counts = [await received(http, a) for a in (first, second)]
        for i in range(4):
            await complete(http, up.url, document + f" question {i}")
        after = [await received(http, a) for a in (first, second)]
        # a conversation held by the first replica (behind kvgate's back): its next turns, rendered
        # through the model's chat template as the replica renders them, go there
        histories = {}
        for address in (first, second):  # a conversation on each (luck alone: 1 in 4 both right)
            history = [{"role": "system", "content": f"you are the harbour master of {address} " * 20},
                       {"role": "user", "content": "which ships came in today"}]
            before = (await endpoints(http, up))[address]["kv_events"]["blocks"]
            history.append({"role": "assistant", "content": await chat(http, f"http://{address}", history)})
            await settled_blocks(http, up, address, before)
            histories[address] = history
        chats = [await received(http, a) for a in (first, second)]
        for i in range(2):
            await chat(http, up.url, [*histories[first], {"role": "user", "content": f"and their cargo {i}"}])
        chats_after = [await received(http, a) for a in (first, second)]
        for i in range(2):
            await chat(http, up.url, [*histories[second], {"role": "user", "content": f"and the crews {i}"}])
        chats_last = [await received(http, a) for a in (first, second)]
    finally:
        await up.stop()
    assert after[1] - counts[1] == 4, (counts, after)  # every one to the replica that holds it
    assert after[0] == counts[0]
    assert chats_after[0] - chats[0] == 2, (chats, chats_after)
    assert chats_last[1] - chats_after[1] == 2, (chats_after, chats_last)
