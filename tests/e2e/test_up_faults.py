"""A replica that dies loses no request that had not started its response (issue 14), through the
composition ``kvgate up`` runs: real Envoy with kvgate's pool clusters (the picker's pick, then its
fallbacks: Envoy's override_host policy) and bounded retries, the in-process picker, a simulated
fleet of three replicas.

Half of the requests stream. One replica's listener is stopped while requests are in flight: a
request that was picked onto it before the picker noticed (its scrapes fail within ~50 ms) is
retried on the next endpoint the picker ranked; only responses already streaming from it may end
early (the simulator ends them with an error). Afterwards the picker's in-flight counts are zero.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import UpOptions
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_admin_url, fleet_stats
from tests.e2e.test_up_routing import StartUp, gateway_yaml, pods_yaml, pool_yaml, start_up, wait_ready

pytestmark = pytest.mark.e2e
CUT = 599
__all__ = ["start_up"]  # the fixture, imported for this module's tests

ROUTE = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: llm}
spec:
  parentRefs: [{name: gw}]
  rules:
    - backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: pool}]
"""


async def three_replicas_configured(
    start_fleet: Callable[..., Awaitable[SimFleet]], directory: Path, first_ip: str
) -> SimFleet:
    """Three simulated replicas from ``first_ip`` on, and the manifests of one pool of them routed
    by one HTTPRoute, written into ``directory`` for ``kvgate up``."""
    port = free_port()
    fleet = await start_fleet(
        replicas=3, time_scale=0.01,
        extra_args=["--port", str(port), "--hosts-from", first_ip, "--admin-port", "0", "--model", "base"],
    )
    (directory / "gateway.yaml").write_text(gateway_yaml())
    (directory / "pool.yaml").write_text(pool_yaml("pool", port) + "---" + pods_yaml("pool", fleet))
    (directory / "route.yaml").write_text(ROUTE)
    return fleet


async def _one(
    http: aiohttp.ClientSession, url: str, index: int, max_tokens: int = 24
) -> tuple[int, bool, bool]:
    """(status, streamed, whether the response had started before it failed); a body cut short
    (the connection reset mid-response) is status 599."""
    stream = index % 2 == 1
    body = {"model": "base", "prompt": f"request {index}", "max_tokens": max_tokens, "stream": stream}
    started = False
    async with http.post(f"{url}/v1/completions", data=json.dumps(body),
                         headers={"content-type": "application/json"}) as response:
        text = ""
        try:
            async for chunk in response.content.iter_any():
                started = True
                text += chunk.decode(errors="replace")
        except aiohttp.ClientPayloadError:
            return CUT, stream, started
        ok = response.status == 200 and (not stream or "[DONE]" in text) and '"error"' not in text
        return (200 if ok else response.status or 599), stream, started and response.status == 200


async def inflight_settles_at_zero(http: aiohttp.ClientSession, up: KvgateUp) -> bool:
    """Whether the picker's in-flight counts over every endpoint reach 0 within 5 s."""

    async def inflight() -> int:
        async with http.get(f"{up.admin_url}/debug/pools") as response:
            pools = (await response.json())["pools"]
        return sum(int(e.get("inflight_requests", 0)) for pool in pools for e in pool["endpoints"])

    for _ in range(50):
        if await inflight() == 0:
            return True
        await asyncio.sleep(0.1)
    return await inflight() == 0


