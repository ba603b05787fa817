"""Tenant limits: the sliding window, two limiters sharing a real Redis, fail open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from kvgate.extproc.ports import TenantKey
from kvgate.gateway.picker.ratelimit import (
    InProcessCounters,
    RedisCounters,
    TenantLimits,
    TenantRateLimiter,
    Window,
    format_duration,
)
from kvgate.gateway.picker.redis_link import RedisLink, RedisSettings
from kvgate.policies.errors import RateLimitedError
from tests.redis_server import RedisServer

TENANT = {"x-gateway-inference-fairness-id": "acme"}
OTHER = {"x-gateway-inference-fairness-id": "globex"}


class FakeWall:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_window_slides_the_oldest_bucket_out_gradually() -> None:
    window = Window(60.0, 12)
    counts = {window.bucket(0.0): 10}
    assert window.total(counts, 0.0) == 10
    assert window.total(counts, 59.9) == 10
    assert window.total(counts, 62.5) == pytest.approx(5.0)  # half of the first bucket still inside
    assert window.total(counts, 65.0) == 0
    assert window.wait_until_below(counts, 30.0, 10) == pytest.approx(30.25, abs=0.3)
    assert format_duration(0.02) == "20ms"
    assert format_duration(1.5) == "1.5s"
    assert format_duration(360.0) == "6m0s"


def test_requests_per_minute_with_the_standard_headers() -> None:
    wall = FakeWall()
    limiter = TenantRateLimiter(InProcessCounters(wall_clock=wall), wall_clock=wall)
    limiter.configure("pool", TenantLimits(requests=3))
    for _ in range(3):
        key = limiter.check("pool", TENANT)
        assert key == TenantKey("pool", "acme")
        limiter.record_request(key)
    with pytest.raises(RateLimitedError) as refused:
        limiter.check("pool", TENANT)
    headers = refused.value.headers
    assert refused.value.status == 429
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert 60 <= int(headers["retry-after"]) <= 65  # the bucket slides out over 5 s
    # Another tenant, and requests naming no tenant, are unaffected; another pool has no limits.
    assert limiter.check("pool", OTHER) == TenantKey("pool", "globex")
    assert limiter.check("pool", {}) is None
    assert limiter.check("free", TENANT) is None
    # A minute later the window has slid past the three requests.
    wall.t += 66.0
    assert limiter.check("pool", TENANT) is not None


def test_tokens_per_minute_are_charged_from_usage() -> None:
    wall = FakeWall()
    limiter = TenantRateLimiter(InProcessCounters(wall_clock=wall), wall_clock=wall)
    limiter.configure("pool", TenantLimits(tokens=1000, header="X-Tenant"))
    key = limiter.check("pool", {"x-tenant": "acme"})
    assert key is not None
    limiter.charge_tokens(key, 999)
    assert limiter.check("pool", {"x-tenant": "acme"}) == key  # 999 < 1000: still admitted
    limiter.charge_tokens(key, 5)
    with pytest.raises(RateLimitedError) as refused:
        limiter.check("pool", {"x-tenant": "acme"})
    assert refused.value.headers["x-ratelimit-remaining-tokens"] == "0"
    assert refused.value.headers["x-ratelimit-limit-tokens"] == "1000"


def _redis_limiter(server_url: str, **settings: float) -> tuple[TenantRateLimiter, RedisCounters]:
    link = RedisLink(RedisSettings(url=server_url, key_prefix="t", backoff_initial_s=0.05,
                                   backoff_max_s=0.1, **settings))  # type: ignore[arg-type]
    store = RedisCounters(link, stale_after_s=1.0)
    limiter = TenantRateLimiter(store)
    limiter.configure("pool", TenantLimits(requests=4, tokens=100))
    return limiter, store


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5.0
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_two_limiters_share_one_redis(redis_server: RedisServer) -> None:
    (a, store_a), (b, store_b) = _redis_limiter(redis_server.url), _redis_limiter(redis_server.url)
    try:
        # Each replica has seen the tenant once (a replica's very first request of a tenant is
        # admitted on its local count until its next sync: that is the documented overshoot).
        assert a.check("pool", TENANT) is not None
        assert b.check("pool", TENANT) is not None
        await store_a.sync_once()
        await store_b.sync_once()
        admitted = 0
        for limiter, store in [(a, store_a), (b, store_b)] * 3:
            try:
                key = limiter.check("pool", TENANT)
            except RateLimitedError:
                continue
            assert key is not None
            limiter.record_request(key)
            admitted += 1
            await store.sync_once()  # the counting replica flushes, then the other one reads
            await (store_b if store is store_a else store_a).sync_once()
        assert admitted == 4  # the limit holds across both replicas (each alone would admit 3 of 3)
        with pytest.raises(RateLimitedError):
            b.check("pool", TENANT)
        assert b.check("pool", OTHER) is not None
        # Tokens charged on one replica count on the other.
        assert b.check("pool", OTHER) is not None
        a.charge_tokens(TenantKey("pool", "globex"), 150)
        await store_a.sync_once()
        await store_b.sync_once()
        assert b.usage(TenantKey("pool", "globex"))[1] == 150
        with pytest.raises(RateLimitedError):
            b.check("pool", OTHER)
    finally:
        await store_a.link.close()
        await store_b.link.close()


async def test_redis_down_fails_open_and_counts_it(redis_server: RedisServer) -> None:
    limiter, store = _redis_limiter(redis_server.url)
    try:
        await store.start(0.02)
        await _until(lambda: store.available, "the counters synced once")
        for _ in range(4):
            key = limiter.check("pool", TENANT)
            assert key is not None
            limiter.record_request(key)
        await _until(lambda: limiter.usage(TenantKey("pool", "acme"))[0] == 4 and store.syncs > 3, "synced")
        with pytest.raises(RateLimitedError):
            limiter.check("pool", TENANT)
        await redis_server.kill()
        await _until(lambda: not store.available, "the store noticed Redis is gone")
        for _ in range(5):  # over the limit, but the limiter cannot know the fleet's counts: admit
            assert limiter.check("pool", TENANT) is not None
        assert limiter.fail_open == 5
        await redis_server.start()  # empty again (no persistence)
        await _until(lambda: store.available, "the store is back")
        assert limiter.check("pool", OTHER) is not None
    finally:
        await store.stop()
        await store.link.close()
