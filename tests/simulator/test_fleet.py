"""The fleet: several replicas in one loop, the admin server, stop/restart, loopback addresses."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from kvgate.simulator.fleet import FleetConfig, parse_ready_line, ready_lines
from tests.simulator.conftest import MODEL, FleetFactory, fleet_config


async def test_replicas_get_distinct_ports(make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet(3)
    assert len(set(fleet.urls)) == 3
    for url in fleet.urls:
        async with http.post(
            url + "/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 1}
        ) as r:
            assert r.status == 200
    assert [replica.counters.requests_served for replica in fleet.replicas] == [1, 1, 1]


def test_addresses() -> None:
    config = fleet_config(3, port=9000)
    assert [config.address_of(i) for i in range(3)] == [
        ("127.0.0.1", 9000),
        ("127.0.0.1", 9001),
        ("127.0.0.1", 9002),
    ]
    hosts = FleetConfig(replicas=config.replicas, port=9000, hosts_from="127.0.1.1")
    assert [hosts.address_of(i) for i in range(3)] == [
        ("127.0.1.1", 9000),
        ("127.0.1.2", 9000),
        ("127.0.1.3", 9000),
    ]
    assert fleet_config(2, port=0).address_of(1) == ("127.0.0.1", 0)


def test_ready_line_round_trip() -> None:
    lines = ready_lines(["http://127.0.0.1:1", "http://127.0.0.1:2"], "http://127.0.0.1:3")
    assert lines == [
        "kvgate-sim replica 0 http://127.0.0.1:1",
        "kvgate-sim replica 1 http://127.0.0.1:2",
        "kvgate-sim admin http://127.0.0.1:3",
        "kvgate-sim ready http://127.0.0.1:1 http://127.0.0.1:2",
    ]
    assert parse_ready_line(lines[-1]) == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert parse_ready_line(lines[0]) is None


async def test_hosts_from_gives_each_replica_its_address(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(2, hosts_from="127.0.1.1")
    port = fleet.listeners[0].port
    assert fleet.urls == [f"http://127.0.1.1:{port}", f"http://127.0.1.2:{port}"]
    for url in fleet.urls:
        async with http.get(url + "/health") as response:
            assert response.status == 200


async def test_admin_stop_refuses_then_restart_serves(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(2, admin=True)
    admin = fleet.admin_url
    assert admin is not None
    url = fleet.urls[1]
    async with http.post(admin + "/replicas/1/stop") as response:
        assert (await response.json()) == {"index": 1, "url": url, "listening": False}
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.get(url + "/health"):
            pass
    async with http.get(fleet.urls[0] + "/health") as response:
        assert response.status == 200  # the other replica is unaffected
    async with http.post(admin + "/replicas/1/start") as response:
        assert (await response.json())["listening"] is True
    async with http.post(url + "/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 1}) as r:
        assert r.status == 200
    async with http.get(admin + "/replicas") as response:
        assert [item["listening"] for item in await response.json()] == [True, True]
    async with http.post(admin + "/replicas/7/stop") as response:
        assert response.status == 404


async def test_stop_ends_in_flight_requests_with_an_error(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(1, admin=True, time_scale=1.0)  # real time: 2,000 tokens take > 10 s
    url = fleet.urls[0]
    body = {"model": MODEL, "prompt": "a", "max_tokens": 2000}
    plain = asyncio.create_task(http.post(url + "/v1/completions", json=body))
    async with http.post(url + "/v1/completions", json={**body, "stream": True}) as stream:
        await stream.content.readuntil(b"\n\n")  # streaming has begun
        async with http.post(f"{fleet.admin_url}/replicas/0/stop") as response:
            assert response.status == 200
        rest = await asyncio.wait_for(stream.content.read(), timeout=5)
    assert b'"error"' in rest
    assert b"[DONE]" not in rest
    response = await asyncio.wait_for(plain, timeout=5)
    assert response.status == 503
    assert "error" in await response.json()
    response.release()
    assert fleet.replicas[0].stats()["requests_failed_stopped"] == 2
    assert fleet.replicas[0].engine.metrics().running == 0


async def test_admin_faults_and_aggregated_stats(
    make_fleet: FleetFactory, http: aiohttp.ClientSession
) -> None:
    fleet = await make_fleet(2, admin=True)
    admin = fleet.admin_url
    async with http.post(f"{admin}/replicas/0/faults", json={"error_rate": 1.0}) as response:
        assert (await response.json())["error_rate"] == 1.0
    async with http.post(f"{admin}/replicas/0/faults", json={"nope": 1}) as response:
        assert response.status == 400
    for url in fleet.urls:
        async with http.post(
            url + "/v1/completions", json={"model": MODEL, "prompt": "abcd", "max_tokens": 2}
        ):
            pass
    async with http.get(f"{admin}/stats") as response:
        stats = await response.json()
    assert [r["errors_injected"] for r in stats["replicas"]] == [1, 0]
    assert stats["totals"]["requests_served"] == 1
    assert stats["totals"]["generation_tokens"] == 2
    assert stats["loop_lag"]["samples"] >= 0
