"""Disaggregated prefill and decode over real HTTP, in vLLM's NixlConnector protocol: a prefill
replica answers with ``kv_transfer_params``, a decode replica given them reads the KV (freeing it on
the prefill side) and computes only the prompt's tail."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvgate.simulator.kv_transfer import KvTransferSettings
from tests.simulator.conftest import MODEL, FleetFactory
from tests.simulator.test_server_http import post

PROMPT = "".join(f"{i:08d}" for i in range(400))  # 3,200 characters: 800 tokens, 50 full blocks
ASK_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
               "remote_block_ids": None, "remote_host": None, "remote_port": None}


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/sim/stats") as response:
        data: dict[str, Any] = await response.json()
        return data


async def metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not on the page")


async def prefill(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    status, body = await post(http, url + "/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 1, "stream": False,
        "kv_transfer_params": ASK_PREFILL})
    assert status == 200, body
    params: dict[str, Any] = body["kv_transfer_params"]
    return params


async def test_prefill_answers_the_params_a_decode_needs_and_holds_its_blocks(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(2, roles=("prefill", "decode"))
    p_url, d_url = fleet.urls
    params = await prefill(http, p_url)
    assert params["do_remote_prefill"] is True
    assert params["do_remote_decode"] is False
    assert len(params["remote_block_ids"]) == 50
    assert params["remote_engine_id"] == (await stats(http, p_url))["engine_id"]
    assert f"http://{params['remote_host']}:{params['remote_port']}" == p_url
    assert params["remote_request_id"].startswith("cmpl-")
    assert (await stats(http, p_url))["kv_held"] == 1
    assert (await stats(http, p_url))["role"] == "prefill"

    status, body = await post(http, d_url + "/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 8, "kv_transfer_params": params})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 8
    # received blocks count as computed (vLLM), all but the last, whose last token is recomputed
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 784
    assert "kv_transfer_params" not in body
    p_stats, d_stats = await stats(http, p_url), await stats(http, d_url)
    assert p_stats["kv_held"] == 0  # read: freed on the prefill side
    assert (p_stats["remote_prefills"], d_stats["remote_decodes"]) == (1, 1)
    assert d_stats["kv_transfers_failed"] == 0
    assert await metric(http, d_url, "vllm:nixl_xfer_time_seconds_count") == 1
    assert await metric(http, d_url, "vllm:nixl_bytes_transferred_sum") == 50 * 16 * 131_072


async def test_a_second_read_of_the_same_kv_fails_and_the_decode_computes_the_prompt(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(2)
    params = await prefill(http, fleet.urls[0])
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": params}
    assert (await post(http, fleet.urls[1] + "/v1/completions", body))[0] == 200
    status, again = await post(http, fleet.urls[1] + "/v1/completions", body)
    assert status == 200  # vLLM's recompute policy: a failed load is served, not lost
    assert (await stats(http, fleet.urls[1]))["kv_transfers_failed"] == 1
    assert await metric(http, fleet.urls[1], "vllm:nixl_num_failed_transfers_total") == 1
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 784  # its own cache now


async def test_unread_kv_expires_on_the_prefill_side(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(1, kv_transfer=KvTransferSettings(hold_timeout_s=1.0))  # 10 ms real
    await prefill(http, fleet.urls[0])
    for _ in range(200):
        if (await stats(http, fleet.urls[0]))["kv_held"] == 0:
            break
        await asyncio.sleep(0.01)
    assert (await stats(http, fleet.urls[0]))["kv_expired"] == 1
    assert await metric(http, fleet.urls[0], "vllm:nixl_num_kv_expired_reqs_total") == 1


async def test_a_decode_waits_for_its_transfer_and_counts_as_waiting(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    slow = KvTransferSettings(bandwidth_gbs=0.001)  # 105 MB at 1 MB/s: 105 simulated s, ~1 s real
    fleet = await make_fleet(2, kv_transfer=slow)
    params = await prefill(http, fleet.urls[0])
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": params}
    task = asyncio.create_task(post(http, fleet.urls[1] + "/v1/completions", body))
    for _ in range(100):
        if (await stats(http, fleet.urls[1]))["kv_receiving"] == 1:
            break
        await asyncio.sleep(0.005)
    assert (await stats(http, fleet.urls[1]))["waiting"] == 1
    assert await metric(http, fleet.urls[1], "vllm:num_requests_waiting") == 1
    task.cancel()  # the client goes away mid-transfer: nothing is left behind on the decode side
    await asyncio.sleep(0.05)
    assert (await stats(http, fleet.urls[1]))["kv_receiving"] == 0


async def test_malformed_kv_transfer_params_are_400(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0] + "/v1/completions"
    for params in ("x", {"do_remote_prefill": True, "remote_block_ids": "1,2", "remote_engine_id": "e"},
                   {"do_remote_prefill": True, "remote_block_ids": [1], "remote_engine_id": 3},
                   {"do_remote_decode": True, "do_remote_prefill": True}, {"do_remote_decode": "yes"}):
        status, body = await post(http, url, {"model": MODEL, "prompt": "x", "kv_transfer_params": params})
        assert status == 400, params
        assert body["error"]["param"] == "kv_transfer_params"
    status, _ = await post(http, url, {"model": MODEL, "prompt": "x", "kv_transfer_params": {}})
    assert status == 200  # asks for nothing
