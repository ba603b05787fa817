"""The ``servers`` fixture: /metrics servers on 127.0.0.1 that a test steers (metrics_server.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.gateway.picker.metrics_server import MetricsServer, ServerFactory


@pytest.fixture
async def servers() -> AsyncIterator[ServerFactory]:
    started: list[MetricsServer] = []

    async def make(text: str, path: str = "/metrics") -> MetricsServer:
        server = MetricsServer(text, path)
        await server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()
