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


async def test_nothing_to_send_is_no_news_of_redis(redis_server: RedisServer) -> None:
    """An empty round (a sync with nothing to write or read) sends nothing: it must not count as
    Redis being reachable (it said "reachable again" every few seconds while Redis was down)."""
    link = RedisLink(RedisSettings(url=redis_server.url, backoff_initial_s=0.0))
    try:
        await redis_server.kill()
        assert await link.run("ping", ping) is None
        assert await link.run("nothing", lambda pipe: None) == []
        assert not link.healthy
        assert (link.counters.reconnects, link.counters.ops) == (0, 1)
        await redis_server.start()
        assert await link.run("ping", ping) == [True]
        assert link.healthy
        assert link.counters.reconnects == 1
    finally:
        await link.close()
