"""Fixtures for the simulator's IO tests: fleets served in the test's own event loop on loopback."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from kvgate.simulator.engine import EngineConfig
from kvgate.simulator.faults import Faults
from kvgate.simulator.fleet import Fleet, FleetConfig
from kvgate.simulator.kv_transfer import KvTransferSettings, Role
from kvgate.simulator.metrics import Dialect
from kvgate.simulator.server import ReplicaConfig

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TIME_SCALE = 0.01  # 100x faster than real time: a 6 ms step sleeps 60 us

FleetFactory = Callable[..., Awaitable[Fleet]]


def fleet_config(
    replicas: int = 1,
    *,
    dialect: Dialect = "vllm",
    time_scale: float = TIME_SCALE,
    admin: bool = False,
    hosts_from: str | None = None,
    port: int = 0,
    faults: Faults | None = None,
    roles: tuple[Role, ...] = (),
    kv_transfer: KvTransferSettings | None = None,
    kv_events_port: int | None = None,
    **engine: Any,
) -> FleetConfig:
    engine_config = dataclasses.replace(EngineConfig(), **engine)
    configs = tuple(
        ReplicaConfig(
            index=i, engine=engine_config, dialect=dialect, time_scale=time_scale, faults=faults or Faults(),
            role=roles[i] if i < len(roles) else "both", kv_transfer=kv_transfer or KvTransferSettings(),
        )
        for i in range(replicas)
    )
    if kv_events_port is not None:
        engine_config = dataclasses.replace(engine_config, kv_events=True)
        configs = tuple(dataclasses.replace(c, engine=engine_config) for c in configs)
    return FleetConfig(replicas=configs, port=port, hosts_from=hosts_from, admin_port=0 if admin else None,
                       kv_events_port=kv_events_port)


@pytest.fixture
async def make_fleet() -> AsyncIterator[FleetFactory]:
    fleets: list[Fleet] = []

    async def make(replicas: int = 1, **kwargs: Any) -> Fleet:
        fleet = Fleet(fleet_config(replicas, **kwargs))
        fleets.append(fleet)
        await fleet.start()
        return fleet

    yield make
    for fleet in fleets:
        await fleet.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
