"""Shared scrapes: one picker per pool scrapes the replicas, the others adopt what it publishes.

Why: without it every picker (each ``--workers`` process, each replica of a picker Deployment)
scrapes every replica every interval, so N pickers cost each model server N renders of its
``/metrics`` page per interval (vLLM renders it in its API server's Python process) and each picker
its own scraping CPU (bench/results/scrape_client.md: the whole of an idle picker's CPU;
bench/results/shared-scrapes.md measures what sharing saves).

How (this module is sans-IO; :class:`~gateway.picker.shared_state.sync.SharedStateSync` moves the
bytes through Redis in the round trips it already makes):

- **Leadership per pool**: a Redis lease (``P:{pool}:scrape-lease``, ``lease_s``) taken with
  ``SET NX`` and renewed by its holder every sync round (:data:`LEASE_SCRIPT`); a picker that
  stops gives it up at once (:data:`RELEASE_SCRIPT`), one that dies loses it after ``lease_s``.
- **The leader** scrapes every endpoint as before and appends the pool's views to the stream
  ``P:{pool}:scrapes`` once per round (:func:`encode_scrapes`: per endpoint, health, metrics and
  their *age*, not a clock reading, so the hosts' clocks need not agree).
- **A follower** adopts each batch into its scraper (:meth:`SharedScrapes.received`) and skips its
  own scrape of an endpoint while the last batch naming it arrived less than ``stale_after`` ago
  (:meth:`SharedScrapes.covers`). An endpoint the leader does not name (configurations differ for a
  moment), a leader that stopped publishing, or Redis gone: after ``stale_after`` the follower's own
  scrapes resume, exactly as without sharing, until batches arrive again.

What a follower gives up: its own view of a replica. A leader that cannot reach a replica that the
followers could (a partial network partition between hosts) makes every picker see it unhealthy;
pickers on one host (``--workers``) cannot differ there. ``--no-shared-scrapes`` keeps each picker's
own view where that matters more than the model servers' scrape load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol

from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView
from kvgate.proto import shared_state_pb2 as pb

SCRAPE_FORMAT = 1
"""The scrape-batch format this version writes (``ScrapeBatch.format``)."""
_U32_MAX = 0xFFFFFFFF

LEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"""
"""Take or renew the pool's scrape lease for ``ARGV[1]`` (``ARGV[2]`` ms); 1 when held after."""

RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
"""Give the lease up if ``ARGV[1]`` holds it (a stopping leader: a follower takes over at once)."""


class ScrapeRecord(NamedTuple):
    """One endpoint as another picker scraped it, its metrics re-timed on this picker's clock."""

    address: str
    metrics: EndpointMetrics | None
    healthy: bool


class ScrapeSource(Protocol):
    """What shared scrapes read from and write into: the picker's scraper."""

    def views(self, pool: str) -> tuple[EndpointView, ...]:
        """The pool's endpoints as this picker sees them now (to publish, when leading)."""
        ...

    def adopt(self, pool: str, records: Sequence[ScrapeRecord]) -> None:
        """Take another picker's scrapes of the pool's endpoints (those this picker has)."""
        ...


def encode_scrapes(views: Iterable[EndpointView], now: float) -> bytes:
    """A ``ScrapeBatch`` of ``views``, each metrics' age taken at ``now`` (the views' clock)."""
    batch = pb.ScrapeBatch(format=SCRAPE_FORMAT)
    for view in views:
        entry = batch.endpoints.add(address=view.address, healthy=view.healthy)
        m = view.metrics
        if m is None:
            continue
        entry.age_ms = min(_U32_MAX, max(0, round((now - m.updated_at) * 1000)))
        out = entry.metrics
        out.waiting = _u32(m.waiting)
        out.running = _u32(m.running)
        out.kv_cache_usage = m.kv_cache_usage
        out.active_loras.extend(sorted(m.active_loras))
        out.waiting_loras.extend(sorted(m.waiting_loras))
        out.max_loras = _u32(m.max_loras)
        if m.block_size is not None:
            out.block_size = _u32(m.block_size)
        if m.num_gpu_blocks is not None:
            out.num_gpu_blocks = _u32(m.num_gpu_blocks)
        out.served_models.extend(sorted(m.served_models))
    return batch.SerializeToString()


