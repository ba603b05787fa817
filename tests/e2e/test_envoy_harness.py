"""Harness proof: real Envoy + config builders + ORIGINAL_DST, driven by a STAND-IN picker.

The stand-in (tests/e2e/standin_picker.py) only routes to one fixed upstream; the real extproc-based
acceptance tests of issue 3 replace it once extproc/ lands.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.controlplane.envoy_config import GatewayConfig, RouteSpec, static_bootstrap
from kvgate.gateway.processes.envoy_process import EnvoyProcess, free_port
from kvgate.policies.types import FailureMode
from tests.e2e.conftest import EchoUpstream, SimFleet
from tests.e2e.standin_picker import RunningPicker, start_standin_picker

pytestmark = pytest.mark.e2e


@dataclass
class Gateway:
    url: str
    envoy: EnvoyProcess
    picker: RunningPicker
    picked: EchoUpstream
    fallback: EchoUpstream


@pytest.fixture
async def gateway(
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    start_echo_upstream: Callable[[], Awaitable[EchoUpstream]],
) -> AsyncIterator[Gateway]:
    picked, fallback = await start_echo_upstream(), await start_echo_upstream()
    picker = await start_standin_picker(picked.address)
    port = free_port()
    config = GatewayConfig(
        listen_port=port,
        admin_port=free_port(),
        picker_addresses=(("127.0.0.1", picker.port),),
        pools=(
            PoolBackend("closed"),
            PoolBackend("open", FailureMode.FAIL_OPEN, (fallback.address,)),
        ),
        routes=(RouteSpec("to-open", "open", "/open/"), RouteSpec("to-closed", "closed", "/")),
    )
    envoy = await start_envoy(static_bootstrap(config))
    try:
        yield Gateway(f"http://127.0.0.1:{port}", envoy, picker, picked, fallback)
    finally:
        await picker.stop()


async def test_full_duplex_post_reaches_the_picked_upstream(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    body = b'{"model": "m", "prompt": "' + b"x" * 200_000 + b'"}'
    forged = {"x-gateway-destination-endpoint": gateway.fallback.address}
    async with http.post(f"{gateway.url}/v1/completions", data=body, headers=forged) as response:
        assert response.status == 200
        echoed = await response.json()
    assert echoed["port"] == gateway.picked.port
    assert echoed["body_len"] == len(body)
    assert echoed["headers"]["x-gateway-destination-endpoint"] == gateway.picked.address
    (stream,) = gateway.picker.picker.streams
    assert stream.pool == "closed"
    assert stream.request_body_mode == "FULL_DUPLEX_STREAMED"
    assert stream.body == body
    assert "x-gateway-destination-endpoint" not in stream.request_headers
    assert stream.served == gateway.picked.address


async def test_bodyless_get_is_routed(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway.url}/v1/models") as response:
        assert response.status == 200
        assert (await response.json())["port"] == gateway.picked.port
    assert gateway.picker.picker.streams[0].kinds[0] == "request_headers"


async def test_sse_passes_through(gateway: Gateway, http: aiohttp.ClientSession) -> None:
    async with http.post(f"{gateway.url}/v1/completions?sse=5", data=b"{}") as response:
        assert response.status == 200
        text = await response.text()
    assert text.count("data: ") == 6
    assert text.rstrip().endswith("data: [DONE]")


async def test_fail_open_pool_uses_the_picker_while_it_is_up(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{gateway.url}/open/v1/completions", data=b'{"model": "m"}') as response:
        assert response.status == 200
        assert (await response.json())["port"] == gateway.picked.port
    (stream,) = gateway.picker.picker.streams
    assert stream.pool == "open"
    assert stream.request_body_mode == "BUFFERED"


async def test_picker_down_fail_open_serves_and_fail_close_refuses(
    gateway: Gateway, http: aiohttp.ClientSession
) -> None:
    await gateway.picker.stop()
    for _ in range(3):
        async with http.post(f"{gateway.url}/open/v1/completions", data=b'{"model": "m"}') as response:
            assert response.status == 200
            assert (await response.json())["port"] == gateway.fallback.port
    async with http.post(f"{gateway.url}/v1/completions", data=b'{"model": "m"}') as response:
        assert response.status >= 500


async def test_simulator_fleet_behind_envoy(
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    fleet = await start_fleet(replicas=2, time_scale=0.01)
    assert len(fleet.addresses) == 2
    picker = await start_standin_picker(fleet.addresses[1])
    port = free_port()
    config = GatewayConfig(
        listen_port=port, admin_port=free_port(),
        picker_addresses=(("127.0.0.1", picker.port),), pools=(PoolBackend("sim"),),
    )
    await start_envoy(static_bootstrap(config))
    try:
        async with http.get(f"http://127.0.0.1:{port}/v1/models") as response:
            assert response.status == 200
            model = (await response.json())["data"][0]["id"]
        request = {"model": model, "prompt": "hello there", "max_tokens": 4}
        async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=request) as response:
            assert response.status == 200, await response.text()
            assert (await response.json())["usage"]["completion_tokens"] > 0
        assert picker.picker.streams[-1].served == fleet.addresses[1]
    finally:
        await picker.stop()
