"""Fixtures shared by every test package: a real ``redis-server`` (see tests/redis_server.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.redis_server import REDIS_BINARY, RedisServer

StartRedis = Callable[[], Awaitable[RedisServer]]

_STARTS_A_PROCESS = frozenset({"start_redis", "redis_server"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a real redis-server (through these fixtures) is an end-to-end test:
    ``pytest -m "not e2e"`` leaves it out, so the unit run starts no process."""
    for item in items:
        if _STARTS_A_PROCESS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
async def start_redis() -> AsyncIterator[StartRedis]:
    """Starts as many redis-servers as a test wants; kills them all at teardown."""
    started: list[RedisServer] = []

    async def start() -> RedisServer:
        if not os.access(REDIS_BINARY, os.X_OK):
            pytest.fail(
                "redis-server is not installed "
                "(bash scripts/test.sh installs it: apt-get install redis-server)"
            )
        server = RedisServer()
        started.append(server)
        await server.start()
        return server

    yield start
    for server in reversed(started):
        await server.kill()


@pytest.fixture
async def redis_server(start_redis: StartRedis) -> RedisServer:
    return await start_redis()
