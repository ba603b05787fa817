"""Issue 35: a pool of JetStream servers (TPU), in the simulator's JetStream dialect, through real
Envoy and the picker: the picker reads JetStream's backlogs and decode slots, and keeps new
requests off the replica with a queue."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.picker_harness import (
    StartGateway,
    StartPicker,
    background_load,
    completion_body,
    fleet_stats,
    pool_report,
    post_json,
    received,
    start_gateway,
    start_picker,
    wait_until,
)
from tests.e2e.test_picker_routing import StartFleet

__all__ = ["start_gateway", "start_picker"]  # fixtures used by name

pytestmark = pytest.mark.e2e


async def test_a_jetstream_pool_is_scraped_in_its_dialect_and_its_queue_avoided(
    start_fleet: StartFleet,
    start_picker: StartPicker,
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
) -> None:
    # Replica 0 has one decode slot: a backlog builds there, and its slots are all in use.
    fleet = await start_fleet(3, 0.1, ["--engine", "jetstream", "--admin-port", "0",
                                       "--replica", "0:max_num_seqs=1"])
    async with http.get(fleet.urls[0] + "/metrics") as response:
        page = await response.text()
    assert "jetstream_prefill_backlog_size{" in page
    assert "vllm:" not in page
    picker = await start_picker([{"name": "tpu", "endpoints": fleet.addresses, "engine": "jetstream"}])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("tpu")])
    queue = [(fleet.urls[0], completion_body(f"queued {i}", 4000)) for i in range(6)]
    async with background_load(http, queue):

        async def backlog_seen() -> bool:
            report = pool_report(picker, "tpu")
            return bool(report[0]["waiting"] >= 4 and report[0]["kv_cache_usage"] == 1.0)

        await wait_until(backlog_seen, "the picker to read replica 0's backlog and full slots")
        before = await fleet_stats(http, fleet)
        for i in range(9):
            reply = await post_json(http, gateway, completion_body(f"new {i}", 4))
            assert reply.status == 200, reply.text
        after = await fleet_stats(http, fleet)
        assert after[0]["waiting"] >= 3, "the backlog drained too early"
    counts = received(before, after)
    assert counts[0] == 0, counts
    assert sum(counts) == 9, counts


async def test_the_pools_metrics_port_is_scraped_instead_of_the_serving_port(
    start_picker: StartPicker,
) -> None:
    """JetStream serves its metrics on ``prometheus_port``: the pool's ``metricsPort`` is scraped
    (the endpoint's serving port has nothing listening here)."""
    fixture = Path(__file__).parents[1] / "gateway" / "picker" / "fixtures" / "jetstream.prom"
    body = fixture.read_text()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    metrics_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", metrics_port).start()
    try:
        picker = await start_picker([{"name": "tpu", "endpoints": [f"127.0.0.1:{free_port()}"],
                                      "engine": "jetstream", "metricsPort": metrics_port}])

        async def scraped() -> bool:
            [endpoint] = pool_report(picker, "tpu")
            return bool(endpoint["waiting"] == 6)

        await wait_until(scraped, "the endpoint scraped on the pool's metrics port")
    finally:
        await runner.cleanup()
