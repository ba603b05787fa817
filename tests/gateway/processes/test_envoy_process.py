"""The Envoy child process, with the real binary."""

from __future__ import annotations

import os
import socket
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.controlplane.envoy_clusters import socket_address
from kvgate.gateway.controlplane.envoy_config import bootstrap, listener, router_filter
from kvgate.gateway.processes.envoy_process import (
    EnvoyOptions,
    EnvoyProcess,
    EnvoyStartError,
    find_envoy_binary,
    free_port,
    port_in_use,
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


async def test_listening_is_read_from_envoy_itself_and_a_refusal_or_an_exit_ends_the_wait() -> None:
    port, admin_port = free_port(), free_port()
    envoy = EnvoyProcess(_direct_response_bootstrap(port, admin_port))
    await envoy.start()
    try:
        await envoy.wait_listening(port, timeout_s=5.0)
        with pytest.raises(EnvoyStartError, match="port taken"):
            await envoy.wait_listening(free_port(), rejected=lambda: "port taken", timeout_s=5.0)
        with pytest.raises(EnvoyStartError, match="does not listen"):
            await envoy.wait_listening(free_port(), timeout_s=0.3)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{envoy.admin_url}/quitquitquit") as response,
        ):
            assert response.status == 200
        assert await envoy.wait() == 0
        assert not envoy.running
        await envoy.start()  # again, after it exited: the same bootstrap
        await envoy.wait_listening(port, timeout_s=5.0)
    finally:
        await envoy.stop()


def test_a_port_another_socket_listens_on_is_in_use_and_a_closed_one_is_not() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port)
