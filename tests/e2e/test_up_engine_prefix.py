"""Routing on the engines' own reports, end to end (issue 37): ``kvgate up -f DIR --sim 2
--sim-tokenizer FILE`` where the pool publishes KV events and its profile has
``engine-prefix-matches`` with the same tokenizer file. A document cached on one replica behind
kvgate's back (a request sent to it directly: another router's traffic) is unknown to kvgate's own
approximate index, but the replica's events report it: the requests for that document go there."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import EXAMPLE_MODEL, KvgateUp, UpOptions
from kvgate.policies.profile import read_profile_document
from tests.e2e.test_up_kv_events import POOL, endpoints
from tests.e2e.test_up_routing import gateway_yaml, wait_ready

pytestmark = pytest.mark.e2e
TOKENIZER = Path(__file__).resolve().parents[2] / "simulator" / "data" / "tokenizer.json"


def profile_with_engine_prefix(directory: Path) -> Path:
    document = dict(read_profile_document("default"))
    document["name"] = "default-engine-prefix"
    document["plugins"] = [*document["plugins"],
                           {"type": "engine-prefix-matches", "parameters": {"tokenizer": str(TOKENIZER)}}]
    document["profile"] = {**document["profile"],
                           "feedback": ["engine-prefix-matches", *document["profile"]["feedback"]]}
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


async def complete(http: aiohttp.ClientSession, url: str, prompt: str) -> None:
    body = {"model": EXAMPLE_MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{url}/v1/completions", data=json.dumps(body),
                         headers={"content-type": "application/json"}) as response:
        assert response.status == 200, await response.text()


async def received(http: aiohttp.ClientSession, address: str) -> int:
    async with http.get(f"http://{address}/sim/stats") as response:
        stats: dict[str, Any] = await response.json()
    return int(stats["requests_received"])


async def test_a_document_cached_behind_kvgates_back_is_found_through_the_engines_events(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    profile = profile_with_engine_prefix(tmp_path)
    config = tmp_path / "config"  # manifests only (a profile there would be read as one)
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    pool = POOL.format(events=free_port()).replace(
        '{"kvgate.io/kv-events-port"', f'{{"kvgate.io/profile": "{profile}", "kvgate.io/kv-events-port"')
    (config / "pool.yaml").write_text(pool)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.41", sim_time_scale=0.01, sim_tokenizer=str(TOKENIZER)))
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
        for _ in range(100):
            if (await endpoints(http, up))[second]["kv_events"]["blocks"] > before:
                break
            await asyncio.sleep(0.05)
        counts = [await received(http, a) for a in (first, second)]
        for i in range(4):
            await complete(http, up.url, document + f" question {i}")
        after = [await received(http, a) for a in (first, second)]
    finally:
        await up.stop()
    assert after[1] - counts[1] == 4, (counts, after)  # every one to the replica that holds it
    assert after[0] == counts[0]
