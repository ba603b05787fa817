"""Measures (prints, never asserts) how fast a config change reaches Envoy through ``kvgate up``'s
composition: YAML edit → applied → Envoy ACK of the new routes → first request served by the new pool.

Pool A's replicas serve only ``base-a``, pool B's only ``base-b``; requests for ``base-b`` get 404
until the route moves to pool B, so the first 200 marks the change serving. Run:
``pytest tests/e2e/test_up_latency.py -s``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from gateway.envoy_process import free_port
from gateway.up import KvgateUp
from gateway.xds import ROUTE
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import post_json
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

__all__ = ["start_up"]

pytestmark = pytest.mark.e2e
REPETITIONS = 5


def route(pool: str) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{pool_ref(pool)}]}}]
"""


async def watch_control_plane(
    up: KvgateUp, applied_before: object, acked_before: str | None, marks: dict[str, float]
) -> None:
    """Polls every ~0.5 ms beside the request loop: applied (set_snapshot done), then Envoy's ACK."""
    assert up.control is not None
    while "acked" not in marks:
        now = time.monotonic()
        if "applied" not in marks and up.control.applied is not applied_before:
            marks["applied"] = now
        if up.xds_status.nodes["kvgate"][ROUTE].acked_version != acked_before:
            marks["acked"] = now
        await asyncio.sleep(0.0005)


async def test_config_change_latency(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    fleet_a = await sim_fleet(start_fleet, "127.0.9.1", port, "--model", "base-a")
    fleet_b = await sim_fleet(start_fleet, "127.0.10.1", port, "--model", "base-b")
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pools.yaml").write_text(pool_yaml("pool-a", port) + "---" + pool_yaml("pool-b", port))
    (tmp_path / "pods.yaml").write_text(pods_yaml("pool-a", fleet_a) + "---" + pods_yaml("pool-b", fleet_b))
    route_file = tmp_path / "route.yaml"
    route_file.write_text(route("pool-a"))
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool-a", "pool-b"])
    assert up.control is not None
    rows: list[tuple[float, float, float]] = []
    current = "pool-a"
    for _ in range(REPETITIONS):
        target = "pool-b" if current == "pool-a" else "pool-a"
        model = "base-b" if target == "pool-b" else "base-a"
        applied_before = up.control.applied
        acked_before = up.xds_status.nodes["kvgate"][ROUTE].acked_version
        edited = time.monotonic()
        route_file.write_text(route(target))
        marks: dict[str, float] = {}

        watcher = asyncio.create_task(watch_control_plane(up, applied_before, acked_before, marks))
        served_at = 0.0
        while not served_at:
            reply = await post_json(http, up.url, {"model": model, "prompt": "x", "max_tokens": 1})
            if reply.status == 200:
                served_at = time.monotonic()
            assert served_at or time.monotonic() - edited < 10.0, "the change never served"
        await asyncio.wait_for(watcher, 10.0)
        applied_at, acked_at = marks["applied"], marks["acked"]
        rows.append((applied_at - edited, acked_at - applied_at, served_at - edited))
        current = target
        await asyncio.sleep(0.3)
    print()
    print("edit→applied s | applied(set_snapshot)→Envoy ACK s | edit→first request served s")
    for applied, acked, served in rows:
        print(f"{applied:.3f} | {acked:.3f} | {served:.3f}")
    medians = [statistics.median(column) for column in zip(*rows, strict=True)]
    print("median: " + " | ".join(f"{m:.3f}" for m in medians))
