"""Shared scrapes: the pickers sharing state through Redis divide each pool's endpoints among
them; each scrapes its share and publishes what it saw, the others adopt it.

Why: without it every picker (each ``--workers`` process, each replica of a picker Deployment)
scrapes every replica every interval, so N pickers cost each model server N renders of its
``/metrics`` page per interval (vLLM renders it in its API server's Python process) and each picker
its own scraping CPU (bench/results/scrape_client.md: the whole of an idle picker's CPU;
bench/results/shared-scrapes.md measures what sharing saves). With one picker scraping a whole pool
for all (this module's first form, a lease per pool), that picker's CPU bounded the pool at a few
hundred replicas (issue 35); divided, each picker scrapes 1/N of it.

How (this module is sans-IO; :class:`~gateway.picker.shared_state.sync.SharedStateSync` moves the
bytes through Redis in the round trips it already makes):

- **Shares by rendezvous hashing**: each sync round reads the pool's live pickers (the sorted set
  each picker refreshes every round; :meth:`SharedScrapes.set_members`); an endpoint belongs to the
  picker with the highest hash of (picker, endpoint), so a picker joining or leaving moves only its
  own share. Alone, a picker owns every endpoint.
- **Each picker** scrapes its share and, as soon as a tick's answers are in (the scraper says so:
  :meth:`SharedScrapes.scraped`; the sync's publisher gathers 5 ms more), appends the views it
  scraped since its last batch to the stream ``P:{pool}:scrapes`` (:func:`encode_scrapes`: per
  endpoint, health, metrics and their *age*, not a clock reading, so the hosts' clocks need not
  agree); it adopts the others' batches (:meth:`SharedScrapes.received`). Published on the sync
  round instead, an adopted view was older by up to a round (50 ms) more.
- **An endpoint it does not own** is skipped while the picker that last named it named it lately
  and still publishes (:meth:`SharedScrapes.covered_until`). A picker that stopped (it leaves the
  set at once) or died (its entry ages out after the in-flight TTL), an endpoint its owner does not
  name (configurations differ for a moment), Redis gone: after ``stale_after`` (or
  ``NAMED_WITHIN`` of them for an endpoint its owner stopped naming) the others scrape it
  themselves, exactly as without sharing, until batches name it again.

What a picker gives up: its own view of the replicas others scrape. An owner that cannot reach a
replica the others could (a partial network partition between hosts) makes every picker see it
unhealthy; pickers on one host (``--workers``) cannot differ there. ``--no-shared-scrapes`` keeps
each picker's own view where that matters more than the model servers' scrape load.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol

import msgspec

from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView
from kvgate.proto import shared_state_pb2 as pb

SCRAPE_FORMAT = 2
"""The scrape-batch format this version writes (:func:`encode_scrapes`); it reads 1 too."""
_ENCODER = msgspec.msgpack.Encoder()
_NONE: frozenset[str] = frozenset()
_U32_MAX = 0xFFFFFFFF

class ScrapeRecord(NamedTuple):
    """One endpoint as another picker scraped it, its metrics re-timed on this picker's clock."""

    address: str
    metrics: EndpointMetrics | None
    healthy: bool


class ScrapeSource(Protocol):
    """What shared scrapes read from and write into: the picker's scraper."""

    def own_views(self, pool: str, since: float) -> tuple[EndpointView, ...]:
        """The pool's endpoints this picker scraped itself (not adopted) at ``since`` or later, or
        found unhealthy: what it publishes."""
        ...

    def adopt(self, pool: str, records: Sequence[ScrapeRecord]) -> None:
        """Take another picker's scrapes of the pool's endpoints (those this picker has)."""
        ...


def encode_scrapes(views: Iterable[EndpointView], now: float) -> bytes:
    """A scrape batch of ``views`` (format 2: msgpack), each metrics' age taken at ``now`` (the
    views' clock): ``[2, [row, ...]]``, a row ``[address, healthy, age_ms, waiting, running, kv,
    active_loras, waiting_loras, max_loras, block_size, num_gpu_blocks, served_models,
    running_reported]``, or ``[address, healthy]`` for an endpoint never scraped. Every picker
    reads every other picker's share each round, and format 1 (the ``ScrapeBatch`` message of
    proto/shared_state.proto, still read) cost several times more to write and read in Python's
    protobuf (bench/results/scrape_batch_codec.md)."""
    rows: list[tuple[object, ...]] = []
    for view in views:
        m = view.metrics
        if m is None:
            rows.append((view.address, view.healthy))
            continue
        age_ms = min(_U32_MAX, max(0, round((now - m.updated_at) * 1000)))
        rows.append((view.address, view.healthy, age_ms, m.waiting, m.running, m.kv_cache_usage,
                     sorted(m.active_loras), sorted(m.waiting_loras), m.max_loras, m.block_size,
                     m.num_gpu_blocks, sorted(m.served_models), m.running_reported))
    return _ENCODER.encode((SCRAPE_FORMAT, rows))


