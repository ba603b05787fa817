"""Several in-process pickers behind one real Envoy (issue 6): the ext_proc cluster lists every
picker and balances its streams round robin, so consecutive requests alternate between pickers.

- ``start_pickers(n, pools, redis_url=None) -> list[PickerService]`` (fixture): ``n`` pickers serving
  the same pools, sharing state through Redis when ``redis_url`` is given.
- ``start_multi_gateway(pickers, backends, routes=()) -> str`` (fixture): Envoy in front of them.

The workload and the "pickers have converged" wait come from ``bench/redis_sharing.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

from kvgate.gateway.controlplane.envoy_clusters import EXT_PROC_CLUSTER, PoolBackend
from kvgate.gateway.controlplane.envoy_config import (
    ExtProcSettings,
    GatewayConfig,
    RouteSpec,
    static_bootstrap,
)
from kvgate.gateway.picker.pools_file import parse_pools
from kvgate.gateway.picker.redis_link import RedisSettings
from kvgate.gateway.picker.service import PickerService, PickerSettings
from kvgate.gateway.processes.envoy_process import EnvoyProcess, free_port
from tests.e2e.picker_harness import JsonDict, wait_scraped

StartPickers = Callable[..., Awaitable[list[PickerService]]]
StartMultiGateway = Callable[..., Awaitable[str]]


def test_redis_settings(url: str) -> RedisSettings:
    """Fast loops and short back-off, so tests see sharing and recovery quickly."""
    return RedisSettings(url=url, sync_interval_s=0.02, read_block_s=0.05, backoff_max_s=0.3)


test_redis_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


@pytest.fixture
async def start_pickers() -> AsyncIterator[StartPickers]:
    started: list[PickerService] = []

    async def start(
        count: int, pools: Sequence[JsonDict], redis_url: str | None = None
    ) -> list[PickerService]:
        parsed = parse_pools(json.dumps({"pools": list(pools)}))
        services: list[PickerService] = []
        for _ in range(count):
            settings = PickerSettings(
                grpc_address="127.0.0.1:0", admin_port=0,
                redis=test_redis_settings(redis_url) if redis_url else None,
            )
            service = PickerService(settings)
            service.apply_pools(parsed.pools, parsed.effective_default)
            await service.start()
            started.append(service)
            services.append(service)
        for service in services:
            for spec in parsed.pools:
                await wait_scraped(service, spec.name, spec.endpoints)
        return services

    yield start
    for service in reversed(started):
        await service.stop()


@pytest.fixture
async def start_multi_gateway(
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
) -> StartMultiGateway:
    async def start(
        pickers: Sequence[PickerService], backends: Sequence[PoolBackend], routes: Sequence[RouteSpec] = ()
    ) -> str:
        port = free_port()
        config = GatewayConfig(
            listen_port=port,
            admin_port=free_port(),
            picker_addresses=tuple(("127.0.0.1", p.grpc_port) for p in pickers),
            pools=tuple(backends),
            routes=tuple(routes),
            settings=ExtProcSettings(),
        )
        bootstrap = static_bootstrap(config)
        for cluster in bootstrap["static_resources"]["clusters"]:
            if cluster["name"] == EXT_PROC_CLUSTER:
                cluster["lb_policy"] = "ROUND_ROBIN"  # alternate deterministically between pickers
        await start_envoy(bootstrap)
        return f"http://127.0.0.1:{port}"

    return start
