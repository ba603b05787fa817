"""KV events end to end (issue 37): ``kvgate up -f DIR --sim 2`` where the pool says its engines
publish KV events (``kvgate.io/kv-events-port``): the simulated replicas publish vLLM's events over
ZMQ, the picker's index follows each replica's cache, and a replica whose publisher goes away is
marked out of step alone (its cache estimated again), while the other stays followed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from tests.e2e.test_up_routing import gateway_yaml, wait_ready

pytestmark = pytest.mark.e2e

POOL = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: pool
  annotations: {{"kvgate.io/kv-events-port": "{events}"}}
spec:
  selector: {{matchLabels: {{app: sim}}}}
  targetPorts: [{{number: 8000}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: llm}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - backendRefs: [{{group: inference.networking.k8s.io, kind: InferencePool, name: pool}}]
"""


async def endpoints(http: aiohttp.ClientSession, up: KvgateUp) -> dict[str, dict[str, Any]]:
    async with http.get(f"{up.admin_url}/debug/pools") as response:
        pools = (await response.json())["pools"]
    return {e["address"]: e for pool in pools for e in pool["endpoints"]}


async def cached_blocks(http: aiohttp.ClientSession, address: str) -> int:
    async with http.get(f"http://{address}/sim/stats") as response:
        return int((await response.json())["kv_cached_blocks"])


async def test_the_index_follows_each_replica_and_a_lost_publisher_falls_back_alone(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pool.yaml").write_text(POOL.format(events=free_port()))
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.21", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        for i in range(12):
            body = {"model": EXAMPLE_MODEL, "prompt": f"document {i} " + "lorem ipsum dolor " * 40,
                    "max_tokens": 2}
            async with http.post(f"{up.url}/v1/completions", data=json.dumps(body),
                                 headers={"content-type": "application/json"}) as response:
                assert response.status == 200
        addresses = sorted(await endpoints(http, up))
        assert len(addresses) == 2

        async def followed() -> bool:
            seen = await endpoints(http, up)
            for a in addresses:
                if seen[a]["kv_events"]["blocks"] != await cached_blocks(http, a):
                    return False
            return True

        for _ in range(100):
            if await followed():
                break
            await asyncio.sleep(0.05)
        seen = await endpoints(http, up)
        for address in addresses:
            events = seen[address]["kv_events"]
            assert events["blocks"] == await cached_blocks(http, address) > 0, (address, events)
            assert events["in_step"], (address, events)  # seq 0 seen (or replayed): in step
        async with http.post(f"http://{addresses[0]}/sim/kv-events/stop") as response:
            assert response.status == 200
        for _ in range(100):
            if not (await endpoints(http, up))[addresses[0]]["kv_events"]["in_step"]:
                break
            await asyncio.sleep(0.05)
        seen = await endpoints(http, up)
        assert not seen[addresses[0]]["kv_events"]["in_step"]
        assert seen[addresses[1]]["kv_events"]["in_step"]
        async with http.get(f"{up.admin_url}/metrics") as response:
            page = await response.text()
        assert f'kvgate_kv_events_in_step{{endpoint="{addresses[1]}",pool="default/pool"}} 1.0' in page
    finally:
        await up.stop()


async def test_engines_that_connect_to_the_pickers_bound_socket_are_followed_by_topic(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """llm-d's topology (``kvgate.io/kv-events-bind``): the picker binds one SUB socket, the
    replicas' publishers connect to it (``kvgate sim --kv-events-connect``), each batch's topic
    ``kv@<pod-ip>@<model>`` names its endpoint; replay from each replica's own socket."""
    bind, replay = free_port(), free_port()
    pool = POOL.format(events=0).replace(
        '{"kvgate.io/kv-events-port": "0"}',
        f'{{"kvgate.io/kv-events-bind": "tcp://127.0.0.1:{bind}", '
        f'"kvgate.io/kv-events-replay-port": "{replay}"}}')
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pool.yaml").write_text(pool)
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.61", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        addresses = sorted(await endpoints(http, up))
        for address in addresses:  # each publisher connected: its batches arrive (PUB drops before)
            for attempt in range(100):
                if (await endpoints(http, up))[address]["kv_events"]["batches"]:
                    break
                body = {"model": EXAMPLE_MODEL, "prompt": f"warm up {attempt} " * 30, "max_tokens": 1}
                async with http.post(f"http://{address}/v1/completions", json=body) as response:
                    assert response.status == 200
                await asyncio.sleep(0.05)
        for i in range(12):
            body = {"model": EXAMPLE_MODEL, "prompt": f"document {i} " + "lorem ipsum dolor " * 40,
                    "max_tokens": 2}
            async with http.post(f"{up.url}/v1/completions", data=json.dumps(body),
                                 headers={"content-type": "application/json"}) as response:
                assert response.status == 200
        for _ in range(100):
            seen = await endpoints(http, up)
            cached = [await cached_blocks(http, a) for a in addresses]
            if [seen[a]["kv_events"]["blocks"] for a in addresses] == cached:
                break
            await asyncio.sleep(0.05)
        seen = await endpoints(http, up)
        for address in addresses:
            events = seen[address]["kv_events"]
            assert events["blocks"] == await cached_blocks(http, address) > 0, (address, events)
            assert events["in_step"], (address, events)
    finally:
        await up.stop()


async def test_with_workers_the_picker_that_cannot_bind_follows_the_engines_through_redis(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """``kvgate up --workers 2`` in llm-d's topology: only one process can bind the address the
    engines connect to; the other worker follows their caches through the relay on Redis."""
    bind, replay = free_port(), free_port()
    pool = POOL.format(events=0).replace(
        '{"kvgate.io/kv-events-port": "0"}',
        f'{{"kvgate.io/kv-events-bind": "tcp://127.0.0.1:{bind}", '
        f'"kvgate.io/kv-events-replay-port": "{replay}"}}')
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pool.yaml").write_text(pool)
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=2, workers=2,
                            sim_hosts_from="127.0.9.81", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        assert up.workers is not None
        [worker_admin] = up.workers.admin_urls
        addresses = sorted(await endpoints(http, up))
        for i in range(12):
            body = {"model": EXAMPLE_MODEL, "prompt": f"document {i} " + "lorem ipsum dolor " * 40,
                    "max_tokens": 2}
            async with http.post(f"{up.url}/v1/completions", data=json.dumps(body),
                                 headers={"content-type": "application/json"}) as response:
                assert response.status == 200

        async def worker_view() -> dict[str, Any]:
            async with http.get(f"{worker_admin}/debug/pools") as response:
                pools = (await response.json())["pools"]
            return {e["address"]: e["kv_events"] for pool in pools for e in pool["endpoints"]}

        for _ in range(100):
            cached = [await cached_blocks(http, a) for a in addresses]
            seen = await worker_view()
            if [seen[a]["blocks"] for a in addresses] == cached and all(cached):
                break
            await asyncio.sleep(0.05)
        seen = await worker_view()
        for address in addresses:
            assert seen[address]["blocks"] == await cached_blocks(http, address) > 0, (address, seen)
            assert seen[address]["in_step"], (address, seen)
    finally:
        await up.stop()
