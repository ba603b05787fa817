"""Issue 3 acceptance 4-5 over real Envoy + the real picker + the simulator: the subset hint, forged
destination headers, and every error status with an OpenAI JSON body."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.controlplane.envoy_config import RouteSpec
from kvgate.gateway.picker.pool_runtime import PoolRuntime
from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import (
    MODEL,
    CountingUpstream,
    Reply,
    StartGateway,
    StartPicker,
    background_load,
    completion_body,
    fleet_stats,
    post_json,
    received,
    start_counting_upstream,
    start_gateway,
    start_picker,
    wait_until,
)

__all__ = ["start_counting_upstream", "start_gateway", "start_picker"]  # fixtures used by name

pytestmark = pytest.mark.e2e

StartFleet = Callable[..., Awaitable[SimFleet]]
DESTINATION = "x-gateway-destination-endpoint"


async def test_subset_hint_is_honoured_and_forged_destinations_are_ignored(
    start_fleet: StartFleet,
    start_picker: StartPicker,
    start_gateway: StartGateway,
    start_counting_upstream: Callable[[], Awaitable[CountingUpstream]],
    http: aiohttp.ClientSession,
) -> None:
    fleet = await start_fleet(3, 0.1, ["--admin-port", "0"])
    addresses = fleet.addresses
    outside = await start_counting_upstream()
    picker = await start_picker([{"name": "llama", "endpoints": addresses}])
    hinted = await start_gateway(picker.grpc_port, [PoolBackend("llama")], subset_hint=[addresses[1]])
    forged = [
        {},
        {DESTINATION: outside.address},
        {"X-Gateway-Destination-Endpoint": outside.address},
        {DESTINATION: f"{outside.address},{addresses[1]}"},
        {DESTINATION: addresses[0]},
        {"x-gateway-destination-endpoint-served": outside.address},
        {"x-kvgate-pool": "other"},
        # Envoy's router obeys these from internal requests only; they would time the request out
        # after 1 ms. With no internal_address_config (kvgate writes none) every request is external,
        # whatever its x-forwarded-for, and Envoy removes them (the picker sets the per-try one).
        {"x-envoy-upstream-rq-timeout-ms": "1", "x-forwarded-for": "10.1.2.3"},
        {"x-envoy-upstream-rq-per-try-timeout-ms": "1", "x-forwarded-for": "10.1.2.3"},
    ]
    before = await fleet_stats(http, fleet)
    for i, headers in enumerate(forged * 2):
        reply = await post_json(http, hinted, completion_body(f"request {i}"), headers=headers)
        assert reply.status == 200, (headers, reply.text)
        assert reply.json()["object"] == "text_completion"
    after = await fleet_stats(http, fleet)
    assert received(before, after) == [0, 2 * len(forged), 0]
    assert outside.hits == 0

    # A hint naming only an address outside the pool reaches nothing: 503 from the picker.
    outside_hint = await start_gateway(
        picker.grpc_port, [PoolBackend("llama")], subset_hint=[outside.address]
    )
    forged_outside = {DESTINATION: outside.address}
    reply = await post_json(http, outside_hint, completion_body("hint outside"), headers=forged_outside)
    _assert_openai_error(reply, 503)
    assert outside.hits == 0


def _assert_openai_error(reply: Reply, status: int) -> None:
    assert reply.status == status, (reply.status, reply.text)
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    error = reply.json()["error"]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["type"], str)
    assert error["type"]
    assert "code" in error


@pytest.fixture
async def error_gateway(
    start_fleet: StartFleet, start_picker: StartPicker, start_gateway: StartGateway
) -> tuple[str, SimFleet, PoolRuntime]:
    # Replica 0 serves the "llama" pool; replica 1 (one sequence at a time) the "busy" pool.
    fleet = await start_fleet(2, 0.1, ["--admin-port", "0", "--replica", "1:max_num_seqs=1"])
    addresses = fleet.addresses
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    picker = await start_picker(
        [
            {"name": "llama", "endpoints": addresses[:1], "models": [MODEL]},
            {"name": "busy", "endpoints": addresses[1:], "objectives": [{"name": "batch", "priority": -1}]},
            {"name": "empty", "endpoints": []},
            {"name": "down", "endpoints": dead},
        ],
        lifecycle=LifecycleConfig(max_body_bytes=64 * 1024),
    )
    busy = picker.table.pools["busy"]
    routes = [RouteSpec(name, name, headers=(("x-test-pool", name),)) for name in ("busy", "empty", "down")]
    gateway = await start_gateway(
        picker.grpc_port,
        [PoolBackend(name) for name in ("llama", "busy", "empty", "down")],
        routes=[*routes, RouteSpec("llama", "llama")],
    )
    return gateway, fleet, busy


async def test_every_error_status_has_an_openai_json_body(
    error_gateway: tuple[str, SimFleet, PoolRuntime], http: aiohttp.ClientSession
) -> None:
    gateway, fleet, busy = error_gateway
    chat = "/v1/chat/completions"
    cases: list[tuple[int, str | dict[str, object], str, dict[str, str]]] = [
        (400, "{not json", "/v1/completions", {}),
        (400, {"prompt": "no model"}, "/v1/completions", {}),
        (400, {"model": MODEL}, "/v1/completions", {}),
        (400, {"model": MODEL, "messages": []}, chat, {}),
        (400, {"model": 123, "prompt": "hi"}, "/v1/completions", {}),
        # 20,000 levels (within this gateway's 64 KB limit): refused as too deep, and the picker
        # goes on serving the cases after it
        (400, '{"model":"m","prompt":' + "[" * 20_000 + "]" * 20_000 + "}", "/v1/completions", {}),
        (404, completion_body("x", model="no-such-model"), "/v1/completions", {}),
        (413, completion_body("y" * 100_000), "/v1/completions", {}),
        (503, completion_body("nowhere"), "/v1/completions", {"x-test-pool": "empty"}),
        (503, completion_body("all down"), "/v1/completions", {"x-test-pool": "down"}),
    ]
    for status, body, path, headers in cases:
        reply = await post_json(http, gateway, body, path=path, headers=headers)
        _assert_openai_error(reply, status)

    # 413 also when the body streams in without a content-length (chunked upload).
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"z" * 8192

    async with http.post(f"{gateway}/v1/completions", data=chunks(),
                         headers={"content-type": "application/json"}) as response:
        headers = {k.lower(): v for k, v in response.headers.items()}
        _assert_openai_error(Reply(response.status, headers, await response.text()), 413)

    # 429: a sheddable request (objective priority < 0) while every endpoint of its pool is saturated.
    busy_url = fleet.urls[1]
    load = [(busy_url, completion_body(f"queued {i}", 4000)) for i in range(7)]
    shed_headers = {"x-test-pool": "busy", "x-gateway-inference-objective": "batch"}
    before = await fleet_stats(http, fleet)
    async with background_load(http, load):

        async def saturated() -> bool:
            return pool_waiting(busy) >= 5

        await wait_until(saturated, "the busy pool's only replica to queue >= 5 requests")
        reply = await post_json(http, gateway, completion_body("shed me"), headers=shed_headers)
        _assert_openai_error(reply, 429)
        assert "retry-after" in reply.headers
    after = await fleet_stats(http, fleet)
    assert received(before, after)[1] == len(load)  # the shed request never reached the replica

    # The picker still serves, after every error.
    for i in range(3):
        reply = await post_json(http, gateway, completion_body(f"still fine {i}"))
        assert reply.status == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4


def pool_waiting(pool: PoolRuntime) -> int:
    """Requests waiting on the pool's only endpoint, as the picker last scraped them."""
    (view,) = pool.endpoints()
    return 0 if view.metrics is None else view.metrics.waiting

