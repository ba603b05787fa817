"""``TenantRateLimiter``: per-tenant requests and tokens per minute (``extproc.ports.TenantLimiter``).

The tenant is the value of a header (``x-gateway-inference-fairness-id`` by default) configured
per pool; requests without it are not limited. ``check`` (before scheduling) refuses a tenant that
would exceed its request limit or has used up its token limit in the sliding window, with a
``RateLimitedError`` (429) carrying ``retry-after`` and OpenAI's ``x-ratelimit-*`` headers; an
admitted request is counted by ``record_request`` once routed, its tokens by ``charge_tokens`` when
the response's usage arrives. When the counter store is unavailable (Redis down) every request is
admitted (fail open) and counted in ``fail_open``: limits never fail a request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from kvgate.extproc.names import FAIRNESS_HEADER
from kvgate.extproc.ports import TenantKey
from kvgate.gateway.picker.ratelimit.stores import CounterKey, CounterStore
from kvgate.gateway.picker.ratelimit.window import Window, format_duration
from kvgate.policies.errors import RateLimitedError


@dataclass(frozen=True, slots=True)
class TenantLimits:
    requests: int | None = None
    """Requests per window (None: unlimited)."""
    tokens: int | None = None
    """Prompt + completion tokens per window (None: unlimited)."""
    header: str = FAIRNESS_HEADER
    window: Window = field(default_factory=Window)


class TenantRateLimiter:
    def __init__(self, store: CounterStore, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._wall = wall_clock
        self._limits: dict[str, TenantLimits] = {}
        self.fail_open = 0
        """Requests admitted unchecked because the counters were unavailable."""
        self.limited = 0

    def configure(self, pool: str, limits: TenantLimits | None) -> None:
        if limits is None or (limits.requests is None and limits.tokens is None):
            self._limits.pop(pool, None)
        else:
            self._limits[pool] = replace(limits, header=limits.header.lower())

    def limits(self, pool: str) -> TenantLimits | None:
        return self._limits.get(pool)

    def check(self, pool: str, headers: Mapping[str, str]) -> TenantKey | None:
        limits = self._limits.get(pool)
        if limits is None:
            return None
        tenant = headers.get(limits.header)
        if not tenant:
            return None
        key = TenantKey(pool, tenant)
        store = self.store
        for kind in ("requests", "tokens"):
            store.watch(_counter(key, kind), limits.window)
        if not store.available:
            self.fail_open += 1
            return key
        now = self._wall()
        window = limits.window
        over: list[float] = []
        headers_out: dict[str, str] = {}
        for kind, limit, need in (("requests", limits.requests, 1.0), ("tokens", limits.tokens, 0.0)):
            if limit is None:
                continue
            counts = store.counts(_counter(key, kind))
            used = window.total(counts, now)
            headers_out[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers_out[f"x-ratelimit-remaining-{kind}"] = str(max(0, int(limit - used)))
            headers_out[f"x-ratelimit-reset-{kind}"] = format_duration(
                window.wait_until_below(counts, now, 1e-9)
            )
            if used + need > limit or used >= limit:
                # requests: room for one more once used <= limit - 1; tokens: once used < limit
                over.append(window.wait_until_below(counts, now, limit - need + 1e-9))
        if over:
            self.limited += 1
            raise RateLimitedError(
                f"tenant {tenant!r} is over its rate limit for pool {pool!r}",
                retry_after=max(1.0, max(over)),
                headers=headers_out,
            )
        return key

    def record_request(self, key: TenantKey) -> None:
        self._add(key, "requests", 1)

    def counts_tokens(self, pool: str) -> bool:
        limits = self._limits.get(pool)
        return limits is not None and limits.tokens is not None

    def charge_tokens(self, key: TenantKey, tokens: int) -> None:
        if tokens > 0:
            self._add(key, "tokens", tokens)

    def usage(self, key: TenantKey) -> tuple[float, float]:
        """(requests, tokens) counted in the tenant's current window, as this picker sees them."""
        limits = self._limits.get(key.pool)
        window = limits.window if limits is not None else Window()
        now = self._wall()
        return (
            window.total(self.store.counts(_counter(key, "requests")), now),
            window.total(self.store.counts(_counter(key, "tokens")), now),
        )

    def _add(self, key: TenantKey, kind: str, amount: int) -> None:
        limits = self._limits.get(key.pool)
        if limits is None:
            return
        window = limits.window
        self.store.add(_counter(key, kind), window.bucket(self._wall()), amount, window)


def _counter(key: TenantKey, kind: str) -> CounterKey:
    return (key.pool, kind, key.tenant)
