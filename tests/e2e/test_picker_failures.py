"""Issue 3 acceptance 6 and 8 over real Envoy + the real picker + the simulator: the picker going
down (``kvgate picker`` as a subprocess, FailClose vs FailOpen pools) and a replica stopped mid-run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.controlplane.envoy_config import RouteSpec
from kvgate.policies.types import FailureMode
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import (
    MODEL,
    CountingUpstream,
    PickerProcess,
    StartGateway,
    StartPicker,
    completion_body,
    fleet_admin_url,
    fleet_stats,
    pool_report,
    post_json,
    received,
    start_counting_upstream,
    start_gateway,
    start_picker,
    start_picker_process,
    wait_replica_state,
    wait_until,
)

__all__ = ["start_counting_upstream", "start_gateway", "start_picker", "start_picker_process"]

pytestmark = pytest.mark.e2e

StartFleet = Callable[..., Awaitable[SimFleet]]
OPEN = {"x-test-pool": "open"}


async def test_picker_down_fail_close_answers_5xx_and_fail_open_still_serves(
    start_fleet: StartFleet,
    start_picker_process: Callable[..., Awaitable[PickerProcess]],
    start_gateway: StartGateway,
    start_counting_upstream: Callable[[], Awaitable[CountingUpstream]],
    http: aiohttp.ClientSession,
) -> None:
    fleet = await start_fleet(2, 0.1, ["--admin-port", "0"])
    addresses = fleet.addresses
    outside = await start_counting_upstream()
    picker = await start_picker_process([
        {"name": "closed", "endpoints": addresses, "failureMode": "FailClose"},
        {"name": "open", "endpoints": addresses, "failureMode": "FailOpen"},
    ])

    async def picker_ready() -> bool:
        async with http.get(f"{picker.admin_url}/readyz") as response:
            return response.status == 200

    await wait_until(picker_ready, "kvgate picker ready (fresh metrics for every pool)")
    gateway = await start_gateway(
        picker.grpc_port,
        [PoolBackend("closed"), PoolBackend("open", FailureMode.FAIL_OPEN, tuple(addresses))],
        routes=[RouteSpec("open", "open", headers=(("x-test-pool", "open"),)), RouteSpec("closed", "closed")],
    )
    for headers in ({}, OPEN):
        reply = await post_json(http, gateway, completion_body("picker up"), headers=headers)
        assert reply.status == 200, (headers, reply.text)

    assert await picker.stop() == 0  # SIGTERM: a clean exit
    forged = {"x-gateway-destination-endpoint": outside.address}
    for headers in ({}, forged):
        reply = await post_json(http, gateway, completion_body("picker down"), headers=headers, timeout_s=5.0)
        assert reply.status == 503, reply.text
        assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
        assert reply.json()["error"]["code"] == "endpoint_picker_unavailable", reply.text
    before = await fleet_stats(http, fleet)
    for i in range(6):
        reply = await post_json(http, gateway, completion_body(f"fail open {i}"), headers={**OPEN, **forged})
        assert reply.status == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
    stream_body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                   "stream": True}
    reply = await post_json(http, gateway, stream_body, path="/v1/chat/completions", headers=OPEN)
    assert reply.status == 200, reply.text
    assert reply.text.rstrip().endswith("data: [DONE]"), reply.text
    after = await fleet_stats(http, fleet)
    assert sum(received(before, after)) == 7  # served by the pool's replicas (round robin) ...
    assert outside.hits == 0  # ... never by the forged destination


async def _long_request(http: aiohttp.ClientSession, url: str, i: int) -> str:
    """A long request through the gateway; returns "ok" or how it failed (never hangs: bounded)."""
    stream = i % 2 == 1
    body = completion_body(f"long request {i}", 3000, stream=stream)
    try:
        reply = await post_json(http, url, body, timeout_s=20.0)
    except TimeoutError:
        return "hang"
    except aiohttp.ClientError as exc:
        return f"error: {type(exc).__name__}"
    if reply.status != 200:
        return f"error: {reply.status}"
    if stream and (not reply.text.rstrip().endswith("data: [DONE]") or '"error"' in reply.text):
        return "error: stream ended with an error"
    return "ok"


async def test_stopped_replica_gets_no_new_requests_and_its_inflight_requests_fail(
    start_fleet: StartFleet,
    start_picker: StartPicker,
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
) -> None:
    fleet = await start_fleet(3, 0.1, ["--admin-port", "0"])
    picker = await start_picker([{"name": "llama", "endpoints": fleet.addresses}])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")])
    # Six ~3.5 s requests (half streaming) spread over the three replicas.
    inflight = [asyncio.create_task(_long_request(http, gateway, i)) for i in range(6)]
    try:
        stats = await wait_replica_state(
            http, fleet, lambda s: sum(r["running"] for r in s) == 6, "six requests running"
        )
        victim = max(range(3), key=lambda i: stats[i]["in_flight"])
        on_victim = stats[victim]["in_flight"]
        async with http.post(f"{fleet_admin_url(fleet)}/replicas/{victim}/stop") as response:
            assert response.status == 200
        stopped_at = asyncio.get_running_loop().time()

        async def victim_dropped() -> bool:
            return not pool_report(picker, "llama")[victim]["healthy"]

        # One staleness window (stale_after 0.2 s after the last good scrape, plus a scrape timeout
        # of 0.5 s at most); polled with a generous bound for this 2-core machine.
        await wait_until(victim_dropped, "the picker to drop the stopped replica", timeout_s=3.0)
        outcomes = await asyncio.wait_for(asyncio.gather(*inflight), 25.0)
    finally:
        for task in inflight:
            task.cancel()
    assert "hang" not in outcomes, outcomes
    assert sum(o != "ok" for o in outcomes) == on_victim, (outcomes, on_victim)
    assert asyncio.get_running_loop().time() - stopped_at < 25.0

    before = await fleet_stats(http, fleet)
    for i in range(12):
        reply = await post_json(http, gateway, completion_body(f"after stop {i}"))
        assert reply.status == 200, reply.text  # a request routed to the stopped replica would fail
    after = await fleet_stats(http, fleet)
    counts = received(before, after)
    assert counts[victim] == 0, counts
    assert sum(counts) == 12, counts
    assert after[victim]["requests_failed_stopped"] == on_victim
