"""RedisLink against a real redis-server: a restarted Redis costs no failed call."""

from __future__ import annotations

from redis.asyncio.client import Pipeline

from kvgate.gateway.picker.redis_link import RedisLink, RedisSettings
from tests.redis_server import RedisServer


def ping(pipe: Pipeline) -> None:
    pipe.ping()


async def test_the_first_call_after_a_restart_succeeds_on_a_fresh_connection(
    redis_server: RedisServer,
) -> None:
    """The pooled connection the old server closed fails on first use; the one retry on a new
    connection hides that, so a picker neither backs off nor loses the events it was writing."""
    link = RedisLink(RedisSettings(url=redis_server.url))
    try:
        assert await link.run("ping", ping) == [True]
        await redis_server.kill()
        await redis_server.start()
        assert await link.run("ping", ping) == [True]
        assert (link.counters.errors, link.counters.ops) == (0, 2)
        # A Redis that is really gone still fails the call (once, counted), retry or not.
        await redis_server.kill()
        assert await link.run("ping", ping) is None
        assert link.counters.errors == 1
        assert not link.healthy
    finally:
        await link.close()
