"""The Envoy child process, with the real binary."""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import pytest

from gateway.controlplane.envoy_config import bootstrap, listener, router_filter, socket_address
from gateway.processes.envoy_process import (
    EnvoyOptions,
    EnvoyProcess,
    EnvoyStartError,
    find_envoy_binary,
    free_port,
)

pytestmark = pytest.mark.e2e  # starts processes (Envoy / the simulator)

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def _direct_response_bootstrap(listen_port: int, admin_port: int) -> dict[str, Any]:
    hcm = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": _HCM,
            "stat_prefix": "t",
            "route_config": {
                "name": "t",
                "virtual_hosts": [{
                    "name": "t",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"},
                                "direct_response": {"status": 200, "body": {"inline_string": "hello"}}}],
                }],
            },
            "http_filters": [router_filter()],
        },
    }
    return bootstrap(admin_port, [listener("t", "127.0.0.1", listen_port, hcm, 1 << 20)], [])


def test_finds_an_executable_envoy() -> None:
    binary = find_envoy_binary()
    assert binary.is_file()
    assert os.access(binary, os.X_OK)


async def test_starts_serves_and_stops_cleanly() -> None:
    port, admin_port = free_port(), free_port()
    envoy = EnvoyProcess(_direct_response_bootstrap(port, admin_port))
    await envoy.start()
    try:
        assert envoy.pid is not None
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/x") as response:
                assert response.status == 200
                assert await response.text() == "hello"
            async with session.get(f"{envoy.admin_url}/ready") as response:
                assert (await response.text()).strip() == "LIVE"
    finally:
        code = await envoy.stop()
    assert code == 0
    assert envoy.pid is None
    assert await envoy.stop() is None


async def test_context_manager_stops_on_exit() -> None:
    port, admin_port = free_port(), free_port()
    boot = _direct_response_bootstrap(port, admin_port)
    async with EnvoyProcess(boot, EnvoyOptions(concurrency=2)) as envoy:
        assert envoy.pid is not None
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/"):
            pass


async def test_invalid_config_surfaces_envoys_error() -> None:
    boot = _direct_response_bootstrap(free_port(), free_port())
    boot["static_resources"]["clusters"] = [{"name": "bad", "type": "NOT_A_TYPE"}]
    with pytest.raises(EnvoyStartError, match="NOT_A_TYPE"):
        await EnvoyProcess(boot).start()


async def test_port_in_use_is_reported() -> None:
    port, admin_port = free_port(), free_port()
    async with EnvoyProcess(_direct_response_bootstrap(port, admin_port)):
        second = EnvoyProcess(_direct_response_bootstrap(port, free_port()), EnvoyOptions(ready_timeout_s=10))
        try:
            with pytest.raises(EnvoyStartError, match="Envoy exited"):
                await second.start()
        finally:
            await second.stop()


def test_bootstrap_without_admin_is_rejected() -> None:
    with pytest.raises(Exception, match="admin"):
        EnvoyProcess({"static_resources": {"listeners": [{"address": socket_address("127.0.0.1", 1)}]}})
