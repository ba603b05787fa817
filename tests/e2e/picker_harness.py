"""Harness for the picker acceptance tests: the real picker (in process or ``kvgate picker``) + real Envoy
in front of the simulator fleet, all on loopback.

Fixtures (function-scoped, each stops what it started; import them into a test module):

- ``start_picker(pools, lifecycle=None) -> PickerService``: an in-process picker serving ``pools``
  (dicts in the pools-file shape), started, returned once every endpoint that answers has been
  scraped.
- ``start_picker_process(pools) -> PickerProcess``: ``kvgate picker --pools FILE`` as a subprocess.
- ``start_gateway(picker_port, backends, routes=(), subset_hint=None, settings=None) -> str``: Envoy
  built by ``gateway.controlplane.envoy_config.static_bootstrap``; returns the gateway's base URL.
- ``start_counting_upstream() -> CountingUpstream``: an HTTP server outside every pool that counts
  what reaches it.

Plain helpers: ``fleet_admin_url``, ``fleet_stats``, ``received``, ``post_json``, ``wait_until``,
``completion_body``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.controlplane.envoy_config import (
    ExtProcSettings,
    GatewayConfig,
    RouteSpec,
    static_bootstrap,
)
from kvgate.gateway.picker.pools_file import parse_pools
from kvgate.gateway.picker.service import PickerService, PickerSettings
from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import EnvoyProcess, free_port
from tests.e2e.conftest import SimFleet

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PICKER_READY_PREFIX = "kvgate-picker ready"
KVGATE = [sys.executable, "-c", "import sys; from kvgate.gateway.cli import main; sys.exit(main())"]
"""``kvgate`` as a child process, from this checkout."""
GIE_REFERENCE = ExtProcSettings(
    tls=True, request_body_mode="BUFFERED", response_body_mode="NONE", response_header_mode="SKIP",
    send_served_endpoint=False,
)
"""Envoy's ext_proc filter as the Inference Extension's own end-to-end tests configure it."""
JsonDict = dict[str, Any]
StartPicker = Callable[..., Awaitable[PickerService]]
StartGateway = Callable[..., Awaitable[str]]


def completion_body(prompt: str, max_tokens: int = 4, model: str = MODEL, **extra: Any) -> JsonDict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, **extra}


def fleet_admin_url(fleet: SimFleet) -> str:
    """The fleet admin URL (the fleet must be started with ``--admin-port 0``)."""
    for line in fleet.output:
        if line.startswith("kvgate-sim admin "):
            return line.split()[-1]
    raise AssertionError("the fleet has no admin server: start it with --admin-port 0")


async def fleet_stats(http: aiohttp.ClientSession, fleet: SimFleet) -> list[JsonDict]:
    """Every replica's /sim/stats (through the fleet admin server, so stopped replicas answer too)."""
    async with http.get(f"{fleet_admin_url(fleet)}/stats") as response:
        assert response.status == 200
        replicas: list[JsonDict] = (await response.json())["replicas"]
        return replicas


def received(before: Sequence[JsonDict], after: Sequence[JsonDict]) -> list[int]:
    """Requests each replica received between two ``fleet_stats`` calls."""
    return [b2["requests_received"] - b1["requests_received"] for b1, b2 in zip(before, after, strict=True)]


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    """Lower-case names."""
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


async def post_json(
    http: aiohttp.ClientSession,
    url: str,
    body: JsonDict | str | bytes,
    *,
    path: str = "/v1/completions",
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 20.0,
) -> Reply:
    data = json.dumps(body) if isinstance(body, dict) else body
    all_headers = {"content-type": "application/json", **(headers or {})}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with http.post(f"{url}{path}", data=data, headers=all_headers, timeout=timeout) as response:
        headers_lower = {k.lower(): v for k, v in response.headers.items()}
        return Reply(response.status, headers_lower, await response.text())


async def wait_until(
    check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10.0, interval_s: float = 0.02
) -> float:
    """Polls ``check`` until it is true; returns the seconds it took (fails the test on timeout)."""
    start = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for: {what}")
        await asyncio.sleep(interval_s)


def pool_report(service: PickerService, pool: str) -> list[JsonDict]:
    """The picker's view of a pool's endpoints (what its admin ``/debug/pools`` shows)."""
    for item in service.pool_report():
        if item["name"] == pool:
            endpoints: list[JsonDict] = item["endpoints"]  # type: ignore[assignment]
            return endpoints
    raise AssertionError(f"the picker has no pool {pool!r}")


async def wait_scraped(service: PickerService, pool: str, addresses: Sequence[str]) -> None:
    async def scraped() -> bool:
        report = pool_report(service, pool)
        fresh = {e["address"] for e in report if e["healthy"] and e["waiting"] is not None}
        return set(addresses) <= fresh

    await wait_until(scraped, f"the picker scraped {list(addresses)} of pool {pool!r}")


@pytest.fixture
async def start_picker() -> AsyncIterator[StartPicker]:
    started: list[PickerService] = []

    async def start(pools: Sequence[JsonDict], lifecycle: LifecycleConfig | None = None) -> PickerService:
        parsed = parse_pools(json.dumps({"pools": list(pools)}))
        settings = PickerSettings(
            grpc_address="127.0.0.1:0", admin_port=0, lifecycle=lifecycle or LifecycleConfig()
        )
        service = PickerService(settings)
        service.apply_pools(parsed.pools, parsed.effective_default)
        await service.start()
        started.append(service)
        for spec in parsed.pools:
            await wait_scraped(service, spec.name, [a for a in spec.endpoints if await _listening(a)])
        return service

    yield start
    for service in reversed(started):
        await service.stop()


