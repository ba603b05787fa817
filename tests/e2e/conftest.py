"""End-to-end harness: real Envoy, the simulator fleet and small upstreams, all on loopback.

Fixtures (all function-scoped, all stop what they started):

- ``start_envoy(bootstrap, options=None) -> EnvoyProcess``: starts Envoy, waits until ready.
- ``start_fleet(replicas=2, time_scale=..., extra_args=()) -> SimFleet``: ``python -m kvgate.simulator`` as a
  subprocess on ephemeral ports; returns once its ``kvgate-sim ready`` line arrives.
- ``start_echo_upstream() -> EchoUpstream``: an aiohttp server answering JSON with its own port,
  the request's headers and body length (``?sse=N`` streams N SSE events).
- ``http``: an aiohttp ClientSession.
- ``free_port()`` (plain function, re-exported from gateway.processes.envoy_process).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from tests.kube_api_fake import FakeApiServer

__all__ = ["EchoUpstream", "SimFleet", "free_port"]

SIM_READY_PREFIX = "kvgate-sim ready"
SIM_READY_TIMEOUT_S = 30.0


@dataclass
class SimFleet:
    """A running simulator fleet (``python -m kvgate.simulator`` as a ``ChildProcess``)."""

    child: ChildProcess
    urls: list[str]

    @property
    def output(self) -> list[str]:
        return list(self.child.lines)

    @property
    def addresses(self) -> list[str]:
        """``ip:port`` of each replica, in replica order (what a pool's endpoints list holds)."""
        return [url.split("://", 1)[-1].rstrip("/") for url in self.urls]

    async def stop(self) -> int:
        code = await self.child.stop(10.0)
        return code if code is not None else -1


async def launch_fleet(
    replicas: int = 2, time_scale: float = 1.0, extra_args: Sequence[str] = ()
) -> SimFleet:
    """Starts ``python -m kvgate.simulator`` on ephemeral loopback ports (stderr merged into ``output``)."""
    child = ChildProcess([
        sys.executable, "-m", "kvgate.simulator",
        "--replicas", str(replicas), "--port", "0", "--time-scale", str(time_scale), *extra_args,
    ], name="the simulator")
    await child.start()
    try:
        ready = await child.wait_for_line(SIM_READY_PREFIX + "(.*)$", SIM_READY_TIMEOUT_S)
    except BaseException:
        await child.stop()
        raise
    return SimFleet(child, ready.group(1).split())


@dataclass
class EchoUpstream:
    """A tiny HTTP upstream for harness tests."""

    runner: web.AppRunner
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def _echo_app(port: int) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        events = int(request.query.get("sse", "0"))
        if events:
            stream = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await stream.prepare(request)
            for index in range(events):
                await stream.write(f"data: {json.dumps({'i': index, 'port': port})}\n\n".encode())
                await asyncio.sleep(float(request.query.get("gap", "0.05")))
            await stream.write(b"data: [DONE]\n\n")
            await stream.write_eof()
            return stream
        return web.json_response({
            "port": port, "method": request.method, "path": request.path,
            "headers": {k.lower(): v for k, v in request.headers.items()}, "body_len": len(body),
        })

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest.fixture
async def start_envoy() -> AsyncIterator[Callable[..., Awaitable[EnvoyProcess]]]:
    started: list[EnvoyProcess] = []

    async def start(bootstrap: dict[str, Any], options: EnvoyOptions | None = None) -> EnvoyProcess:
        envoy = EnvoyProcess(bootstrap, options)
        await envoy.start()
        started.append(envoy)
        return envoy

    yield start
    for envoy in reversed(started):
        await envoy.stop()


@pytest.fixture
async def start_fleet() -> AsyncIterator[Callable[..., Awaitable[SimFleet]]]:
    fleets: list[SimFleet] = []

    async def start(replicas: int = 2, time_scale: float = 1.0, extra_args: Sequence[str] = ()) -> SimFleet:
        fleet = await launch_fleet(replicas, time_scale, extra_args)
        fleets.append(fleet)
        return fleet

    yield start
    for fleet in reversed(fleets):
        await fleet.stop()


@pytest.fixture
async def start_echo_upstream() -> AsyncIterator[Callable[[], Awaitable[EchoUpstream]]]:
    runners: list[web.AppRunner] = []

    async def start() -> EchoUpstream:
        port = free_port()
        runner = web.AppRunner(_echo_app(port))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return EchoUpstream(runner, port)

    yield start
    for runner in reversed(runners):
        await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
async def cluster() -> AsyncIterator[FakeApiServer]:
    """The FAKE Kubernetes API server of tests/kube_api_fake.py (no real one can run here)."""
    server = FakeApiServer()
    await server.start()
    yield server
    await server.stop()
