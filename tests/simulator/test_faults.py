"""Fault injection: the Faults value, injected 500s, slowdown and delayed metrics."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from kvgate.simulator.faults import ErrorInjector, Faults
from tests.simulator.conftest import MODEL, FleetFactory


def test_faults_update_validates() -> None:
    faults = Faults().updated({"error_rate": "0.5", "metrics_frozen": "true", "slowdown": 2})
    assert faults == Faults(error_rate=0.5, slowdown=2.0, metrics_frozen=True)
    with pytest.raises(ValueError, match="unknown fault"):
        Faults().updated({"colour": 1})
    with pytest.raises(ValueError, match="error_rate"):
        Faults().updated({"error_rate": 2})
    with pytest.raises(ValueError, match="number"):
        Faults().updated({"slowdown": "fast"})


def test_error_injector_is_seeded() -> None:
    faults = Faults(error_rate=0.3)
    first = [ErrorInjector(7).should_fail(faults) for _ in range(1)]
    a, b = ErrorInjector(7), ErrorInjector(7)
    assert [a.should_fail(faults) for _ in range(200)] == [b.should_fail(faults) for _ in range(200)]
    assert first is not None
    assert not ErrorInjector(1).should_fail(Faults())
    assert all(ErrorInjector(1).should_fail(Faults(error_rate=1.0)) for _ in range(10))


async def test_error_rate_one_answers_500(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    async with http.post(url + "/sim/faults", json={"error_rate": 1.0}) as response:
        assert response.status == 200
    async with http.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x"}) as response:
        assert response.status == 500
        body = await response.json()
    assert body["error"]["code"] == 500
    assert body["error"]["type"] == "InternalServerError"
    async with http.get(url + "/sim/stats") as response:
        assert (await response.json())["errors_injected"] == 1
    async with http.post(url + "/sim/faults", json={"error_rate": 0}) as response:
        assert response.status == 200
    async with http.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x"}) as response:
        assert response.status == 200


async def test_bad_fault_body_is_400(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    async with http.post(fleet.urls[0] + "/sim/faults", json={"error_rate": 3}) as response:
        assert response.status == 400
    async with http.get(fleet.urls[0] + "/sim/faults") as response:
        assert (await response.json())["error_rate"] == 0.0


async def test_slowdown_stretches_simulated_latency(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet()
    url = fleet.urls[0]
    body = {"model": MODEL, "prompt": "abcd", "max_tokens": 3}
    async with http.post(url + "/v1/completions", json=body):
        pass
    async with http.post(url + "/sim/faults", json={"slowdown": 3.0}):
        pass
    async with http.post(url + "/v1/completions", json=body):
        pass
    async with http.get(url + "/metrics") as response:
        text = await response.text()
    e2e_sum = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("vllm:e2e_request_latency_seconds_sum")
    )
    step = 0.0057527  # at least 3 steps each, the second request 3x slower
    assert e2e_sum >= 3 * step + 9 * step


async def test_metrics_delay(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet(faults=Faults(metrics_delay_s=0.05))
    async with http.get(fleet.urls[0] + "/metrics") as response:
        assert response.status == 200
    assert fleet.replicas[0].faults.metrics_delay_s == 0.05


async def test_hang_accepts_inference_and_never_answers_while_metrics_answer(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(faults=Faults(hang=True))
    url = fleet.urls[0]
    body = {"model": fleet.replicas[0].base_model, "prompt": "hi", "max_tokens": 2}
    request = asyncio.create_task(http.post(url + "/v1/completions", json=body))
    await asyncio.sleep(0.3)
    assert not request.done()  # accepted, no status line
    async with http.get(url + "/metrics") as response:
        assert response.status == 200
    assert fleet.replicas[0].counters.hung == 1
    fleet.replicas[0].set_faults({"hang": False})  # cleared: the held request goes on, served
    async with await asyncio.wait_for(request, 10) as response:
        assert response.status == 200


def test_hang_is_a_boolean_fault_field() -> None:
    assert Faults().updated({"hang": "true"}).hang is True
    with pytest.raises(ValueError, match="boolean"):
        Faults().updated({"hang": 2.5})


async def test_cut_streams_aborts_a_streamed_response_halfway(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(faults=Faults(cut_streams=True))
    url = fleet.urls[0]
    model = fleet.replicas[0].base_model
    streamed = {"model": model, "prompt": "hi", "max_tokens": 16, "stream": True}
    async with http.post(url + "/v1/completions", json=streamed) as response:
        assert response.status == 200  # the response had started
        received = bytearray()

        async def read_all() -> None:
            async for chunk in response.content.iter_any():
                received.extend(chunk)

        with pytest.raises(aiohttp.ClientPayloadError):  # and ends without the end of its body
            await read_all()
    assert 8 <= received.count(b"data: {") < 16
    assert b"[DONE]" not in received
    assert fleet.replicas[0].counters.streams_cut == 1
    plain = {"model": model, "prompt": "hi", "max_tokens": 16}
    async with http.post(url + "/v1/completions", json=plain) as response:
        assert response.status == 200
        assert (await response.json())["object"] == "text_completion"
