"""The metrics scraper: every replica's GET started by one timer, publishing immutable snapshots.

::

    set_endpoints(pool, dialect, addresses) ──▶ a target per endpoint; every `interval`, on the
                                                scraper's grid (phase + k × interval), one tick
                                                starts a GET for each target with none in flight
        GET http://ip:port/metrics  (one kept-alive connection per endpoint, its answer by callback:
                                     scrape/http_get.py; a GET past `timeout` fails at a tick)
        ──▶ parse_metrics(page, dialect)  ──▶ new frozen EndpointMetrics
        ──▶ new EndpointSnapshot, swapped in as one reference (version + 1) ──▶ on_snapshot(snapshot)

Readers call :meth:`MetricsScraper.snapshot` (or keep what ``on_snapshot`` handed them) and never
lock: a snapshot never changes once published (docs/architecture.md, principle 1).

Shared scrapes (pickers sharing state through Redis): a :class:`ScrapeDelegate` says which
endpoints another picker scrapes for this one; the ticks skip their GET while it does, and
:meth:`MetricsScraper.adopt` takes that picker's views (gateway/picker/shared_state/scrapes.py).

Staleness: a failed scrape (connection refused, timeout, HTTP status other than 200, unreadable page)
keeps the endpoint's last metrics; once those are older than ``stale_after`` (or there never were
any) the endpoint is published ``healthy=False``. The next good scrape makes it healthy again.
Each endpoint's GET waits only on its own replica over its own connection, so a slow or dead
replica never delays the others (a GET still in flight at a tick skips that tick).

All methods must be called from the event loop's thread (the scraper is single-threaded asyncio);
:meth:`snapshot` and :attr:`version` may be read from anywhere, as they only read one reference.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType, TracebackType
from typing import Protocol, cast

from kvgate.gateway.picker.model_server_tls import ClientTls
from kvgate.gateway.picker.scrape.dialects import DIALECTS, MetricsDialect, parse_metrics
from kvgate.gateway.picker.scrape.exposition import LineMemo, MetricsPageError
from kvgate.gateway.picker.scrape.http_get import MetricsConnection
from kvgate.gateway.picker.scrape.target import ScrapeCounters, ScrapeTarget, checked_endpoint, metrics_url
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointSnapshot, EndpointView

log = logging.getLogger(__name__)

Clock = Callable[[], float]
SnapshotListener = Callable[[EndpointSnapshot], None]


class ScrapeDelegate(Protocol):
    """Tells the scraper which endpoints another picker scrapes for it now."""

    def covered_until(self, endpoint: Endpoint, now: float) -> float | None:
        """Skip scraping ``endpoint`` until then (its views come by ``adopt``); None: scrape now."""
        ...

    def scraped(self, pool: str) -> None:
        """This scraper published new scrapes (or verdicts) of ``pool``'s endpoints."""
        ...


_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


PUBLISH_DELAY_S = 0.001
"""Scrapes ending this close together publish one snapshot (a view is at most this much later)."""


def grid_tick(now: float, phase: float, interval: float) -> float:
    """The first time at or after ``now`` on the grid ``phase`` + k × ``interval``."""
    return now + (phase - now) % interval


