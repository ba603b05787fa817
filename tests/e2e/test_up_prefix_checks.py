"""The prefix index's predictions checked against the replicas' reports, through ``kvgate up --sim 2
--read-usage-every 1`` (real Envoy, the simulator reporting ``cached_tokens`` as vLLM does)."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e


def counter(page: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_repeated_prompts_are_checked_and_hit_as_predicted(http: aiohttp.ClientSession) -> None:
    up = KvgateUp(UpOptions(port=free_port(), admin_port=0, sim=2, sim_hosts_from="127.0.9.31",
                            sim_time_scale=0.01, read_usage_every=1))
    try:
        await up.start()
        await wait_ready(http, up, ["default"])
        document = "a shared system prompt about the weather " * 40
        for i in range(4):
            body = {"model": EXAMPLE_MODEL, "prompt": document + f" question {i}", "max_tokens": 2}
            async with http.post(f"{up.url}/v1/completions", data=json.dumps(body),
                                 headers={"content-type": "application/json"}) as response:
                assert response.status == 200
                usage = (await response.json())["usage"]
                assert "prompt_tokens_details" in usage
        page = ""
        for _ in range(50):  # metrics are counted after the reply
            async with http.get(f"{up.admin_url}/metrics") as response:
                page = await response.text()
            if counter(page, "kvgate_prefix_checks_total") >= 4:
                break
            await asyncio.sleep(0.05)
    finally:
        await up.stop()
    assert counter(page, "kvgate_prefix_checks_total") == 4
    assert counter(page, "kvgate_prefix_checks_total", outcome="as_predicted") >= 3  # the 2nd on: cached
    assert counter(page, "kvgate_prefix_tokens_total", kind="cached") > 0
    assert counter(page, "kvgate_prefix_tokens_total", kind="predicted") > 0
    assert re.search(r'kvgate_prefix_tokens_total\{kind="best",pool="[^"]+"\} \d', page)