class _Row(msgspec.Struct, array_like=True):
    """One endpoint in a format-2 batch (:func:`encode_scrapes`); types checked as it is read."""

    address: str
    healthy: bool
    age_ms: int | None = None
    """None: never scraped (the row ends here)."""
    waiting: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0
    active_loras: list[str] = []
    waiting_loras: list[str] = []
    max_loras: int = 0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    served_models: list[str] = []
    running_reported: bool = True


_HEAD = msgspec.msgpack.Decoder(tuple[int, msgspec.Raw])
_ROWS = msgspec.msgpack.Decoder(list[_Row])


def decode_scrapes(data: bytes, now: float) -> list[ScrapeRecord]:
    """The records of one scrape batch (format 2, or format 1 from a kvgate of the previous
    version), metrics timed ``age`` before ``now`` (this picker's clock); raises ValueError for
    bytes that are not a batch or a format this version cannot read."""
    if data[:1] == b"\x08":  # a protobuf ScrapeBatch: its field 1 (format) comes first
        return _decode_format1(data, now)
    try:
        version, body = _HEAD.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a scrape batch: {exc}") from exc
    if version != SCRAPE_FORMAT:
        raise ValueError(f"scrape batch format {version} (this kvgate reads 1 and {SCRAPE_FORMAT})")
    try:
        rows = _ROWS.decode(body)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a scrape batch: {exc}") from exc
    records: list[ScrapeRecord] = []
    for row in rows:
        if row.age_ms is None:
            records.append(ScrapeRecord(row.address, None, row.healthy))
            continue
        metrics = EndpointMetrics(
            waiting=row.waiting, running=row.running, kv_cache_usage=row.kv_cache_usage,
            active_loras=frozenset(row.active_loras) if row.active_loras else _NONE,
            waiting_loras=frozenset(row.waiting_loras) if row.waiting_loras else _NONE,
            max_loras=row.max_loras, block_size=row.block_size, num_gpu_blocks=row.num_gpu_blocks,
            updated_at=now - row.age_ms / 1000,
            served_models=frozenset(row.served_models) if row.served_models else _NONE,
            running_reported=row.running_reported,
        )
        records.append(ScrapeRecord(row.address, metrics, row.healthy))
    return records


def _decode_format1(data: bytes, now: float) -> list[ScrapeRecord]:
    try:
        batch = pb.ScrapeBatch.FromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"not a scrape batch: {exc}") from exc
    if batch.format != 1:
        raise ValueError(f"scrape batch format {batch.format} (this kvgate reads 1 and {SCRAPE_FORMAT})")
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
                running_reported=not m.running_unreported,
            )
        records.append(ScrapeRecord(entry.address, metrics, entry.healthy))
    return records


def _u32(value: int) -> int:
    return max(0, min(int(value), _U32_MAX))


NAMED_WITHIN = 5
"""An endpoint another picker named within this many ``stale_after`` is still that picker's while it
publishes (its GET of the endpoint may be slow: the owner times it out and says so itself)."""


def owner_of(members: Sequence[str], address: str) -> str:
    """The picker of ``members`` that scrapes ``address``: rendezvous (highest random weight)
    hashing, the same answer in every process (not Python's salted ``hash``)."""
    key = address.encode()
    return max(members, key=lambda m: hashlib.blake2b(key, digest_size=8, key=m.encode()[:64]).digest())


