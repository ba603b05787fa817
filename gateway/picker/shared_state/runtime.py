"""``SharingRuntime``: what the picker shares and limits, in process or through Redis.

The composition root (``gateway.picker.service``) asks it for each pool's scheduler state and tenant
limits and starts/stops it with the service. Without Redis settings the states are plain
``InProcessState`` and the limiter counts in process; with them, one ``RedisLink`` serves the
shared scheduler state (``SharedStateSync``) and the limiter's counters (``RedisCounters``).
``counters()`` (also exported as Prometheus metrics by ``SharingCollector``) tells how sharing goes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.gateway.picker.pools_file import PoolSpec
from kvgate.gateway.picker.ratelimit.limiter import TenantLimits, TenantRateLimiter
from kvgate.gateway.picker.ratelimit.stores import InProcessCounters, RedisCounters
from kvgate.gateway.picker.redis_link import RedisLink, RedisSettings
from kvgate.gateway.picker.shared_state.kv_relay import KvEventsRelay
from kvgate.gateway.picker.shared_state.scrapes import ScrapeSource, SharedScrapes
from kvgate.gateway.picker.shared_state.sync import SharedStateSync
from kvgate.policies.state import DEFAULT_MAX_SESSIONS, InProcessState, SchedulerState
from kvgate.policies.tenant_ledger import TenantLedger


class SharingRuntime:
    def __init__(
        self, redis: RedisSettings | None = None, *, max_sessions: int = DEFAULT_MAX_SESSIONS
    ) -> None:
        self.redis = redis
        self.max_sessions = max_sessions
        self.link = RedisLink(redis) if redis is not None else None
        self.sync = SharedStateSync(self.link, max_sessions=max_sessions) if self.link is not None else None
        self.counter_store = RedisCounters(self.link) if self.link is not None else None
        self.limiter = TenantRateLimiter(self.counter_store or InProcessCounters())

    def state_for(self, pool: str) -> SchedulerState:
        """The scheduler state of ``pool`` (shared through Redis when configured)."""
        if self.sync is not None:
            return self.sync.state_for(pool)
        return InProcessState(max_sessions=self.max_sessions)

    def share_scrapes(self, source: ScrapeSource, stale_after: float) -> SharedScrapes | None:
        """With Redis and ``share_scrapes`` on: one picker per pool scrapes for all; the returned
        object tells ``source`` (the scraper) which endpoints it need not scrape. None: no sharing."""
        if self.sync is None or self.redis is None or not self.redis.share_scrapes:
            return None
        return self.sync.share_scrapes(source, stale_after)

    def share_kv_events(self, deliver: Callable[[str, list[bytes]], None]) -> KvEventsRelay | None:
        """With Redis: the KV-event messages a picker's bound socket receives are relayed to the
        pool's other pickers (``deliver(pool, frames)`` gets theirs). None: no Redis."""
        return self.sync.share_kv_events(deliver) if self.sync is not None else None

    def follow_kv_events(self, pools: Iterable[str]) -> None:
        """The pools whose engines connect to a bound socket: their relayed messages are read."""
        if self.sync is not None:
            self.sync.follow_kv_events(pools)

    def ledger_for(self, pool: str) -> TenantLedger | None:
        """With Redis and ``share_fairness`` on: the pool's tenant ledger, shared with the other
        pickers (flow control's fairness across them). None: each picker is fair on its own."""
        if self.sync is None or self.redis is None or not self.redis.share_fairness:
            return None
        return self.sync.ledger_for(pool)

    def apply(self, specs: Iterable[PoolSpec]) -> None:
        """Configure tenant limits for ``specs``; forget pools no longer listed."""
        specs = list(specs)
        names = {spec.name for spec in specs}
        for spec in specs:
            limits = spec.rate_limits
            self.limiter.configure(
                spec.name,
                None if limits is None
                else TenantLimits(limits.requests_per_minute, limits.tokens_per_minute, limits.header),
            )
        if self.sync is not None:
            for pool in set(self.sync.mirrors) - names:
                self.sync.drop_pool(pool)
            for spec in specs:
                if spec.flow_control is None:
                    self.sync.drop_ledger(spec.name)

    async def start(self) -> None:
        if self.sync is not None and self.counter_store is not None and self.redis is not None:
            await self.sync.start()
            await self.counter_store.start(self.redis.sync_interval_s)

    async def stop(self) -> None:
        if self.sync is not None and self.counter_store is not None and self.link is not None:
            await self.counter_store.stop()
            await self.sync.stop()
            await self.link.close()

    def counters(self) -> dict[str, float]:
        out: dict[str, float] = {
            "ratelimit_fail_open": self.limiter.fail_open,
            "ratelimit_limited": self.limiter.limited,
        }
        if self.link is not None and self.sync is not None:
            link, sync = self.link.counters, self.sync.counters
            out.update(
                redis_connected=float(link.connected),
                redis_ops=link.ops,
                redis_errors=link.errors,
                redis_timeouts=link.timeouts,
                redis_reconnects=link.reconnects,
                shared_events_sent=sync.events_sent,
                shared_events_received=sync.events_received,
                shared_events_dropped=self.sync.events_dropped(),
                shared_events_lost=sync.events_lost,
                shared_peers=sync.peers,
            )
            scrapes = self.sync.scrapes
            if scrapes is not None:
                out.update(
                    shared_scrape_leader_pools=float(len(scrapes.leading)),
                    shared_scrape_batches_sent=scrapes.batches_sent,
                    shared_scrape_batches_received=scrapes.batches_received,
                    shared_scrape_batches_bad=scrapes.bad_batches,
                )
            relay = self.sync.kv_relay
            if relay is not None:
                out.update(
                    shared_kv_events_relayed=relay.sent,
                    shared_kv_events_received=relay.received,
                    shared_kv_events_dropped=relay.dropped + relay.bad_entries,
                )
        return out


_GAUGES = frozenset({"redis_connected", "shared_peers", "shared_scrape_leader_pools"})


class SharingCollector(Collector):
    """Exports ``SharingRuntime.counters()`` as ``kvgate_<name>[_total]``."""

    def __init__(self, runtime: SharingRuntime) -> None:
        self._runtime = runtime

    def collect(self) -> Iterable[Metric]:
        for name, value in self._runtime.counters().items():
            metric = f"kvgate_{name}"
            if name in _GAUGES:
                yield GaugeMetricFamily(metric, f"kvgate shared state: {name}", value=value)
            else:
                yield CounterMetricFamily(metric, f"kvgate shared state: {name}", value=value)
