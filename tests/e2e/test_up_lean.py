"""``kvgate up --skip-unread-responses`` through real Envoy: requests whose response nothing reads
skip the response-headers round trip (a ``mode_override`` in the reply to the request headers,
which Envoy 1.40 honours), are served, and still end in the picker when Envoy closes the stream.
What the picker no longer sees comes back in Envoy's outcome reports (its gRPC access log,
``extproc.outcomes``): non-streamed first tokens, fallbacks, and a replica answering 500."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import UpOptions
from kvgate.policies.plugins.recorders import OutlierEjection
from kvgate.policies.scheduler import ProfileScheduler
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_admin_url, fleet_stats
from tests.e2e.test_up_faults import _one, inflight_settles_at_zero, three_replicas_configured
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e


def _sum(page: str, family: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(family))


@pytest.mark.parametrize("skip", [True, False], ids=["skipping", "reading"])
async def test_skipped_responses_are_served_and_end_in_the_picker(
    skip: bool, tmp_path: Path, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    await three_replicas_configured(start_fleet, tmp_path, "127.0.4.41" if skip else "127.0.4.51")
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=0,
                            skip_unread_responses=skip))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        results = await asyncio.gather(*(_one(http, up.url, i) for i in range(40)))  # half streamed
        assert [r for r in results if r[0] != 200] == []
        assert await inflight_settles_at_zero(http, up)
        # the first token of a non-streamed response is its headers: the picker sees them, or
        # (skipping) Envoy's outcome report tells it when they came, a flush interval later
        page = await _metrics_when(http, up, "inference_objective_request_ttft_seconds_count", 20)
        assert _sum(page, "inference_objective_request_total") == 40
        assert _sum(page, "inference_objective_request_ttft_seconds_count") == 20
    finally:
        await up.stop()


async def _metrics_when(http: aiohttp.ClientSession, up: KvgateUp, family: str, at_least: float) -> str:
    page = ""
    for _ in range(200):  # (up to ~10 s: reports come every 50 ms, later on a loaded machine)
        async with http.get(f"{up.admin_url}/metrics") as response:
            page = await response.text()
        if _sum(page, family) >= at_least:
            break
        await asyncio.sleep(0.05)
    return page


async def test_outcome_reports_count_fallbacks_and_eject_a_replica_answering_500(
    tmp_path: Path, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    """Replica 0 answers every request with a 500 while its metrics page is fine. Skipping the
    response headers, the picker learns it only from the outcome reports: each failed attempt is
    counted as a fallback, and the picker stops choosing the replica."""
    fleet = await three_replicas_configured(start_fleet, tmp_path, "127.0.4.61")
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=0,
                            skip_unread_responses=True))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        # (Envoy's access-log stream to the picker is open before the faults: entries of requests
        # that end while it connects can be lost, which no wait afterwards would show)
        await asyncio.gather(*(_one(http, up.url, 2 * i) for i in range(3)))
        await _metrics_when(http, up, "kvgate_outcome_reports_total", 3)
        served_before = (await fleet_stats(http, fleet))[0]["requests_received"]
        async with http.post(f"{fleet_admin_url(fleet)}/replicas/0/faults", json={"error_rate": 1.0}) as r:
            assert r.status == 200
        first = await asyncio.gather(*(_one(http, up.url, 2 * i) for i in range(60)))  # non-streamed
        assert [r for r in first if r[0] != 200] == []  # Envoy retried each 500 on the next endpoint
        failed = (await fleet_stats(http, fleet))[0]["requests_received"] - served_before
        assert failed > 0
        page = await _metrics_when(http, up, "kvgate_fallback_served_total", failed)
        assert _sum(page, "kvgate_fallback_served_total") >= failed  # every one reported and counted
        picker = up.picker
        assert picker is not None
        [pool] = picker.table.pools.values()
        address = fleet.addresses[0]
        assert isinstance(pool.scheduler_impl, ProfileScheduler)
        [ejection] = [f for f in pool.scheduler_impl.feedback if isinstance(f, OutlierEjection)]
        assert ejection.tracker.ejections(address) >= 1  # the picker's own verdict
    finally:
        await up.stop()
