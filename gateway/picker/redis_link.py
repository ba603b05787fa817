"""``RedisLink``: one redis-py asyncio client, every call bounded, failures counted and survived.

Every Redis round trip goes through :meth:`RedisLink.run` with a pipeline builder. It is bounded by
``op_timeout_s`` (plus a blocking read's own wait); any error or timeout is counted, logged at most
once per ``log_every_s``, marks the link down and returns None, and the next call waits out an
exponential back-off (``backoff_initial_s`` doubling to ``backoff_max_s``) before trying again, so a
dead Redis costs one cheap check per loop turn. The first success after a failure logs that
sharing resumed. Callers never see an exception from Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """How a picker uses Redis (``--redis URL``, or ``redis:`` in the pools file)."""

    url: str
    key_prefix: str = "kvgate"
    op_timeout_s: float = 0.25
    sync_interval_s: float = 0.05
    """Flush, publish and poll period of the background loops."""
    read_block_s: float = 0.1
    """How long a stream read waits for peers' events on the server."""
    inflight_ttl_s: float = 3.0
    """A picker's in-flight counts expire this long after its last publish (a dead picker ages out)."""
    prefix_ttl_s: float = 600.0
    session_ttl_s: float = 3600.0
    outbox_limit: int = 10_000
    batch_events: int = 2_000
    """Events per stream entry (one entry per pool and flush at most this large)."""
    stream_max_entries: int = 100_000
    share_scrapes: bool = True
    """The pickers divide each pool's replicas among them, scrape their share and adopt the others'
    scrapes (gateway/picker/shared_state/scrapes.py); False: every picker scrapes every replica."""
    share_fairness: bool = True
    """Pickers holding requests of one flow-controlled pool share each tenant's dispatched and held
    work, so fairness between tenants holds across them (policies/tenant_ledger.py); False: each
    picker is fair among its own requests only."""
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 2.0
    log_every_s: float = 10.0


@dataclass(slots=True)
class LinkCounters:
    ops: int = 0
    errors: int = 0
    timeouts: int = 0
    reconnects: int = 0
    """Recoveries: successes that followed a failure."""
    connected: bool = False
    last_error: str = ""
    by_kind: dict[str, int] = field(default_factory=dict)


class RedisLink:
    def __init__(
        self,
        settings: RedisSettings,
        *,
        client: aioredis.Redis | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.client = client if client is not None else connect(settings)
        self.counters = LinkCounters()
        self._clock = clock
        self._backoff = 0.0
        self._retry_at = 0.0
        self._logged_at = -float("inf")
        self._resumed_logged_at = -float("inf")
        self._failing = False

    @property
    def available(self) -> bool:
        """False while backing off after a failure (callers may skip work, e.g. fail open)."""
        return not self._failing or self._clock() >= self._retry_at

    @property
    def healthy(self) -> bool:
        return self.counters.connected and not self._failing

    async def run(
        self, what: str, build: Callable[[Pipeline], object], *, extra_wait_s: float = 0.0
    ) -> list[Any] | None:
        """Run the commands ``build`` queues on a pipeline; their replies, or None on any failure."""
        if not self.available:
            return None
        try:
            async with asyncio.timeout(self.settings.op_timeout_s + extra_wait_s):
                async with self.client.pipeline(transaction=False) as pipe:
                    build(pipe)
                    if not len(pipe):
                        # nothing to send: no round trip, so no news of Redis either way (an empty
                        # pipeline "succeeded" without a connection: "reachable again" while down)
                        return []
                    self.counters.ops += 1
                    replies: list[Any] = await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from exc  # our caller is being stopped: never swallow that
            self._failed(what, exc)
            return None
        self._succeeded()
        return replies

    def _failed(self, what: str, exc: BaseException) -> None:
        c = self.counters
        c.errors += 1
        if isinstance(exc, TimeoutError):
            c.timeouts += 1
        c.by_kind[what] = c.by_kind.get(what, 0) + 1
        c.connected = False
        c.last_error = f"{what}: {type(exc).__name__}: {exc}"
        s = self.settings
        self._backoff = s.backoff_initial_s if not self._failing else min(s.backoff_max_s, self._backoff * 2)
        self._failing = True
        now = self._clock()
        self._retry_at = now + self._backoff
        if now - self._logged_at >= s.log_every_s:
            self._logged_at = now
            log.warning(
                "redis unavailable (%s); routing on the local view, retrying with back-off "
                "(%d errors so far)", c.last_error, c.errors,
            )

    def _succeeded(self) -> None:
        c = self.counters
        if self._failing:
            c.reconnects += 1
            now = self._clock()
            if now - self._resumed_logged_at >= self.settings.log_every_s:
                self._resumed_logged_at = now
                log.warning("redis reachable again; shared state resumes (%d recoveries)", c.reconnects)
        self._failing = False
        self._backoff = 0.0
        c.connected = True

    async def close(self) -> None:
        await self.client.aclose()


def connect(settings: RedisSettings) -> aioredis.Redis:
    """A client whose socket operations are bounded.

    It retries once, at once, and only on a connection error: a pooled connection that a restarted
    Redis closed fails on first use, and the retry runs the call on a fresh connection instead of
    failing it (which would back off and lose the batch of events it carried). A timeout is never
    retried, and ``RedisLink.run`` bounds the whole call, retry included."""
    timeout = settings.op_timeout_s + 2 * settings.read_block_s
    client: aioredis.Redis = aioredis.Redis.from_url(
        settings.url,
        socket_timeout=timeout,
        socket_connect_timeout=settings.op_timeout_s,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        decode_responses=False,
    )
    return client
