"""Disaggregated prefill and decode through ``kvgate up`` and real Envoy (issue 33): the picker picks
both halves, runs the prefill itself (vLLM's NixlConnector protocol, spoken by the simulator) and
releases the request to its decode endpoint with the prefill's ``kv_transfer_params``; the response
streams from the decode endpoint through Envoy. A failing prefill falls back to aggregated serving;
a stopped decode replica loses no request that had not started; a short prompt is not split."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import UpOptions
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_admin_url, fleet_stats
from tests.e2e.test_up_faults import ROUTE, inflight_settles_at_zero
from tests.e2e.test_up_routing import gateway_yaml, wait_ready

pytestmark = pytest.mark.e2e

ROLES = ("prefill", "prefill", "decode", "decode")
LONG = " ".join(f"w{i}" for i in range(2400))  # ~1,800 prompt tokens: over the pd profile's threshold


async def pd_fleet_configured(
    start_fleet: Callable[..., Awaitable[SimFleet]], directory: Path, first_ip: str,
    execution: str = "picker",
) -> SimFleet:
    """Two prefill and two decode replicas, and one pool of them (profile pd) for ``kvgate up``."""
    port = free_port()
    fleet = await start_fleet(
        replicas=0, time_scale=0.01,
        extra_args=["--prefill", "2", "--decode", "2", "--port", str(port), "--hosts-from", first_ip,
                    "--admin-port", "0", "--model", "base"],
    )
    pool = f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: pool, annotations: {{kvgate.io/profile: pd, kvgate.io/pd-execution: {execution}}}}}
spec:
  selector: {{matchLabels: {{app: pool}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
"""
    pods = [
        f"""
apiVersion: v1
kind: Pod
metadata: {{name: pool-{i}, labels: {{app: pool, llm-d.ai/role: {role}}}}}
status: {{phase: Running, podIP: {address.rpartition(":")[0]}}}
"""
        for i, (address, role) in enumerate(zip(fleet.addresses, ROLES, strict=True))
    ]
    (directory / "gateway.yaml").write_text(gateway_yaml())
    (directory / "pool.yaml").write_text(pool + "---" + "---".join(pods))
    (directory / "route.yaml").write_text(ROUTE)
    return fleet


async def _request(
    http: aiohttp.ClientSession, url: str, index: int, *, prompt: str = LONG, chat: bool = False,
    stream: bool = False, max_tokens: int = 12,
) -> tuple[int, dict[str, Any] | None, bool]:
    """(status, usage, whether the response had started); a body cut short is status 599."""
    body: dict[str, Any] = {"model": "base", "max_tokens": max_tokens, "stream": stream}
    text = f"{index} {prompt}"
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if stream:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    started, raw = False, b""
    headers = {"content-type": "application/json"}
    async with http.post(url + path, data=json.dumps(body), headers=headers) as r:
        try:
            async for chunk in r.content.iter_any():
                started = True
                raw += chunk
        except aiohttp.ClientPayloadError:
            return 599, None, started
        if r.status != 200:
            return r.status, None, started
    if not stream:
        return 200, json.loads(raw)["usage"], started
    events = [line.removeprefix("data: ") for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    if events[-1:] != ["[DONE]"] or any('"error"' in e for e in events):
        return 599, None, started
    usage = [json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage")]
    return 200, usage[-1] if usage else None, started


def _total(stats: list[dict[str, Any]], key: str, role: str) -> int:
    return sum(int(s[key]) for s in stats if s["role"] == role)


async def _metric(http: aiohttp.ClientSession, up: KvgateUp, line_start: str) -> float:
    async with http.get(f"{up.admin_url}/metrics") as response:
        page = await response.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(line_start))


@pytest.fixture
async def pd_up(
    tmp_path: Path, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
    request: pytest.FixtureRequest,
) -> Any:
    fleet = await pd_fleet_configured(start_fleet, tmp_path, request.param)
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=0))
    await up.start()
    try:
        await wait_ready(http, up, ["pool"])
        yield fleet, up
    finally:
        await up.stop()


