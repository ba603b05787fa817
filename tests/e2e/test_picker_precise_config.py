"""llm-d's precise prefix-cache routing config (its guide's EndpointPickerConfig, ``--config-text``)
on ``kvgate picker``: the picker subscribes to each Pod's publisher at the port its
``kvEventsConfig.podDiscoveryConfig`` names (``discoverPods``, llm-d's default; the bound topology of
the guide's ``zmqEndpoint`` is unit-tested: a late joiner there has no replay to fill its gap and
waits out the resync), the tokenizer is where its ``tokenizersPoolConfig`` says, and a prefix that
reached one replica around the gateway (so kvgate's own index never saw it) draws the next requests
there through real Envoy: only the engines' events can tell."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.controlplane.envoy_config import ExtProcSettings
from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import EnvoyProcess, free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import KVGATE, MODEL, envoy_in_front, fleet_stats, post_json, wait_until
from tests.policies.test_epp_config import LLM_D_PRECISE

pytestmark = pytest.mark.e2e

TOKENIZER = Path(__file__).resolve().parents[2] / "simulator" / "data" / "tokenizer.json"


def precise_config(events: int) -> str:
    """The guide's config discovering each Pod's publisher at ``events``, its model's tokenizer
    mapped to the simulated model's file (llm-d's ``local.modelTokenizerMap``)."""
    config = yaml.safe_load(LLM_D_PRECISE)
    parameters = config["plugins"][1]["parameters"]
    parameters["kvEventsConfig"] = {"topicFilter": "kv@", "discoverPods": True,
                                    "podDiscoveryConfig": {"socketPort": events}}
    parameters["tokenProcessorConfig"]["blockSize"] = 16  # the simulator's block size
    parameters["indexerConfig"]["tokenizersPoolConfig"] = {
        "modelName": MODEL, "local": {"modelTokenizerMap": {MODEL: str(TOKENIZER)}}}
    return str(yaml.safe_dump(config))


async def test_the_precise_config_routes_on_what_the_engines_report(
    tmp_path: Path,
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    port, events = free_port(), free_port()
    fleet = await start_fleet(3, 0.05, [
        "--port", str(port), "--hosts-from", "127.0.14.1", "--model", MODEL, "--admin-port", "0",
        "--kv-events-port", str(events), "--tokenizer", str(TOKENIZER),
    ])
    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump({"pools": [{"name": "llama", "endpoints": fleet.addresses}]}))
    child = ChildProcess([
        *KVGATE, "picker", "--pools", str(pools), "--grpc-port", "0", "--admin-port", "0",
        "--grpc-health-port", "0", "--secure-serving=false", "--log-level", "WARNING",
        "--config-text", precise_config(events),
    ], name="kvgate picker --config-text")
    await child.start()
    try:
        ready = await child.wait_for_line(r"kvgate-picker ready grpc=\S+:(\d+) admin=(\S+)", 30)
        admin = ready.group(2)
        url = await envoy_in_front(start_envoy, int(ready.group(1)), ExtProcSettings(),
                                   ((PoolBackend("llama"),), ()))

        async def followed(address: str) -> bool:
            async with http.get(f"{admin}/debug/pools") as response:
                [pool] = (await response.json())["pools"]
            events = {e["address"]: e for e in pool["endpoints"]}[address].get("kv_events") or {}
            return bool(events.get("batches")) and bool(events.get("in_step"))

        for address in fleet.addresses:  # each publisher followed, in step (replayed if joined late)
            for attempt in range(200):
                if await followed(address):
                    break
                body = {"model": MODEL, "prompt": f"warm up {attempt} " * 20, "max_tokens": 1}
                async with http.post(f"http://{address}/v1/completions", json=body) as response:
                    assert response.status == 200
                await asyncio.sleep(0.05)
            assert await followed(address), f"no KV events from {address}"

        document = "The quarterly report of the northern region, section by section. " * 40
        chosen = fleet.addresses[1]
        body = {"model": MODEL, "prompt": document + "Summarise it.", "max_tokens": 2}
        async with http.post(f"http://{chosen}/v1/completions", json=body) as response:  # (no gateway)
            assert response.status == 200

        async def stored() -> bool:
            async with http.get(f"{admin}/debug/pools") as response:
                [pool] = (await response.json())["pools"]
            found = {e["address"]: e for e in pool["endpoints"]}[chosen]
            return int(found["kv_events"]["blocks"]) >= len(document) // 4 // 16

        await wait_until(stored, "the document's blocks reported by the replica that computed them")
        before = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        for question in ("Who wrote it?", "What changed?", "List the risks.", "Which section is longest?"):
            body = {"model": MODEL, "prompt": document + question, "max_tokens": 2}
            reply = await post_json(http, url, body)
            assert reply.status == 200, reply.text
        after = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        moved = [b - a for a, b in zip(before, after, strict=True)]
        assert moved[1] == 4, moved  # all to the replica whose engine reported the document
    finally:
        await child.stop()
