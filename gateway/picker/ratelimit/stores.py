"""Where tenant counters live: in process, or in Redis so the limits hold across picker replicas.

Both are synchronous for the limiter (it runs on the request path, which never waits on IO).
``RedisCounters`` answers from a local view: the totals it last read from Redis plus what this
picker added since. A background loop (every ``sync_interval_s``) adds the new counts to Redis
(``HINCRBY`` per bucket, keys expire after two windows) and reads back the totals of every tenant
this picker saw within the window, in one pipeline. While Redis is unreachable, or its totals are
older than ``stale_after_s``, ``available`` is False and the limiter fails open; the counts made
meanwhile are kept and sent when Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from redis.asyncio.client import Pipeline

from kvgate.gateway.picker.ratelimit.window import Window
from kvgate.gateway.picker.redis_link import RedisLink

log = logging.getLogger(__name__)

CounterKey = tuple[str, str, str]
"""(pool, kind, tenant); kind is ``requests`` or ``tokens``."""


class CounterStore(Protocol):
    @property
    def available(self) -> bool:
        """False when the counts cannot be trusted (the limiter then admits: fail open)."""
        ...

    def add(self, key: CounterKey, bucket: int, amount: int, window: Window) -> None:
        """Count ``amount`` in ``bucket`` of ``window``."""
        ...

    def counts(self, key: CounterKey) -> Mapping[int, int]:
        """Bucket -> count (all replicas' counts for a shared store)."""
        ...

    def watch(self, key: CounterKey, window: Window) -> None:
        """A tenant is active here: keep ``key``'s shared totals fresh (no-op in process)."""
        ...


def _merge_into(target: dict[int, int], source: Mapping[int, int]) -> None:
    for bucket, amount in source.items():
        target[bucket] = target.get(bucket, 0) + amount


def _prune(buckets: dict[int, int], oldest_live: int) -> None:
    for bucket in [b for b in buckets if b < oldest_live]:
        del buckets[bucket]


class InProcessCounters:
    """Counts of this process only (the default without Redis)."""

    def __init__(self, max_keys: int = 100_000, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall = wall_clock
        self._counts: dict[CounterKey, dict[int, int]] = {}
        self._oldest: dict[CounterKey, int] = {}
        self.max_keys = max_keys

    @property
    def available(self) -> bool:
        return True

    def add(self, key: CounterKey, bucket: int, amount: int, window: Window) -> None:
        oldest_live = window.oldest_live(self._wall())
        buckets = self._counts.get(key)
        if buckets is None:
            if len(self._counts) >= self.max_keys:
                self._drop_idle(oldest_live)
            buckets = self._counts[key] = {}
        _prune(buckets, oldest_live)
        buckets[bucket] = buckets.get(bucket, 0) + amount
        self._oldest[key] = oldest_live

    def counts(self, key: CounterKey) -> Mapping[int, int]:
        return self._counts.get(key, {})

    def watch(self, key: CounterKey, window: Window) -> None:
        pass

    def _drop_idle(self, oldest_live: int) -> None:
        for key in [k for k, b in self._counts.items() if not b or max(b) < oldest_live]:
            del self._counts[key]
            self._oldest.pop(key, None)
        while len(self._counts) >= self.max_keys:  # still full: drop the least recently counted
            key = min(self._oldest, key=lambda k: self._oldest[k])
            del self._counts[key]
            del self._oldest[key]


class RedisCounters:
    def __init__(
        self,
        link: RedisLink,
        *,
        stale_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.link = link
        self._wall = wall_clock
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._pending: dict[CounterKey, dict[int, int]] = {}
        self._flushing: dict[CounterKey, dict[int, int]] = {}
        self._remote: dict[CounterKey, dict[int, int]] = {}
        self._active: dict[CounterKey, Window] = {}
        """Keys this picker counted or checked recently, and their window: read back on each sync."""
        self._seen: dict[CounterKey, float] = {}
        """Wall time each active key was last counted or checked."""
        self._synced_at = -float("inf")
        self._task: asyncio.Task[None] | None = None
        self.syncs = 0

    @property
    def available(self) -> bool:
        return self.link.healthy and self._clock() - self._synced_at <= self.stale_after_s

    def add(self, key: CounterKey, bucket: int, amount: int, window: Window) -> None:
        pending = self._pending.setdefault(key, {})
        pending[bucket] = pending.get(bucket, 0) + amount
        self._active[key] = window
        self._seen[key] = self._wall()

    def counts(self, key: CounterKey) -> Mapping[int, int]:
        remote = self._remote.get(key)
        pending = self._pending.get(key)
        flushing = self._flushing.get(key)
        if pending is None and flushing is None:
            return remote or {}
        merged = dict(remote or {})
        _merge_into(merged, pending or {})
        _merge_into(merged, flushing or {})
        return merged

    def watch(self, key: CounterKey, window: Window) -> None:
        """Read ``key``'s totals on the next syncs (a tenant this picker has just seen)."""
        self._active.setdefault(key, window)
        self._seen[key] = self._wall()

    # --- IO shell -----------------------------------------------------------------------------
    async def start(self, interval_s: float) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(interval_s), name="kvgate-ratelimit-sync")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            _, pending = await asyncio.wait([task], timeout=2.0)  # an outer cancellation propagates
            if pending:
                log.warning("rate-limit sync loop did not stop in time")

    async def _loop(self, interval_s: float) -> None:
        while self._task is not None:
            try:
                await self.sync_once()
            except Exception:
                log.exception("rate-limit sync failed")
            await asyncio.sleep(interval_s)

    async def sync_once(self) -> None:
        if not self.link.available:
            return
        self._flushing, self._pending = self._pending, {}
        flushing = self._flushing
        keys = list(self._active)
        prefix = self.link.settings.key_prefix

        def build(pipe: Pipeline) -> None:
            for key, buckets in flushing.items():
                name = _redis_key(prefix, key)
                for bucket, amount in buckets.items():
                    pipe.hincrby(name, str(bucket), amount)
                window = self._active.get(key)
                pipe.pexpire(name, int(2 * (window.seconds if window is not None else 60.0) * 1000))
            for key in keys:
                pipe.hgetall(_redis_key(prefix, key))
            if not flushing and not keys:
                pipe.ping()  # no tenant yet: still learn whether Redis answers (available)

        replies = await self.link.run("ratelimit", build)
        self._flushing = {}
        if replies is None:
            wall = self._wall()
            for key, buckets in flushing.items():  # keep them for the next try, while they matter
                window = self._active.get(key)
                kept = self._pending.setdefault(key, {})
                _merge_into(kept, buckets)
                if window is not None:
                    _prune(kept, window.oldest_live(wall))
            return
        wall = self._wall()
        for key, fields in zip(keys, replies[len(replies) - len(keys) :], strict=True):
            oldest_live = self._active[key].oldest_live(wall)
            remote = {int(b): int(v) for b, v in fields.items() if int(b) >= oldest_live}
            self._remote[key] = remote
            idle = wall - self._seen.get(key, wall) > self._active[key].seconds
            if idle and not remote and key not in self._pending:
                del self._active[key]  # nothing counted for a whole window: stop reading it
                self._remote.pop(key, None)
                self._seen.pop(key, None)
        self._synced_at = self._clock()
        self.syncs += 1


def _redis_key(prefix: str, key: CounterKey) -> str:
    pool, kind, tenant = key
    return f"{prefix}:rl:{pool}:{kind}:{tenant}"