def decode_scrapes(data: bytes, now: float) -> list[ScrapeRecord]:
    """The records of one ``ScrapeBatch``, metrics timed ``age`` before ``now`` (this picker's
    clock); raises ValueError for bytes that are not a batch or a format this version cannot read."""
    try:
        batch = pb.ScrapeBatch.FromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"not a scrape batch: {exc}") from exc
    if batch.format != SCRAPE_FORMAT:
        raise ValueError(f"scrape batch format {batch.format} (this kvgate reads {SCRAPE_FORMAT})")
    records: list[ScrapeRecord] = []
    for entry in batch.endpoints:
        metrics: EndpointMetrics | None = None
        if entry.HasField("metrics"):
            m = entry.metrics
            metrics = EndpointMetrics(
                waiting=m.waiting,
                running=m.running,
                kv_cache_usage=m.kv_cache_usage,
                active_loras=frozenset(m.active_loras),
                waiting_loras=frozenset(m.waiting_loras),
                max_loras=m.max_loras,
                block_size=m.block_size if m.HasField("block_size") else None,
                num_gpu_blocks=m.num_gpu_blocks if m.HasField("num_gpu_blocks") else None,
                updated_at=now - entry.age_ms / 1000,
                served_models=frozenset(m.served_models),
            )
        records.append(ScrapeRecord(entry.address, metrics, entry.healthy))
    return records


def _u32(value: int) -> int:
    return max(0, min(int(value), _U32_MAX))


class SharedScrapes:
    """Who scrapes which pool, and which endpoints another picker's batches cover now.

    The sync tells it the lease replies (:meth:`set_leader`), asks it for the batches of the pools
    this picker leads (:meth:`batch`) and hands it each batch another picker wrote
    (:meth:`received`); the scraper asks :meth:`covers` before each scrape.
    """

    def __init__(self, source: ScrapeSource, stale_after: float, clock: Callable[[], float]) -> None:
        self.source = source
        self.stale_after = stale_after
        self._clock = clock
        self._leading: set[str] = set()
        self._last_batch: dict[str, tuple[float, frozenset[str]]] = {}
        """Per pool: when the last batch arrived and the endpoints it named (a batch names them all)."""
        self.batches_sent = 0
        self.batches_received = 0
        self.bad_batches = 0

    # --- leadership ---------------------------------------------------------------------------
    def leads(self, pool: str) -> bool:
        return pool in self._leading

    def set_leader(self, pool: str, leading: bool) -> None:
        if leading:
            self._leading.add(pool)
        else:
            self._leading.discard(pool)

    @property
    def leading(self) -> frozenset[str]:
        return frozenset(self._leading)

    def forget_pool(self, pool: str) -> None:
        self._leading.discard(pool)
        self._last_batch.pop(pool, None)

    # --- what the leader writes and the followers read ----------------------------------------
    def batch(self, pool: str) -> bytes:
        self.batches_sent += 1
        return encode_scrapes(self.source.views(pool), self._clock())

    def received(self, pool: str, data: bytes) -> None:
        """Adopt another picker's batch for ``pool`` (ignored while this picker leads it)."""
        if pool in self._leading:
            return
        now = self._clock()
        try:
            records = decode_scrapes(data, now)
        except ValueError:
            self.bad_batches += 1
            return
        self.batches_received += 1
        self._last_batch[pool] = (now, frozenset(record.address for record in records))
        self.source.adopt(pool, records)

    # --- what the scraper asks ----------------------------------------------------------------
    def covers(self, endpoint: Endpoint, now: float) -> bool:
        """True while another picker's batches keep ``endpoint`` fresh: skip scraping it."""
        if endpoint.pool in self._leading:
            return False
        last = self._last_batch.get(endpoint.pool)
        return last is not None and endpoint.address in last[1] and now - last[0] < self.stale_after
