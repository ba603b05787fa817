"""A burst of realtime sessions through ``kvgate up`` spreads over the pool's replicas (before the
spreading, 20 sessions opened at once landed 13 / 0 / 0 / 7 on four idle replicas)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, wait_until
from tests.e2e.test_up_routing import (
    StartUp,
    gateway_yaml,
    pods_yaml,
    pool_ref,
    pool_yaml,
    start_up,
    wait_ready,
)

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests


async def test_a_burst_of_sessions_spreads_over_the_replicas(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    fleet = await start_fleet(replicas=4, time_scale=0.01, extra_args=[
        "--port", str(port), "--hosts-from", "127.0.6.51", "--admin-port", "0", "--model", "base"])
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "pool.yaml").write_text(pool_yaml("pool", port))
    (config / "pods.yaml").write_text(pods_yaml("pool", fleet))
    (config / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{pool_ref("pool")}]}}]
""")
    up = await start_up(config)
    await wait_ready(http, up, ["pool"])

    async def all_healthy() -> bool:  # (a replica still starting would take no session)
        async with http.get(f"{up.admin_url}/debug/pools") as response:
            endpoints = (await response.json())["pools"][0]["endpoints"]
        return len(endpoints) == 4 and all(e["healthy"] and e["waiting"] is not None for e in endpoints)

    await wait_until(all_healthy, "the four replicas healthy", timeout_s=15.0)

    async def session() -> aiohttp.ClientWebSocketResponse:
        socket = await http.ws_connect(f"{up.url}/v1/realtime")
        assert (await socket.receive_json(timeout=5))["type"] == "session.created"
        return socket

    sockets = await asyncio.gather(*(session() for _ in range(20)))
    try:
        counts = [stats["realtime_sessions"] for stats in await fleet_stats(http, fleet)]
        assert sorted(counts) == [5, 5, 5, 5], counts
    finally:
        for socket in sockets:
            await socket.close()
