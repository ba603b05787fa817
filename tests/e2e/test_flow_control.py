"""Flow control (issue 34) over real Envoy, the real picker and the simulator.

- Scale from zero: a request to a pool whose only replica is not up yet waits in the picker and is
  served when the replica comes, past Envoy's own message timeout (the picker extends it for the
  held message); with a shorter queue timeout it gets 503 with Retry-After.
- A full pool: requests beyond the in-flight limit wait in the picker (not in the replica's queue)
  and are all served; the held ones show in the picker's metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.controlplane.envoy_config import ONE_PASS
from kvgate.gateway.picker.service import PickerService
from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import (
    StartGateway,
    StartPicker,
    completion_body,
    fleet_stats,
    post_json,
    start_gateway,
    start_picker,
    wait_until,
)

__all__ = ["start_gateway", "start_picker"]  # fixtures by name

pytestmark = pytest.mark.e2e

StartFleet = Callable[..., Awaitable[SimFleet]]
QUEUE_DURATION_COUNT = "inference_extension_flow_control_request_queue_duration_seconds_count"
"""Its samples' keys from ``metric_samples``: (fairness_id, inference_pool, outcome, priority)."""
SHORT_MESSAGE_TIMEOUT = dataclasses.replace(ONE_PASS, message_timeout_s=1.0)
"""kvgate's own data path with Envoy's ext_proc message timeout cut to 1 s: a held request must
outlast it."""