@pytest.mark.parametrize("pd_up", ["127.0.5.1"], indirect=True)
async def test_long_prompts_are_prefilled_on_prefill_replicas_and_decoded_on_decode_replicas(
    pd_up: tuple[SimFleet, KvgateUp], http: aiohttp.ClientSession,
) -> None:
    fleet, up = pd_up
    results = await asyncio.gather(*(_request(http, up.url, i, chat=i % 4 >= 2, stream=i % 2 == 1)
                                     for i in range(16)))
    assert [status for status, _, _ in results] == [200] * 16
    for _, usage, _ in results:
        assert usage is not None  # streams too: include_usage reached the decode replica
        assert usage["completion_tokens"] == 12
        assert usage["prompt_tokens_details"]["cached_tokens"] > 1000  # its prompt's KV was received
    stats = await fleet_stats(http, fleet)
    assert _total(stats, "remote_prefills", "prefill") == 16
    assert _total(stats, "remote_decodes", "decode") == 16
    assert _total(stats, "requests_served", "decode") == 16
    assert sum(int(s["kv_transfers_failed"]) + int(s["kv_held"]) for s in stats) == 0  # all read
    assert await _metric(http, up, 'kvgate_prefill_total{outcome="ok"') == 16
    assert await inflight_settles_at_zero(http, up)  # both halves' bookkeeping ended

    short = await asyncio.gather(*(_request(http, up.url, 100 + i, prompt="hi there") for i in range(6)))
    assert [status for status, _, _ in short] == [200] * 6
    after = await fleet_stats(http, fleet)
    assert _total(after, "remote_prefills", "prefill") == 16  # the decider kept short prompts whole
    assert _total(after, "requests_served", "decode") == 22


@pytest.mark.parametrize("pd_up", ["127.0.5.11"], indirect=True)
async def test_a_failing_prefill_falls_back_to_aggregated_serving_on_the_decode_replica(
    pd_up: tuple[SimFleet, KvgateUp], http: aiohttp.ClientSession,
) -> None:
    fleet, up = pd_up
    for replica in (0, 1):
        faults = f"{fleet_admin_url(fleet)}/replicas/{replica}/faults"
        async with http.post(faults, json={"error_rate": 1.0}) as r:
            assert r.status == 200
    results = await asyncio.gather(*(_request(http, up.url, i, stream=i % 2 == 1) for i in range(8)))
    assert [status for status, _, _ in results] == [200] * 8  # never a lost request
    stats = await fleet_stats(http, fleet)
    assert _total(stats, "remote_decodes", "decode") == 0
    assert _total(stats, "requests_served", "decode") == 8
    assert await _metric(http, up, 'kvgate_prefill_total{outcome="failed"') == 8
    assert await inflight_settles_at_zero(http, up)


@pytest.mark.parametrize("pd_up", ["127.0.5.21"], indirect=True)
async def test_a_stopped_decode_replica_loses_no_request_that_had_not_started(
    pd_up: tuple[SimFleet, KvgateUp], http: aiohttp.ClientSession,
) -> None:
    fleet, up = pd_up
    gate = asyncio.Semaphore(12)

    async def limited(index: int) -> tuple[int, dict[str, Any] | None, bool]:
        async with gate:
            return await _request(http, up.url, index, stream=index % 2 == 1, max_tokens=40)

    tasks = [asyncio.create_task(limited(i)) for i in range(120)]
    await asyncio.sleep(0.4)  # mid-run
    async with http.post(f"{fleet_admin_url(fleet)}/replicas/3/stop") as response:
        assert response.status == 200
    results = await asyncio.gather(*tasks)
    lost = [(status, started) for status, _, started in results if status != 200 and not started]
    assert lost == []  # Envoy retried each one on the other decode replica
    assert sum(1 for status, _, _ in results if status == 200) >= 100
    assert await inflight_settles_at_zero(http, up)


