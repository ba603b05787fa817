"""HTTPRoute ``timeouts.backendRequest`` through ``kvgate up`` and real Envoy: each try to a replica is
bounded by it (the picker's own attempt bound never longer), then the next endpoint is tried; a
request the replicas answer in time is served."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json
from tests.e2e.test_up_routing import (
    StartUp,
    gateway_yaml,
    pods_yaml,
    pool_ref,
    pool_yaml,
    sim_fleet,
    start_up,
    wait_ready,
)

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests


async def test_backend_request_bounds_each_try_to_a_replica(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    # H100 step times (time scale 1): 300 tokens take ~2 s, 10 tokens ~0.1 s
    fleet = await sim_fleet(start_fleet, "127.0.6.21", port, "--model", "base", "--time-scale", "1.0")
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pool.yaml").write_text(pool_yaml("pool", port))
    (tmp_path / "pods.yaml").write_text(pods_yaml("pool", fleet))
    (tmp_path / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - timeouts: {{request: 30s, backendRequest: 600ms}}
      backendRefs: [{pool_ref("pool")}]
""")
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool"])
    quick = await post_json(http, up.url, {"model": "base", "prompt": "hi", "max_tokens": 10})
    assert quick.status == 200, quick.text
    started = time.monotonic()
    slow = await post_json(http, up.url, {"model": "base", "prompt": "hi", "max_tokens": 300})
    took = time.monotonic() - started
    assert slow.status == 504, slow.text  # each try cut at 0.6 s (the picker's own bound: 60 s)
    assert took < 5.0
    received = sum(stats["requests_received"] for stats in await fleet_stats(http, fleet))
    assert received >= 3  # the quick one, then the slow one on each endpoint it was tried on
    async with http.get(f"{up.admin_url}/status") as response:
        warnings = (await response.json())["applied"]["warnings"]
    assert not any("backendRequest" in warning for warning in warnings), warnings