class MetricsScraper:
    """Scrapes every configured endpoint on its own loop and publishes :class:`EndpointSnapshot` s.

    Use as ``async with MetricsScraper(...) as scraper:`` (or :meth:`start` / :meth:`stop`).
    """

    def __init__(
        self,
        *,
        interval: float = 0.05,
        timeout: float = 0.5,
        stale_after: float = 0.2,
        clock: Clock = time.monotonic,
        on_snapshot: SnapshotListener | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if interval <= 0 or timeout <= 0 or stale_after < 0:
            raise ValueError("interval and timeout must be positive, stale_after not negative")
        self._interval = interval
        self._timeout_s = timeout
        self._stale_after = stale_after
        self._clock = clock
        self._on_snapshot = on_snapshot
        self._phase = (rng or random.Random()).uniform(0.0, interval)
        """Every endpoint's scrapes start at ``phase`` + k × ``interval`` (loop time): one timer
        wake-up starts them all (the replicas are distinct servers: nothing to spread), and each
        picker has its own phase (many pickers do not scrape one replica at the same instant)."""
        self._targets: dict[str, dict[str, ScrapeTarget]] = {}
        self._ticker: asyncio.TimerHandle | None = None
        self._next_tick = 0.0
        self._snapshot = EndpointSnapshot()
        self._running = False
        self._delegate: ScrapeDelegate | None = None
        self._lines = LineMemo()
        """The metrics pages' lines parsed so far (every endpoint's: most repeat between scrapes)."""
        self._positions: dict[str, dict[str, int]] = {}
        """Per pool, each endpoint's position in its published tuple (the targets' order)."""
        self._dirty: dict[str, set[str]] = {}
        """Per pool, the endpoints whose views changed since the last snapshot (published together,
        ``PUBLISH_DELAY_S``)."""

    # -- readers -------------------------------------------------------------------------------

    def now(self) -> float:
        """The scraper's clock (what its views' ``updated_at`` are read on)."""
        return self._clock()

    def snapshot(self) -> EndpointSnapshot:
        """The latest published snapshot (immutable; a new object after every change)."""
        return self._snapshot

    @property
    def version(self) -> int:
        """Grows by one with every published snapshot."""
        return self._snapshot.version

    @property
    def phase(self) -> float:
        """Scrapes start at loop times ``phase`` + k × ``interval``."""
        return self._phase

    @property
    def running(self) -> bool:
        return self._running

    def counters(self) -> Mapping[Endpoint, ScrapeCounters]:
        """Scrape counters of every current endpoint (a copy)."""
        return MappingProxyType(
            {t.endpoint: t.counters() for targets in self._targets.values() for t in targets.values()}
        )

    def views(self, pool: str) -> tuple[EndpointView, ...]:
        """``pool``'s endpoints in the latest snapshot."""
        return self._snapshot.endpoints(pool)

    def own_views(self, pool: str, since: float) -> tuple[EndpointView, ...]:
        """``pool``'s endpoints this scraper scraped itself (not adopted from another picker) at
        ``since`` or later, or found unhealthy (what it shares with other pickers)."""
        out = []
        for target in self._targets.get(pool, {}).values():
            view = target.view
            if target.adopted:
                continue
            if not view.healthy or (view.metrics is not None and view.metrics.updated_at >= since):
                out.append(view)
        return tuple(out)

    # -- shared scrapes ------------------------------------------------------------------------

    def delegate_to(self, delegate: ScrapeDelegate | None) -> None:
        """Ask ``delegate`` before each scrape whether another picker scrapes that endpoint."""
        self._delegate = delegate

    def adopt(self, pool: str, records: Iterable[tuple[str, EndpointMetrics | None, bool]]) -> None:
        """Take another picker's scrapes (address, metrics or None, healthy) of ``pool``'s endpoints.

        Endpoints this scraper does not have are ignored; a record older than this scraper's own
        healthy view of the endpoint is too (it scraped the endpoint itself since). A view adopted
        before is always replaced: batches come in order, and the same metrics re-timed from their
        age differ by each batch's transit, so comparing them could drop an owner's later
        "unhealthy" over unchanged metrics. A record without metrics keeps the endpoint's last
        metrics with the record's health. One snapshot is published for the pool when anything
        changed.
        """
        targets = self._targets.get(pool)
        if not targets:
            return
        changed: set[str] = set()
        for address, metrics, healthy in records:
            target = targets.get(address)
            if target is None:
                continue
            mine = target.view
            if metrics is None:
                target.adopted = True
                if healthy != mine.healthy:
                    target.view = EndpointView(target.endpoint, mine.metrics, healthy)
                    changed.add(address)
                continue
            if (
                not target.adopted  # a view adopted before is superseded by the newer batch, always
                and mine.healthy
                and mine.metrics is not None
                and mine.metrics.updated_at > metrics.updated_at
            ):
                continue
            target.adopted = True
            if metrics is not mine.metrics or healthy != mine.healthy:  # (a batch's are new objects)
                target.view = EndpointView(target.endpoint, metrics, healthy)
                changed.add(address)
        if changed:
            self._publish(pool, changed)

    # -- membership ----------------------------------------------------------------------------

    def set_endpoints(
        self,
        pool: str,
        dialect: MetricsDialect | str,
        endpoints: Iterable[Endpoint | str],
        *,
        metrics_path: str | None = None,
        metrics_port: int | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        """Make ``pool``'s endpoints exactly ``endpoints`` (``ip:port`` strings or Endpoints).

        New endpoints start scraping (if the scraper runs); removed ones have their task cancelled;
        kept ones keep their metrics unless their dialect or metrics URL changed.
        ``metrics_path`` defaults to the dialect's; ``metrics_port`` (e.g. Triton's 8002) to the
        endpoint's own port; ``tls``: the model servers serve HTTPS. Publishes a new snapshot.
        """
        spec = DIALECTS[MetricsDialect(dialect)]
        path = metrics_path if metrics_path is not None else spec.metrics_path
        wanted: dict[str, Endpoint] = {}
        for item in endpoints:
            endpoint = Endpoint(item, pool) if isinstance(item, str) else item
            if endpoint.pool != pool:
                raise ValueError(
                    f"endpoint {endpoint.address} belongs to pool {endpoint.pool!r}, not {pool!r}"
                )
            wanted[checked_endpoint(endpoint).address] = endpoint
        current = self._targets.get(pool, {})
        updated: dict[str, ScrapeTarget] = {}
        for address, endpoint in wanted.items():
            url = metrics_url(endpoint, path, metrics_port, https=tls is not None)
            old = current.get(address)
            if (
                old is not None
                and old.endpoint == endpoint
                and old.dialect == spec.dialect
                and old.url == url
                and old.tls == tls
            ):
                updated[address] = old
                continue
            if old is not None:
                self._retire(old)
            port = endpoint.port if metrics_port is None else metrics_port
            connection = MetricsConnection(endpoint.host, port, path, _ACCEPT,
                                           tls.context() if tls is not None else None)
            target = ScrapeTarget(endpoint, spec.dialect, url, connection, tls)
            updated[address] = target  # scraped from the next tick on
        for address, old in current.items():
            if address not in wanted:
                self._retire(old)
        self._targets[pool] = updated
        self._positions.pop(pool, None)
        self._publish(pool)

    def remove_pool(self, pool: str) -> None:
        """Stop scraping every endpoint of ``pool`` and drop it from the snapshot."""
        self._positions.pop(pool, None)
        for target in self._targets.pop(pool, {}).values():
            self._retire(target)
        if pool in self._snapshot.pools:
            pools = dict(self._snapshot.pools)
            del pools[pool]
            self._swap(pools)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        loop = asyncio.get_running_loop()
        self._next_tick = grid_tick(loop.time(), self._phase, self._interval)
        self._ticker = loop.call_at(self._next_tick, self._tick)

    async def stop(self) -> None:
        """Stop scraping and close the connections (GETs in flight are dropped). The last snapshot
        stays readable."""
        self._running = False
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        for targets in self._targets.values():
            for target in targets.values():
                target.connection.close()
                target.sent_at = None

    async def __aenter__(self) -> MetricsScraper:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- the tick: every endpoint's GET starts here --------------------------------------------

    def _retire(self, target: ScrapeTarget) -> None:
        target.connection.close()  # a GET in flight is dropped: its answer is nobody's
        target.sent_at = None

    def _tick(self) -> None:
        """On the grid: time out the GETs past their bound, start one for every endpoint with none
        in flight that no other picker covers. One timer for all (each answer comes by the
        connection's callbacks): no task, future or timeout context per scrape."""
        if not self._running:
            return
        loop = asyncio.get_running_loop()
        try:
            now = self._clock()
            for targets in self._targets.values():
                for target in targets.values():
                    self._poll(target, now)
        except Exception:  # a bug must not end scraping: logged, the next tick goes on
            log.exception("scrape tick failed")
        self._next_tick += self._interval
        if self._next_tick < loop.time():  # a tick ran late: the grid's next one, without a burst
            self._next_tick = grid_tick(loop.time(), self._phase, self._interval)
        self._ticker = loop.call_at(self._next_tick, self._tick)

    def _poll(self, target: ScrapeTarget, now: float) -> None:
        sent = target.sent_at
        if sent is not None:
            if now - sent >= self._timeout_s:
                target.connection.close()
                target.sent_at = None
                self._failed(target, "timeout", f"no answer within {self._timeout_s:g} s")
            return  # one GET at a time: a slow one skips ticks until it ends
        delegate = self._delegate
        if delegate is not None:
            if now < target.covered_until:  # known covered: no need to ask again each tick
                target.delegated += 1
                return
            covered = delegate.covered_until(target.endpoint, now)
            if covered is not None:
                target.covered_until = covered
                target.delegated += 1
                return
        target.sent_at = now
        target.connection.send(self._answered, self._unanswered, target)

    def _answered(self, tag: object, status: int, body: bytes) -> None:
        target = cast(ScrapeTarget, tag)
        target.sent_at = None
        if not self._running:
            return
        try:
            if status != 200:
                self._failed(target, "status", f"HTTP {status}")
                return
            try:
                metrics = parse_metrics(body.decode("utf-8", errors="replace"), target.dialect, self._clock(),
                                        self._lines)
            except MetricsPageError as exc:
                self._failed(target, "page", exc.message)
                return
            target.successes += 1
            if not target.view.healthy:
                log.warning("endpoint %s/%s answers its metrics again after %d failed scrapes",
                            target.endpoint.pool, target.endpoint.address, target.consecutive_failures)
            target.consecutive_failures = 0
            target.view = EndpointView(target.endpoint, metrics, healthy=True)
            target.adopted = False
            self._publish_soon(target)
        except Exception as exc:  # a bug must not end this endpoint's scrapes silently
            log.exception("scrape of %s failed unexpectedly", target.url)
            self._failed(target, "internal", repr(exc))

    def _unanswered(self, tag: object, kind: str, detail: str) -> None:
        target = cast(ScrapeTarget, tag)
        target.sent_at = None
        if self._running:
            self._failed(target, kind, detail)

    def _failed(self, target: ScrapeTarget, kind: str, detail: str) -> None:
        target.consecutive_failures += 1
        target.errors[kind] = target.errors.get(kind, 0) + 1
        target.last_error = detail
        if target.consecutive_failures == 1:
            log.debug("scrape of %s failed: %s", target.url, detail)
        view = target.view
        stale = view.metrics is None or view.age(self._clock()) >= self._stale_after
        if view.healthy and stale:
            # once per change of state: the replica is left out of picking until it answers again
            log.warning("endpoint %s/%s unhealthy, left out of picking: %s", target.endpoint.pool,
                        target.endpoint.address, detail)
            target.view = EndpointView(target.endpoint, view.metrics, healthy=False)
            target.adopted = False
            self._publish_soon(target)

    # -- publishing ----------------------------------------------------------------------------

    def _publish_soon(self, changed: ScrapeTarget) -> None:
        """Publish ``changed``'s pool with the other scrapes that end within ``PUBLISH_DELAY_S``: a
        snapshot per scrape rebuilt the pool's views each time (O(pool) per scrape, O(pool²) per
        interval: bench/results/scrape_publish.md)."""
        pool = changed.endpoint.pool
        targets = self._targets.get(pool)
        if targets is None or targets.get(changed.endpoint.address) is not changed:
            return  # a retired endpoint's last scrape: not ours to publish any more
        if not self._dirty:
            asyncio.get_running_loop().call_later(PUBLISH_DELAY_S, self._publish_dirty)
        self._dirty.setdefault(pool, set()).add(changed.endpoint.address)

    def _publish_dirty(self) -> None:
        dirty, self._dirty = self._dirty, {}
        pools = dict(self._snapshot.pools)
        for pool, changed in dirty.items():
            targets = self._targets.get(pool)
            if targets is not None:
                pools[pool] = self._pool_views(pool, targets, pools.get(pool), changed)
        self._swap(pools)
        if self._delegate is not None:
            for pool in dirty:
                self._delegate.scraped(pool)

    def _publish(self, pool: str, changed: set[str] | None = None) -> None:
        """Publish ``pool`` now; ``changed``: the endpoints whose views changed (None: not known)."""
        targets = self._targets.get(pool)
        if targets is None:
            return
        pools = dict(self._snapshot.pools)
        pools[pool] = self._pool_views(pool, targets, pools.get(pool), changed)
        self._swap(pools)

    def _pool_views(self, pool: str, targets: Mapping[str, ScrapeTarget],
                    previous: tuple[EndpointView, ...] | None, changed: set[str] | None) -> PoolViews:
        """The pool's new tuple: the last one with the changed views replaced (a copy: one new tuple
        per adopted batch rebuilt from the targets was half of adopting a peer's scrapes at 1,000
        endpoints), or built from the targets when the changes or the positions are not known."""
        if changed is not None and isinstance(previous, PoolViews) and len(previous) == len(targets):
            positions = self._positions.get(pool)
            if positions is None:
                positions = self._positions[pool] = {address: i for i, address in enumerate(targets)}
            replaced = PoolViews.with_replaced(
                previous, positions, changed, lambda a: t.view if (t := targets.get(a)) is not None else None)
            if replaced is not None:
                return replaced
        return PoolViews.after(previous, (t.view for t in targets.values()), changed)

    def _swap(self, pools: Mapping[str, tuple[EndpointView, ...]]) -> None:
        snapshot = EndpointSnapshot.of(pools, version=self._snapshot.version + 1)
        self._snapshot = snapshot
        if self._on_snapshot is not None:
            try:
                self._on_snapshot(snapshot)
            except Exception:
                log.exception("snapshot listener failed")