@pytest.mark.parametrize("pd_up", ["127.0.5.31"], indirect=True)
async def test_a_client_gone_during_the_prefill_frees_both_sides(
    pd_up: tuple[SimFleet, KvgateUp], http: aiohttp.ClientSession,
) -> None:
    """The prefill replicas made 1,000 times slower: clients that give up while their prefill runs
    leave nothing in flight, in the picker (both halves) or on the prefill replicas (the picker's
    prefill call is cancelled, and the replica aborts the request)."""
    fleet, up = pd_up
    for replica in (0, 1):
        faults = f"{fleet_admin_url(fleet)}/replicas/{replica}/faults"
        async with http.post(faults, json={"slowdown": 1000.0}) as r:
            assert r.status == 200
    tasks = [asyncio.create_task(_request(http, up.url, i)) for i in range(6)]

    async def prefill_side(key: str) -> int:
        return _total(await fleet_stats(http, fleet), key, "prefill")

    for _ in range(100):
        if await prefill_side("in_flight") == 6:
            break
        await asyncio.sleep(0.05)
    assert await prefill_side("in_flight") == 6  # every request is in its prefill
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert await inflight_settles_at_zero(http, up)
    for _ in range(100):
        if await prefill_side("in_flight") == 0:
            break
        await asyncio.sleep(0.05)
    assert await prefill_side("in_flight") == 0
    assert await prefill_side("requests_aborted") == 6
    stats = await fleet_stats(http, fleet)
    assert _total(stats, "requests_received", "decode") == 0  # none went on to a decode replica


TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "simulator" / "data"


async def test_a_disaggregated_pool_routes_on_the_engines_kv_events(
    tmp_path: Path, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    """The pd profile's halves route on the engines' KV events where the pool follows them: a document
    one decode replica computed outside the gateway (kvgate's own index never saw it) draws the next
    requests for it to that replica, and the decider, seeing it cached there, sends no prefill hop.
    (Without the engines' events the decode pick went by load and every one was split.)"""
    port, events = free_port(), free_port()
    fleet = await start_fleet(
        replicas=0, time_scale=0.01,
        extra_args=["--prefill", "2", "--decode", "2", "--port", str(port), "--hosts-from", "127.0.5.41",
                    "--admin-port", "0", "--model", "base", "--kv-events-port", str(events),
                    "--tokenizer", str(TOKENIZER_DIR / "tokenizer.json")],
    )
    annotations = (f'{{kvgate.io/profile: pd, kvgate.io/kv-events-port: "{events}", '
                   f'kvgate.io/tokenizer: "{TOKENIZER_DIR}"}}')
    pool = f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: pool, annotations: {annotations}}}
spec:
  selector: {{matchLabels: {{app: pool}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
"""
    pods = [f"""
apiVersion: v1
kind: Pod
metadata: {{name: pool-{i}, labels: {{app: pool, llm-d.ai/role: {role}}}}}
status: {{phase: Running, podIP: {address.rpartition(":")[0]}}}
""" for i, (address, role) in enumerate(zip(fleet.addresses, ROLES, strict=True))]
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pool.yaml").write_text(pool + "---" + "---".join(pods))
    (tmp_path / "route.yaml").write_text(ROUTE)
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=0))
    await up.start()
    try:
        await wait_ready(http, up, ["pool"])

        async def followed() -> dict[str, dict[str, Any]]:
            async with http.get(f"{up.admin_url}/debug/pools") as response:
                [found] = (await response.json())["pools"]
            return {e["address"]: e.get("kv_events") or {} for e in found["endpoints"]}

        for address in fleet.addresses:  # each publisher followed, in step (replayed if joined late)
            for attempt in range(200):
                seen = (await followed())[address]
                if seen.get("batches") and seen.get("in_step"):
                    break
                body = {"model": "base", "prompt": f"warm up {attempt} " * 20, "max_tokens": 1}
                async with http.post(f"http://{address}/v1/completions", json=body) as response:
                    assert response.status == 200
                await asyncio.sleep(0.05)
        decode = fleet.addresses[3]
        async with http.post(f"http://{decode}/v1/completions",  # around the gateway
                             json={"model": "base", "prompt": LONG, "max_tokens": 1}) as response:
            assert response.status == 200
        for _ in range(200):
            if int((await followed())[decode].get("blocks") or 0) >= 100:
                break
            await asyncio.sleep(0.05)
        assert int((await followed())[decode]["blocks"]) >= 100, await followed()
        before = await fleet_stats(http, fleet)
        for question in range(4):  # the document, then a question of its own
            body = {"model": "base", "prompt": f"{LONG} question {question}", "max_tokens": 2}
            async with http.post(f"{up.url}/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
        after = await fleet_stats(http, fleet)
        assert _total(after, "remote_prefills", "prefill") == _total(before, "remote_prefills", "prefill")
        served = [int(b["requests_served"]) - int(a["requests_served"])
                  for a, b in zip(before, after, strict=True)]
        assert served[3] == 4, served  # all on the decode replica that holds the document
    finally:
        await up.stop()