async def test_a_stopped_replica_fails_no_request_that_had_not_started(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    fleet = await three_replicas_configured(start_fleet, tmp_path, "127.0.4.1")
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool"])
    gate = asyncio.Semaphore(16)

    async def limited(index: int) -> tuple[int, bool, bool]:
        async with gate:
            return await _one(http, up.url, index)

    tasks = [asyncio.create_task(limited(i)) for i in range(400)]
    await asyncio.sleep(0.3)  # mid-run
    async with http.post(f"{fleet_admin_url(fleet)}/replicas/1/stop") as response:
        assert response.status == 200
    results = await asyncio.gather(*tasks)
    failed = [(status, stream, started) for status, stream, started in results if status != 200]
    not_started = [f for f in failed if not f[2]]
    assert not_started == [], f"{len(not_started)} requests failed before their response started: {failed}"
    assert len(failed) <= 16, failed  # at most those streaming from the replica when it stopped
    stats = await fleet_stats(http, fleet)
    assert stats[1]["requests_received"] > 0  # it did serve before it stopped
    served_after = sum(s["requests_received"] for i, s in enumerate(stats) if i != 1)
    assert served_after + stats[1]["requests_received"] >= 400
    assert await inflight_settles_at_zero(http, up)


async def test_a_replica_answering_500_fails_no_request_and_is_ejected_from_picking(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    """Its metrics page still answers, so only the requests show it: each 500 is retried on the
    next endpoint the picker ranked, and after a few the picker (and Envoy) stop sending it any."""
    fleet = await three_replicas_configured(start_fleet, tmp_path, "127.0.4.11")
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool"])
    async with http.post(f"{fleet_admin_url(fleet)}/replicas/0/faults", json={"error_rate": 1.0}) as response:
        assert response.status == 200
    gate = asyncio.Semaphore(8)

    async def limited(index: int) -> tuple[int, bool, bool]:
        async with gate:
            return await _one(http, up.url, index)

    first = await asyncio.gather(*(limited(i) for i in range(100)))
    assert [r for r in first if r[0] != 200] == []
    before = (await fleet_stats(http, fleet))[0]["requests_received"]
    second = await asyncio.gather(*(limited(i) for i in range(100, 200)))
    assert [r for r in second if r[0] != 200] == []
    after = (await fleet_stats(http, fleet))[0]["requests_received"]
    assert after - before <= 5, f"the failing replica still got {after - before} of 100 requests"
    async with http.get(f"{up.admin_url}/metrics") as response:
        page = await response.text()
    fallbacks = sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("kvgate_fallback_served_total")
    )
    assert fallbacks >= before  # every request it failed was served by a fallback, and counted


async def test_a_hung_replica_fails_no_request_and_stops_being_picked(
    tmp_path: Path, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    """The simulator's ``hang`` fault: replica 0 accepts and never answers, its /metrics fine. A
    streamed request sent there is abandoned after the stream idle bound (0.5 s here), a non-streamed
    one after its attempt bound (0.5 s + 10 ms for each of its 24 tokens), and each is served by the
    next endpoint the picker ranked; after a few, the picker leaves the replica out."""
    fleet = await three_replicas_configured(start_fleet, tmp_path, "127.0.4.21")
    options = UpOptions(
        directory=tmp_path, port=free_port(), admin_port=0, sim=0, stream_idle_retry_s=0.5,
        attempt_timeout_s=0.5, attempt_timeout_per_token_s=0.01,
    )
    up = KvgateUp(options)
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        hang = {"hang": True}
        async with http.post(f"{fleet_admin_url(fleet)}/replicas/0/faults", json=hang) as response:
            assert response.status == 200
        gate = asyncio.Semaphore(8)

        async def one(index: int) -> tuple[int, bool, bool]:
            async with gate:
                return await _one(http, up.url, index)  # odd: streamed, even: not

        results = await asyncio.gather(*(one(i) for i in range(120)))
        assert [r for r in results if r[0] != 200] == []
        hung = (await fleet_stats(http, fleet))[0]["hung"]
        assert 0 < hung <= 24, f"the hung replica held {hung} of 120 requests"
        later = await asyncio.gather(*(one(i) for i in range(120, 180)))
        assert [r for r in later if r[0] != 200] == []
        assert (await fleet_stats(http, fleet))[0]["hung"] - hung <= 4  # ejected from picking
    finally:
        async with http.post(f"{fleet_admin_url(fleet)}/replicas/0/faults", json={"hang": False}):
            pass
        await up.stop()


async def test_a_stream_cut_mid_response_reaches_the_client_as_an_error_and_is_counted(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    """The simulator's ``cut_streams`` fault on every replica: each streamed response's connection
    is aborted halfway through its tokens (an engine that died mid-generation). The response had
    started, so it is not retried; Envoy resets the client's stream (no filter can add an error
    event to a response already sent), which the client sees as an incomplete body, never as a
    clean end. Envoy counts each (its pool cluster's ``upstream_cx_destroy_remote_with_active_rq``),
    the picker's in-flight counts return to 0, and non-streamed requests are unaffected."""
    fleet = await three_replicas_configured(start_fleet, tmp_path, "127.0.4.31")
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool"])
    for replica in range(3):
        async with http.post(f"{fleet_admin_url(fleet)}/replicas/{replica}/faults",
                             json={"cut_streams": True}) as response:
            assert response.status == 200
    results = await asyncio.gather(*(_one(http, up.url, i, max_tokens=200) for i in range(12)))
    streamed = [r for r in results if r[1]]
    plain = [r for r in results if not r[1]]
    assert [r for r in plain if r[0] != 200] == []
    assert all(status == CUT and started for status, _, started in streamed), streamed
    assert sum(s["streams_cut"] for s in await fleet_stats(http, fleet)) == len(streamed)
    assert await inflight_settles_at_zero(http, up)
    assert up.envoy is not None
    query = "filter=upstream_cx_destroy_remote_with_active_rq$"
    async with http.get(f"{up.envoy.admin_url}/stats?{query}") as response:
        stats = await response.text()
    counted = sum(int(line.rsplit(" ", 1)[1]) for line in stats.splitlines() if line.startswith("cluster."))
    assert counted == len(streamed), stats
