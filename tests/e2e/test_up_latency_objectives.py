"""Requests' own latency objectives (llm-d's ``x-slo-ttft-ms`` / ``x-slo-tpot-ms``) through ``kvgate
up --sim 2`` (real Envoy, the one-pass data path that skips the responses nothing reads): each one
stated is counted met or missed on the picker's ``kvgate_request_slo_total``."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from tests.e2e.test_up_prefix_checks import counter
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e


async def send(http: aiohttp.ClientSession, up: KvgateUp, headers: dict[str, str], *,
               stream: bool = False) -> None:
    body = {"model": EXAMPLE_MODEL, "prompt": "Say hello", "max_tokens": 8, "stream": stream}
    async with http.post(f"{up.url}/v1/completions", data=json.dumps(body),
                         headers={"content-type": "application/json", **headers}) as response:
        assert response.status == 200, await response.text()
        text = await response.text()
    if stream:
        assert text.rstrip().endswith("data: [DONE]")


async def test_objectives_are_counted_met_or_missed(http: aiohttp.ClientSession) -> None:
    up = KvgateUp(UpOptions(port=free_port(), admin_port=0, sim=2, sim_hosts_from="127.0.9.41",
                            sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["default"])
        await send(http, up, {"x-slo-ttft-ms": "60000"})  # met
        await send(http, up, {"x-slo-ttft-ms": "0.001"})  # missed: no reply comes in a microsecond
        await send(http, up, {"x-slo-tpot-ms": "60000", "x-slo-ttft-ms": "soon"}, stream=True)  # tpot met
        await send(http, up, {"x-slo-tpot-ms": "0.001"}, stream=True)  # tpot missed
        await send(http, up, {})  # no objective: not counted
        await send(http, up, {}, stream=True)
        page = ""
        for _ in range(50):  # metrics are counted after the reply
            async with http.get(f"{up.admin_url}/metrics") as response:
                page = await response.text()
            if counter(page, "kvgate_request_slo_total") >= 4:
                break
            await asyncio.sleep(0.05)
    finally:
        await up.stop()
    assert counter(page, "kvgate_request_slo_total", objective="ttft", outcome="met") == 1
    assert counter(page, "kvgate_request_slo_total", objective="ttft", outcome="missed") == 1
    assert counter(page, "kvgate_request_slo_total", objective="tpot", outcome="met") == 1
    assert counter(page, "kvgate_request_slo_total", objective="tpot", outcome="missed") == 1
    assert counter(page, "kvgate_request_slo_total") == 4