async def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


@dataclass
class PickerProcess:
    """``kvgate picker`` running as a child process."""

    child: ChildProcess
    grpc_port: int
    admin_url: str

    @property
    def output(self) -> list[str]:
        return list(self.child.lines)

    async def stop(self) -> int:
        code = await self.child.stop(10.0)
        return code if code is not None else -1


@pytest.fixture
async def start_picker_process(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[PickerProcess]]]:
    started: list[PickerProcess] = []

    async def start(pools: Sequence[JsonDict]) -> PickerProcess:
        pools_file = tmp_path / f"pools-{len(started)}.yaml"
        pools_file.write_text(yaml.safe_dump({"pools": list(pools)}))
        child = ChildProcess([
            sys.executable, "-c", "import sys; from kvgate.gateway.cli import main; sys.exit(main())",
            "picker", "--pools", str(pools_file), "--grpc-port", "0", "--admin-port", "0",
            "--secure-serving=false", "--grpc-health-port", "0",
            "--log-level", "WARNING",
        ], name="kvgate picker")
        await child.start()
        try:
            ready = (await child.wait_for_line(PICKER_READY_PREFIX + ".*", 30.0)).group(0)
        except BaseException:
            await child.stop()
            raise
        fields = dict(item.split("=", 1) for item in ready.split()[2:])
        picker = PickerProcess(child, int(fields["grpc"].rpartition(":")[2]), fields["admin"])
        started.append(picker)
        return picker

    yield start
    for picker in reversed(started):
        await picker.stop()


@pytest.fixture
async def start_gateway(
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
) -> StartGateway:
    async def start(
        picker_port: int,
        backends: Sequence[PoolBackend],
        routes: Sequence[RouteSpec] = (),
        subset_hint: Sequence[str] | None = None,
        settings: ExtProcSettings | None = None,
    ) -> str:
        port = free_port()
        config = GatewayConfig(
            listen_port=port,
            admin_port=free_port(),
            picker_addresses=(("127.0.0.1", picker_port),),
            pools=tuple(backends),
            routes=tuple(routes),
            subset_hint=tuple(subset_hint) if subset_hint is not None else None,
            settings=settings or ExtProcSettings(),
        )
        await start_envoy(static_bootstrap(config))
        return f"http://127.0.0.1:{port}"

    return start


@dataclass
class CountingUpstream:
    """An HTTP server that is in no pool; ``hits`` counts every request that reaches it."""

    runner: web.AppRunner
    port: int
    hits: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
async def start_counting_upstream() -> AsyncIterator[Callable[[], Awaitable[CountingUpstream]]]:
    runners: list[web.AppRunner] = []

    async def start() -> CountingUpstream:
        app = web.Application()
        upstream = CountingUpstream(web.AppRunner(app), free_port())

        async def handle(request: web.Request) -> web.Response:
            upstream.hits += 1
            await request.read()
            return web.json_response({"reached": "outside-the-pool"})

        app.router.add_route("*", "/{tail:.*}", handle)
        await upstream.runner.setup()
        await web.TCPSite(upstream.runner, "127.0.0.1", upstream.port).start()
        runners.append(upstream.runner)
        return upstream

    yield start
    for runner in reversed(runners):
        await runner.cleanup()


@contextlib.asynccontextmanager
async def background_load(
    http: aiohttp.ClientSession, requests: Sequence[tuple[str, JsonDict]]
) -> AsyncIterator[list[asyncio.Task[Reply]]]:
    """Sends each ``(replica_url, body)`` straight to the replica (not through the gateway) and keeps
    the requests running for the block; on exit the unfinished ones are cancelled (the replica aborts
    them)."""
    tasks = [asyncio.create_task(post_json(http, url, body, timeout_s=60.0)) for url, body in requests]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_replica_state(
    http: aiohttp.ClientSession, fleet: SimFleet, check: Callable[[list[JsonDict]], bool], what: str
) -> list[JsonDict]:
    """Polls the fleet's stats until ``check`` accepts them; returns those stats."""
    latest: list[JsonDict] = []

    async def ready() -> bool:
        nonlocal latest
        latest = await fleet_stats(http, fleet)
        return check(latest)

    await wait_until(ready, what)
    return latest


async def envoy_in_front(
    start_envoy: Callable[..., Awaitable[EnvoyProcess]], picker_port: int, settings: ExtProcSettings,
    pools_and_routes: tuple[tuple[PoolBackend, ...], tuple[RouteSpec, ...]],
) -> str:
    """A static Envoy (``static_bootstrap``) in front of a picker on ``picker_port``; its URL."""
    port = free_port()
    pools, routes = pools_and_routes
    config = GatewayConfig(
        listen_port=port, admin_port=free_port(), picker_addresses=(("127.0.0.1", picker_port),),
        pools=pools, routes=routes, settings=settings,
    )
    await start_envoy(static_bootstrap(config))
    return f"http://127.0.0.1:{port}"
