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
from tests.e2e.picker_harness import wait_until
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


async def test_a_sheddable_request_no_replica_can_serve_in_time_is_shed(http: aiohttp.ClientSession) -> None:
    """Both replicas busy with long streams: a ``batch`` request (priority -1) asking its first
    token within 1 ms is answered 429 at once (shed before any pick), with Retry-After; the same
    request asking a minute is served, and so is a ``chat`` one (priority 10) asking 1 ms."""
    up = KvgateUp(UpOptions(port=free_port(), admin_port=0, sim=2, sim_hosts_from="127.0.9.45",
                            sim_time_scale=1.0))
    try:
        await up.start()
        await wait_ready(http, up, ["default"])
        long = {"model": EXAMPLE_MODEL, "prompt": "tell a long story", "max_tokens": 400, "stream": True}

        async def occupy() -> None:
            async with http.post(f"{up.url}/v1/completions", data=json.dumps(long),
                                 headers={"content-type": "application/json"}) as response:
                await response.read()

        streams = [asyncio.create_task(occupy()) for _ in range(4)]

        async def busy() -> bool:
            async with http.get(f"{up.admin_url}/debug/pools") as response:
                pools = await response.json()
            return all(e["running"] > 0 for e in pools["pools"][0]["endpoints"])

        await wait_until(busy, "both replicas running the streams", timeout_s=10)
        body = {"model": EXAMPLE_MODEL, "prompt": "Say hello", "max_tokens": 2}

        async def ask(objective: str, ttft_ms: str) -> tuple[int, dict[str, str], str]:
            headers = {"content-type": "application/json", "x-gateway-inference-objective": objective,
                       "x-slo-ttft-ms": ttft_ms}
            url = f"{up.url}/v1/completions"
            async with http.post(url, data=json.dumps(body), headers=headers) as response:
                return response.status, dict(response.headers), await response.text()

        status, headers, text = await ask("batch", "1")
        assert status == 429, text
        assert json.loads(text)["error"]["code"] == "request_shed"
        assert "x-slo-ttft-ms" in json.loads(text)["error"]["message"]
        assert "retry-after" in {k.lower() for k in headers}
        assert (await ask("batch", "60000"))[0] == 200
        assert (await ask("chat", "1"))[0] == 200
        for stream in streams:
            stream.cancel()
    finally:
        await up.stop()
