"""``kvgate up --kubernetes`` following a cluster, through real Envoy and the simulated fleet.

The cluster is the FAKE API server of tests/kube_api_fake.py (no real one can run here); the
fleet's replicas play the Pods (one loopback address each, as Pod IPs). Manifests applied to the
server become traffic; a Pod turning not-ready stops getting requests within a second of the watch
event; scaling from 4 to 8 Pods sends requests to the new ones within a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from gateway.processes.envoy_process import free_port
from gateway.up import KvgateUp, UpOptions
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json, wait_until
from tests.gateway.controlplane.kubernetes.test_provider import GATEWAY, POOL, ROUTE
from tests.kube_api_fake import FakeApiServer

pytestmark = pytest.mark.e2e
FIRST_IP = "127.0.7."


def _pod(index: int, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"llm-{index}", "labels": {"app": "llm"}},
        "status": {"phase": "Running", "podIP": f"{FIRST_IP}{index + 1}",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


@pytest.fixture
async def cluster() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    await server.start()
    yield server
    await server.stop()


async def _received(http: aiohttp.ClientSession, fleet: SimFleet) -> list[int]:
    return [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]


async def test_the_gateway_follows_the_cluster(
    cluster: FakeApiServer, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    fleet = await start_fleet(
        replicas=8, time_scale=0.01,
        extra_args=["--port", str(port), "--hosts-from", f"{FIRST_IP}1", "--admin-port", "0",
                    "--model", "base"],
    )
    pool = {**POOL, "spec": {**POOL["spec"], "targetPorts": [{"number": port}]}}
    for obj in (GATEWAY, pool, ROUTE, *(_pod(i) for i in range(4))):
        await cluster.apply(dict(obj))
    up = KvgateUp(UpOptions(kubernetes=True, kube_api=cluster.url, namespace="default", port=free_port(),
                            admin_port=0, sim=0))
    try:
        await up.start()
        body = {"model": "base", "prompt": "hello", "max_tokens": 2}

        async def served() -> bool:
            return (await post_json(http, up.url, body)).status == 200

        await wait_until(served, "traffic through the cluster's configuration", timeout_s=15.0)

        async def send(count: int) -> None:
            replies = await asyncio.gather(*(post_json(http, up.url, body) for _ in range(count)))
            assert [r.status for r in replies if r.status != 200] == []

        # Pod 0 turns not-ready: within a second of the event it gets nothing more.
        await cluster.apply(_pod(0, ready=False))
        await asyncio.sleep(1.0)
        before = await _received(http, fleet)
        await send(40)
        after = await _received(http, fleet)
        assert after[0] == before[0], (before, after)
        assert sum(after) - sum(before) == 40

        # Scaling from 4 to 8 Pods: the new ones get requests within a second.
        for index in range(4, 8):
            await cluster.apply(_pod(index))

        async def new_pods_used() -> bool:
            await send(16)
            return all(count > 0 for count in (await _received(http, fleet))[4:])

        await wait_until(new_pods_used, "the new Pods receive requests", timeout_s=5.0)
        async with http.get(f"{up.admin_url}/status") as response:
            status = await response.json()
        assert status["config"]["directory"] == "kubernetes:default"

        # this replica holds the status Lease and writes what kubectl shows
        async def route_status() -> bool:
            route = cluster.get_object("httproutes", "r")
            return bool(route and route.get("status", {}).get("parents"))

        await wait_until(route_status, "the HTTPRoute's status written back", timeout_s=10.0)
        gateway = cluster.get_object("gateways", "gw")
        assert gateway is not None
        assert {c["type"]: c["status"] for c in gateway["status"]["conditions"]}["Programmed"] == "True"
        lease = cluster.get_object("leases", "kvgate-status-writer")
        assert lease is not None
    finally:
        await up.stop()