async def test_a_pool_scaled_to_zero_holds_the_request_until_its_replica_is_ready(
    start_fleet: StartFleet, start_picker: StartPicker, start_gateway: StartGateway,
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    pool = {"name": "llama", "endpoints": [f"127.0.0.1:{port}"], "flowControl": {"queueTimeoutSeconds": 20}}
    picker = await start_picker([pool])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")], settings=SHORT_MESSAGE_TIMEOUT)
    started = time.monotonic()
    waiting = asyncio.create_task(post_json(http, gateway, completion_body("cold start"), timeout_s=30))
    await asyncio.sleep(2.5)  # over twice Envoy's message timeout
    assert not waiting.done()
    assert await held(http, picker) == 1
    [report] = picker.pool_report()
    assert report["flow_control"] == {"held": 1, "queue_timeout_s": 20.0}
    await start_fleet(1, 1.0, ["--port", str(port)])
    reply = await waiting
    assert reply.status == 200, reply.text
    assert reply.json()["choices"][0]["text"]
    assert time.monotonic() - started > 2.5
    assert await held(http, picker) == 0


async def test_a_request_that_outwaits_its_queue_timeout_gets_503_with_retry_after(
    start_picker: StartPicker, start_gateway: StartGateway, http: aiohttp.ClientSession,
) -> None:
    pool = {"name": "llama", "endpoints": [f"127.0.0.1:{free_port()}"],
            "flowControl": {"queueTimeoutSeconds": 1.5, "retryAfterSeconds": 7}}
    picker = await start_picker([pool])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")], settings=SHORT_MESSAGE_TIMEOUT)
    started = time.monotonic()
    reply = await post_json(http, gateway, completion_body("nobody home"))
    waited = time.monotonic() - started
    assert reply.status == 503, reply.text
    assert reply.headers["retry-after"] == "7"
    assert reply.json()["error"]["code"] == "queue_timeout"
    assert 1.4 < waited < 10
    counts = await metric_samples(http, picker, QUEUE_DURATION_COUNT)
    assert counts == {("", "llama", "EvictedTTL", "0"): 1.0}


async def test_requests_beyond_the_in_flight_limit_wait_in_the_picker_and_are_all_served(
    start_fleet: StartFleet, start_picker: StartPicker, start_gateway: StartGateway,
    http: aiohttp.ClientSession,
) -> None:
    fleet = await start_fleet(1, 1.0, ["--admin-port", "0"])
    pool = {"name": "llama", "endpoints": fleet.addresses,
            "flowControl": {"maxInflightPerEndpoint": 1, "queueTimeoutSeconds": 30}}
    picker = await start_picker([pool])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")], settings=ONE_PASS)
    tenants = ["a", "b", "a", "b"]
    sent = [asyncio.create_task(post_json(
        http, gateway, completion_body(f"request {i}", max_tokens=40), timeout_s=60,
        headers={"x-gateway-inference-fairness-id": tenant})) for i, tenant in enumerate(tenants)]

    async def three_held() -> bool:
        return await held(http, picker) == 3

    await wait_until(three_held, "three of the four requests held in the picker")
    [replica] = await fleet_stats(http, fleet)
    assert replica["requests_received"] == 1  # the replica saw one; the picker holds the rest
    replies = await asyncio.gather(*sent)
    assert [r.status for r in replies] == [200] * 4, [r.text for r in replies]
    [replica] = await fleet_stats(http, fleet)
    assert replica["requests_received"] == 4
    dispatched = await metric_samples(http, picker, QUEUE_DURATION_COUNT)
    assert sum(v for k, v in dispatched.items() if k[2] == "Dispatched") == 3
    assert {k[0] for k in dispatched} == {"a", "b"}


async def held(http: aiohttp.ClientSession, picker: PickerService) -> float:
    samples = await metric_samples(http, picker, "kvgate_flow_control_held_requests")
    return sum(samples.values())


async def metric_samples(http: aiohttp.ClientSession, picker: PickerService,
                         name: str) -> dict[tuple[str, ...], float]:
    """The picker's samples of ``name`` from its admin /metrics page, keyed by their label values in
    the order of the labels' names."""
    from prometheus_client.parser import text_string_to_metric_families

    async with http.get(f"http://127.0.0.1:{picker.admin.port}/metrics") as response:
        page = await response.text()
    return {tuple(value for _, value in sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(page) for s in family.samples if s.name == name}


async def test_a_full_pool_spills_to_its_fallback_pool_and_traffic_returns_when_it_has_room(
    start_fleet: StartFleet, start_picker: StartPicker, start_gateway: StartGateway,
    http: aiohttp.ClientSession,
) -> None:
    fleet = await start_fleet(2, 1.0, ["--admin-port", "0"])
    preferred, spot = fleet.addresses
    picker = await start_picker([
        {"name": "llama", "endpoints": [preferred], "spillTo": "spot",
         "flowControl": {"maxInflightPerEndpoint": 1}},
        {"name": "spot", "endpoints": [spot]},
    ])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")], settings=ONE_PASS)
    long = asyncio.create_task(post_json(http, gateway, completion_body("occupies the preferred pool",
                                                                        max_tokens=300), timeout_s=60))

    async def preferred_busy() -> bool:
        return [r["requests_received"] for r in await fleet_stats(http, fleet)] == [1, 0]

    await wait_until(preferred_busy, "the first request reached the preferred pool")
    spilled = await post_json(http, gateway, completion_body("overflow"))
    assert spilled.status == 200, spilled.text
    assert [r["requests_received"] for r in await fleet_stats(http, fleet)] == [1, 1]
    assert (await long).status == 200
    back = await post_json(http, gateway, completion_body("preferred again"))
    assert back.status == 200, back.text
    assert [r["requests_received"] for r in await fleet_stats(http, fleet)] == [2, 1]
    counts = await metric_samples(http, picker, "kvgate_spilled_requests_total")
    assert counts == {("llama", "spot"): 1.0}


async def test_a_client_that_goes_away_while_held_leaves_the_queue_at_once(
    start_picker: StartPicker, start_gateway: StartGateway, http: aiohttp.ClientSession,
) -> None:
    pool = {"name": "llama", "endpoints": [f"127.0.0.1:{free_port()}"],
            "flowControl": {"queueTimeoutSeconds": 60}}
    picker = await start_picker([pool])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")], settings=ONE_PASS)
    with pytest.raises(TimeoutError):
        await post_json(http, gateway, completion_body("impatient"), timeout_s=1.0)

    async def left() -> bool:
        counts = await metric_samples(http, picker, QUEUE_DURATION_COUNT)
        return counts.get(("", "llama", "EvictedContextCancelled", "0")) == 1.0

    await wait_until(left, "the held request counted as cancelled", timeout_s=5.0)
    assert await held(http, picker) == 0