class SharedScrapes:
    """Which endpoints of each pool this picker scrapes, and which other pickers' batches cover.

    The sync tells it each round's live pickers (:meth:`set_members`), asks it for this picker's
    batch of each pool (:meth:`batch`) and hands it each batch another picker wrote
    (:meth:`received`); the scraper asks :meth:`covered_until` before each scrape.
    """

    def __init__(self, source: ScrapeSource, stale_after: float, clock: Callable[[], float],
                 me: str) -> None:
        self.source = source
        self.stale_after = stale_after
        self._clock = clock
        self.me = me
        self._members: dict[str, tuple[str, ...]] = {}
        """Per pool: the live pickers as the last round read them (this one among them)."""
        self._owners: dict[str, dict[str, bool]] = {}
        """Per pool: endpoint → whether this picker owns it (for the members above)."""
        self._named: dict[str, dict[str, tuple[str, float]]] = {}
        """Per pool and endpoint: the picker whose batch last named it, and when."""
        self._heard: dict[str, dict[str, float]] = {}
        """Per pool and publishing picker: when its last batch arrived."""
        """Per pool and publishing picker: when its last batch arrived and the endpoints it named."""
        self._leading: dict[str, float] = {}
        """Per pool: when this picker last published scrapes of it."""
        self._due: set[str] = set()
        """Pools with scrapes made since their last batch."""
        self._batched_at: dict[str, float] = {}
        """Per pool: when its last batch was made (the next holds the views scraped since)."""
        self._read_at: float | None = None
        """When this picker's last read of the streams came back (None: none yet, or it failed)."""
        self.wake: Callable[[], None] = lambda: None
        """Called when a scrape is due to be published (the sync's publisher waits for it)."""
        self.batches_sent = 0
        self.batches_received = 0
        self.bad_batches = 0

    # --- shares -------------------------------------------------------------------------------
    def set_members(self, pool: str, members: Iterable[str]) -> None:
        """The pool's live pickers now (this one is added if missing)."""
        live = tuple(sorted({*members, self.me}))
        if self._members.get(pool) != live:
            self._members[pool] = live
            self._owners.pop(pool, None)

    def owns(self, pool: str, address: str) -> bool:
        owners = self._owners.setdefault(pool, {})
        mine = owners.get(address)
        if mine is None:
            members = self._members.get(pool)
            mine = owners[address] = members is None or owner_of(members, address) == self.me
        return mine

    def leads(self, pool: str) -> bool:
        """Whether this picker published scrapes of ``pool`` within ``stale_after`` (it scrapes a
        share of it)."""
        at = self._leading.get(pool)
        return at is not None and self._clock() - at < self.stale_after

    @property
    def leading(self) -> frozenset[str]:
        return frozenset(pool for pool in self._leading if self.leads(pool))

    def forget_pool(self, pool: str) -> None:
        self._leading.pop(pool, None)
        self._due.discard(pool)
        self._batched_at.pop(pool, None)
        self._members.pop(pool, None)
        self._owners.pop(pool, None)
        self._named.pop(pool, None)
        self._heard.pop(pool, None)

    # --- what each picker writes and the others read ------------------------------------------
    def scraped(self, pool: str) -> None:
        """The scraper published new scrapes of ``pool``: they are to be shared now."""
        self._due.add(pool)
        self.wake()

    def take_due(self) -> list[str]:
        due, self._due = self._due, set()
        return sorted(due)

    def batch(self, pool: str) -> bytes | None:
        """This picker's views of ``pool`` scraped since its last batch of it (and those it found
        unhealthy); None: none."""
        now = self._clock()
        since = max(self._batched_at.get(pool, -math.inf), now - self.stale_after)
        views = self.source.own_views(pool, since)
        self._batched_at[pool] = now
        if not views:
            return None
        self._leading[pool] = now
        self.batches_sent += 1
        return encode_scrapes(views, now)

    def received(self, pool: str, data: bytes, origin: str = "") -> None:
        """Adopt the batch another picker (``origin``) wrote for ``pool``."""
        if origin == self.me:
            return
        now = self._clock()
        try:
            records = decode_scrapes(data, now)
        except ValueError:
            self.bad_batches += 1
            return
        self.batches_received += 1
        self._heard.setdefault(pool, {})[origin] = now
        named = self._named.setdefault(pool, {})
        stamp = (origin, now)
        for record in records:
            named[record.address] = stamp
        if self.batches_received % 256 == 0:  # endpoints nobody names any more (removed) are forgotten
            horizon = now - NAMED_WITHIN * self.stale_after
            for address in [a for a, (_, at) in named.items() if at < horizon]:
                del named[address]
            heard = self._heard[pool]
            for name in [n for n, at in heard.items() if at < horizon and n != origin]:
                del heard[name]
        # This picker's own share is its own scrapes' (another's view of it, taken while the shares
        # moved, would stand in for them until the next scrape and drop out of this picker's batch).
        self.source.adopt(pool, [r for r in records if not self.owns(pool, r.address)])

    def read_done(self, at: float) -> None:
        """A read of the streams came back at ``at`` (with batches or without)."""
        self._read_at = at

    def read_failed(self) -> None:
        """A read failed (Redis gone): peers' silence is judged as of now again."""
        self._read_at = None

    # --- what the scraper asks ----------------------------------------------------------------
    def covered_until(self, endpoint: Endpoint, now: float) -> float | None:
        """Until when another picker keeps ``endpoint`` fresh (skip scraping it till then): the
        picker that last named it names it still (within ``NAMED_WITHIN`` × ``stale_after``: a batch
        holds only what was scraped since the last, so a slow GET leaves an endpoint out of a few)
        and publishes (a batch within ``stale_after``). None: scrape it now (this picker owns it,
        nobody names it, or its publisher went quiet).

        Silence is judged as of this picker's last read that came back, not as of now: a picker whose
        own event loop lags (CPU-saturated, its peers' batches waiting unread in its socket) would
        otherwise find every peer quiet, scrape their shares too and lag further (seen on the
        16-core machine: one of four pickers at 1,000 endpoints made ~8,800 scrapes a second for a
        share of ~5,000). Bounded: never more than ``NAMED_WITHIN`` × ``stale_after`` back; a read
        that failed (Redis gone) judges as of now, as before."""
        pool = endpoint.pool
        if self.owns(pool, endpoint.address):
            return None
        read_at = self._read_at
        as_of = now if read_at is None else max(min(now, read_at), now - NAMED_WITHIN * self.stale_after)
        named = self._named.get(pool, {}).get(endpoint.address)
        if named is None or as_of - named[1] >= NAMED_WITHIN * self.stale_after:
            return None
        heard = self._heard.get(pool, {}).get(named[0])
        if heard is None or as_of - heard >= self.stale_after:
            return None
        return heard + self.stale_after + (now - as_of)
