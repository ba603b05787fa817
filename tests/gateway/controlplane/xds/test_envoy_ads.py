"""The real Envoy binary, bootstrapped to kvgate's ADS server: initial config, live update, NACK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from kvgate.gateway.controlplane.xds import (
    ANY_NODE,
    CLUSTER,
    LISTENER,
    ROUTE,
    AdsServer,
    Snapshot,
    SnapshotCache,
    XdsStatus,
    bootstrap_for_ads,
)
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from tests.gateway.controlplane.xds.envoy_dicts import (
    EXT_PROC_PER_ROUTE_TYPE,
    ORIGINAL_DST_TYPE,
    assignment,
    eds_cluster,
    grpc_cluster,
    listener,
    original_dst_cluster,
    route_config,
)

pytestmark = pytest.mark.e2e

NODE = "kvgate-xds-e2e"
POLL_S = 0.005


def snapshot(listener_port: int, backend_port: int, body: str, *, path_regex: str | None = None) -> Snapshot:
    return Snapshot.from_dicts(
        listeners=[listener("http", listener_port, "main")],
        routes=[route_config("main", body=body, cluster="backend", path_regex=path_regex)],
        clusters=[eds_cluster("backend")],
        endpoints=[assignment("backend", "127.0.0.1", backend_port)],
    )


@pytest.fixture
async def backend_port() -> AsyncIterator[int]:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="from backend")

    app = web.Application()
    app.router.add_get("/up", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port: int = runner.addresses[0][1]
    yield port
    await runner.cleanup()


async def get_text(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url) as response:
            return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def reached_at(condition: Callable[[], object], limit_s: float = 10.0) -> float:
    """Poll an (async or sync) condition; return the ``time.monotonic()`` at which it held.

    ``limit_s`` only bounds a broken run; the latencies themselves are printed, not asserted.
    """
    start = time.monotonic()
    while (now := time.monotonic()) - start < limit_s:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return now
        await asyncio.sleep(POLL_S)
    raise AssertionError(f"not reached within {limit_s} s")


async def test_envoy_follows_ads_updates_and_nacks(backend_port: int) -> None:
    cache, status = SnapshotCache(), XdsStatus()
    listener_port = free_port()
    cache.set_snapshot(ANY_NODE, snapshot(listener_port, backend_port, "v1"))
    async with AdsServer(cache, observer=status) as ads:
        bootstrap = bootstrap_for_ads(NODE, ads.address, free_port())
        async with (
            EnvoyProcess(bootstrap, EnvoyOptions(log_level="warning")) as envoy,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
        ):
            base = f"http://127.0.0.1:{listener_port}"
            pid = envoy.pid

            async def serves(body: str) -> bool:
                return await get_text(http, f"{base}/") == body

            await reached_at(lambda: serves("v1"))
            assert await get_text(http, f"{base}/up") == "from backend"  # RDS -> CDS/EDS -> upstream

            # A live update reaches Envoy without a restart.
            start = time.monotonic()
            cache.set_snapshot(ANY_NODE, snapshot(listener_port, backend_port, "v2"))
            v2_routes = cache.snapshot_for(NODE).version_of(ROUTE, ["main"])  # type: ignore[union-attr]
            served_after = await reached_at(lambda: serves("v2")) - start
            acked_at = await reached_at(lambda: status.nodes[NODE][ROUTE].acked_version == v2_routes)
            acked_after = acked_at - start
            assert envoy.pid == pid

            # A configuration Envoy refuses (an invalid RE2 regex parses fine as a proto): NACKed,
            # recorded, and Envoy keeps serving the last good one.
            bad = snapshot(listener_port, backend_port, "v3-bad", path_regex="(unclosed")
            bad_start = time.monotonic()
            cache.set_snapshot(ANY_NODE, bad)
            nack_after = await reached_at(lambda: status.last_rejection(NODE, ROUTE) is not None) - bad_start
            rejection = status.last_rejection(NODE, ROUTE)
            assert rejection is not None
            assert rejection.version == bad.version_of(ROUTE, ["main"])
            assert "(unclosed" in rejection.message  # RE2's complaint, as Envoy reports it
            assert status.counters[ROUTE].nacks == 1
            for _ in range(20):
                assert await get_text(http, f"{base}/") == "v2"
            shown = status.as_dict()["nodes"]
            assert isinstance(shown, dict)
            assert shown[NODE][ROUTE]["last_rejection"]["message"] == rejection.message

            # The next good snapshot is pushed and served.
            recover_start = time.monotonic()
            cache.set_snapshot(ANY_NODE, snapshot(listener_port, backend_port, "v4"))
            recovered_after = await reached_at(lambda: serves("v4")) - recover_start
            assert status.counters[ROUTE].nacks == 1
            assert envoy.pid == pid

    print(
        f"\nxDS change -> Envoy: served after {served_after * 1000:.1f} ms, ACKed after "
        f"{acked_after * 1000:.1f} ms; NACK recorded after {nack_after * 1000:.1f} ms; "
        f"next good snapshot served after "
        f"{recovered_after * 1000:.1f} ms (poll interval {POLL_S * 1000:.0f} ms)"
    )


async def test_envoy_accepts_kvgate_shaped_resources() -> None:
    """ext_proc filter, per-route ExtProcPerRoute, ORIGINAL_DST cluster, weighted clusters, an HTTP/2
    cluster: all built from JSON dicts, all ACKed by Envoy (nothing rejected)."""
    listener_port, picker_port = free_port(), free_port()
    http = listener("http", listener_port, "main", ext_proc_cluster="picker")
    http["listener_filters"] = [
        {"name": "envoy.filters.listener.original_dst", "typed_config": {"@type": ORIGINAL_DST_TYPE}}
    ]
    routes = route_config("main", cluster="pool-a", weighted={"pool-a": 70, "pool-b": 30})
    routes["virtual_hosts"][0]["routes"][0]["typed_per_filter_config"] = {
        "envoy.filters.http.ext_proc": {
            "@type": EXT_PROC_PER_ROUTE_TYPE,
            "overrides": {"grpc_service": {"envoy_grpc": {"cluster_name": "picker"}}},
        }
    }
    snap = Snapshot.from_dicts(
        listeners=[http],
        routes=[routes],
        clusters=[
            original_dst_cluster("pool-a"),
            original_dst_cluster("pool-b"),
            grpc_cluster("picker", picker_port),
        ],
    )
    cache, status = SnapshotCache(), XdsStatus()
    cache.set_snapshot(ANY_NODE, snap)
    async with AdsServer(cache, observer=status) as ads:
        bootstrap = bootstrap_for_ads(NODE, ads.address, free_port())
        async with EnvoyProcess(bootstrap, EnvoyOptions(log_level="warning")):
            wanted = {
                CLUSTER: snap.version_of(CLUSTER),
                LISTENER: snap.version_of(LISTENER),
                ROUTE: snap.version_of(ROUTE, ["main"]),
            }

            def all_acked() -> bool:
                types = status.nodes.get(NODE, {})
                return all(url in types and types[url].acked_version == v for url, v in wanted.items())

            await reached_at(all_acked)
    assert all(c.nacks == 0 for c in status.counters.values()), status.as_dict()
