"""kvgate checks its own keys against the engines' reports, end to end (issue 37):
``kvgate up -f DIR --sim 2`` through real Envoy, the pool publishing KV events with the simulated
model's tokenizer (``kvgate.io/tokenizer``, which the replicas tokenize with too). With the profile
naming another tokenizer (a word-level one made here: an operator's wrong path), no block kvgate
keys is one the engines report; after the served requests' checks the pool's keys are not trusted
(``/debug/pools``, the metric, a warning) and requests are still served. With the right one they
stay trusted."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from kvgate.policies.profile import read_profile_document
from tests.e2e.test_up_engine_prefix import MODEL_DIR
from tests.e2e.test_up_kv_events import POOL, endpoints
from tests.e2e.test_up_routing import gateway_yaml, wait_ready

pytestmark = pytest.mark.e2e
WORDS = ["harbour", "ledger", "ship", "cargo", "north", "river", "grain", "anchor", "crew", "tide"]


def profile_with_tokenizer(tmp_path: Path) -> Path:
    """The default profile, its ``engine-prefix-matches`` given a tokenizer that is not the model's."""
    wrong = Tokenizer(WordLevel({w: i for i, w in enumerate(["[UNK]", *WORDS])}, unk_token="[UNK]"))
    wrong.pre_tokenizer = WhitespaceSplit()
    wrong.save(str(tmp_path / "tokenizer.json"))
    document = dict(read_profile_document("default"))
    named = {"tokenizer": str(tmp_path / "tokenizer.json")}
    document["plugins"] = [
        {**plugin, "parameters": {**(plugin.get("parameters") or {}), **named}}
        if plugin["type"] == "engine-prefix-matches" else plugin for plugin in document["plugins"]]
    path = tmp_path / "wrong-tokenizer.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


async def complete(http: aiohttp.ClientSession, url: str, prompt: str) -> None:
    body = {"model": EXAMPLE_MODEL, "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{url}/v1/completions", data=json.dumps(body),
                         headers={"content-type": "application/json"}) as response:
        assert response.status == 200, await response.text()


async def pool_keys(http: aiohttp.ClientSession, up: KvgateUp) -> dict[str, Any] | None:
    async with http.get(f"{up.admin_url}/debug/pools") as response:
        pools = (await response.json())["pools"]
    keys: dict[str, Any] | None = pools[0].get("kv_event_keys")
    return keys


@pytest.mark.parametrize("tokenizer", ["the model's", "another"])
async def test_keys_no_engine_holds_are_noticed_and_said(
    tmp_path: Path, http: aiohttp.ClientSession, tokenizer: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    annotations = f'"kvgate.io/tokenizer": "{MODEL_DIR}"'
    if tokenizer == "another":
        annotations += f', "kvgate.io/profile": "{profile_with_tokenizer(tmp_path)}"'
    pool = POOL.format(events=free_port()).replace('{"kvgate.io/kv-events-port"',
                                                   f'{{{annotations}, "kvgate.io/kv-events-port"')
    (config / "pool.yaml").write_text(pool)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.61", sim_time_scale=0.01))
    rng = random.Random(4)
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        addresses = sorted(await endpoints(http, up))
        for address in addresses:  # each publisher's first batch: both followed in step
            await complete(http, f"http://{address}", f"warm up {address} " * 30)
        for _ in range(100):
            seen = await endpoints(http, up)
            if all(seen[a]["kv_events"]["in_step"] for a in addresses):
                break
            await asyncio.sleep(0.05)
        with caplog.at_level(logging.WARNING):
            for i in range(40):  # distinct prompts of ~100 tokens, through the gateway
                await complete(http, up.url, f"request {i} " + " ".join(rng.choices(WORDS, k=90)))
            await asyncio.sleep(1.5)  # their checks are due
            await complete(http, up.url, "one more " * 40)  # a pick polls them
            keys = await pool_keys(http, up)
            async with http.get(f"{up.admin_url}/metrics") as response:
                page = await response.text()
    finally:
        await up.stop()
    assert keys is not None
    assert keys["held"] + keys["missing"] >= 32, keys
    warned = [r for r in caplog.records if "tokenizer or chat template" in r.getMessage()]
    if tokenizer == "another":
        assert keys["trusted"] is False, keys
        assert keys["held"] == 0, keys
        assert 'kvgate_kv_events_keys_trusted{pool="default/pool"} 0.0' in page
        assert warned
    else:
        assert keys["trusted"] is True, keys
        assert keys["missing"] <= 2, keys
        assert 'kvgate_kv_events_keys_trusted{pool="default/pool"} 1.0' in page
        assert not warned
