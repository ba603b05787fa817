"""``SharedStateSync``: the IO shell that keeps every pool's ``MirroredState`` in step through Redis.

Keys, per pool (``P`` = ``key_prefix``)::

    P:{pool}:prefix              stream: event batches of prefix insertions (trimmed by age, prefix_ttl_s)
    P:{pool}:session             stream: event batches of session pins (trimmed by age, session_ttl_s)
    P:{pool}:pickers             sorted set: picker id -> last publish (ms)
    P:{pool}:scrapers            sorted set: the same, of the pickers that share scrapes
    P:{pool}:inflight:{picker}   hash: endpoint -> "requests tokens" (expires after inflight_ttl_s)
    P:{pool}:fairness:{picker}   hash: "band tenant" -> TenantUsage (flow control; same expiry)
    P:{pool}:scrapes             stream: each picker's scrapes of its share, one batch per round (short)
    P:{pool}:kv-events           stream: KV-event messages a picker's bound socket received (kv_relay.py)

Two background tasks. The *sync* loop, every ``sync_interval_s``: appends each mirror's outbox as
one batch entry per stream, republishes this picker's in-flight hash (with its TTL, so a dead
picker's counts age out) and reads every live peer's hash into the mirrors. The *read* loop tails
the streams (a blocking XREAD) and applies peers' events (its own are skipped by origin). A new
picker starts reading the streams ``ttl`` back, so it learns the recent prefix map at once.
When Redis fails, both loops back off (``RedisLink``) and routing goes on with the local view;
peers' in-flight counts older than ``inflight_ttl_s`` are dropped locally too.

With shared scrapes (:meth:`SharedStateSync.share_scrapes`), each round also tells
:class:`SharedScrapes` the pool's live pickers that share scrapes (who scrapes which endpoint
follows from them: a picker run with ``--no-shared-scrapes`` publishes none, so it owns no share) and
appends this picker's scrapes of its share; the read loop hands the other pickers' batches to it
(scrapes.py says why and how).

For a pool with flow control (:meth:`SharedStateSync.ledger_for`), each round also publishes this
picker's tenant usage (work dispatched and held per band and tenant) and reads its peers' beside
their in-flight hashes, into the pool's ``TenantLedger`` (policies/tenant_ledger.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import Pipeline

from kvgate.gateway.picker.redis_link import RedisLink
from kvgate.gateway.picker.shared_state.codec import (
    BATCH_FIELD,
    PrefixInsert,
    SharedEvent,
    UnknownFormat,
    decode_entry,
    encode_batch,
)
from kvgate.gateway.picker.shared_state.kv_relay import FIELD as KV_FIELD
from kvgate.gateway.picker.shared_state.kv_relay import STREAM_LENGTH as KV_STREAM_LENGTH
from kvgate.gateway.picker.shared_state.kv_relay import KvEventsRelay
from kvgate.gateway.picker.shared_state.mirror import MirroredState
from kvgate.gateway.picker.shared_state.peer_hashes import Peer, PeerHashes
from kvgate.gateway.picker.shared_state.scrapes import ScrapeSource, SharedScrapes
from kvgate.policies.state import DEFAULT_MAX_SESSIONS
from kvgate.policies.tenant_ledger import TenantLedger

log = logging.getLogger(__name__)

SCRAPES_GATHER_S = 0.005
"""A batch of scrapes waits this long after the first is due, for the others of the same tick."""


def new_picker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(slots=True)
class SyncCounters:
    events_sent: int = 0
    events_lost: int = 0
    """Taken from an outbox for a write that failed (Redis went away): not shared."""
    events_writing: int = 0
    """Taken from an outbox, their write still in flight (counted as sent or lost once it ends)."""
    events_received: int = 0
    bad_entries: int = 0
    unknown_format: int = 0
    """Entries a different kvgate version wrote in a format this one cannot read (skipped)."""
    syncs: int = 0
    peer_reads: int = 0
    peers: int = 0


class SharedStateSync:
    def __init__(
        self,
        link: RedisLink,
        *,
        picker_id: str | None = None,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        """``max_sessions``: session pins (stored responses' too) each pool's mirror keeps."""
        self.link = link
        self._max_sessions = max_sessions
        self.settings = link.settings
        self.picker_id = picker_id or new_picker_id()
        self.counters = SyncCounters()
        self._wall = wall_clock
        self._clock = clock
        self._mirrors: dict[str, MirroredState] = {}
        self._ledgers: dict[str, TenantLedger] = {}
        self._last_ids: dict[bytes, bytes] = {}
        self._peers = PeerHashes(self.picker_id, self._key, self.settings.inflight_ttl_s, self._mirrors,
                                 self._ledgers, clock)
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False
        self.scrapes: SharedScrapes | None = None
        self.kv_relay: KvEventsRelay | None = None
        self._due = asyncio.Event()
        """Set when scrapes or KV-event messages wait to be written (the publisher's loop)."""

    def share_kv_events(self, deliver: Callable[[str, list[bytes]], None]) -> KvEventsRelay:
        """Relay the KV-event messages bound sockets receive between the pools' pickers
        (``deliver(pool, frames)``: the others' messages, for this picker's subscribers)."""
        self.kv_relay = KvEventsRelay(deliver)
        self.kv_relay.wake = self._due.set
        return self.kv_relay

    def follow_kv_events(self, pools: Iterable[str]) -> None:
        """Read the relayed KV events of ``pools`` (and no others), from now on."""
        relay = self.kv_relay
        if relay is None:
            return
        wanted = set(pools)
        for pool in relay.followed - wanted:
            self._last_ids.pop(self._key(pool, "kv-events").encode(), None)
        for pool in wanted - relay.followed:
            self._last_ids[self._key(pool, "kv-events").encode()] = f"{self._wall_ms()}-0".encode()
        relay.followed = wanted

    def share_scrapes(self, source: ScrapeSource, stale_after: float) -> SharedScrapes:
        """Share ``source``'s scrapes with the other pickers (the scraper's delegate is returned)."""
        self.scrapes = SharedScrapes(source, stale_after, self._clock, self.picker_id)
        self.scrapes.wake = self._due.set
        for pool in self._mirrors:
            self._tail_scrapes(pool)
        return self.scrapes

    def _tail_scrapes(self, pool: str) -> None:
        # The last second of batches: a picker starting beside others adopts their views at once.
        self._last_ids[self._key(pool, "scrapes").encode()] = f"{self._wall_ms() - 1000}-0".encode()

    # --- pools --------------------------------------------------------------------------------
    def state_for(self, pool: str) -> MirroredState:
        """The pool's mirror (created on first use; the same one afterwards)."""
        mirror = self._mirrors.get(pool)
        if mirror is None:
            mirror = self._mirrors[pool] = MirroredState(outbox_limit=self.settings.outbox_limit,
                                                         max_sessions=self._max_sessions)
            start = f"{self._wall_ms() - int(self.settings.prefix_ttl_s * 1000)}-0".encode()
            self._last_ids[self._key(pool, "prefix").encode()] = start
            start = f"{self._wall_ms() - int(self.settings.session_ttl_s * 1000)}-0".encode()
            self._last_ids[self._key(pool, "session").encode()] = start
            if self.scrapes is not None:
                self._tail_scrapes(pool)
        return mirror

    def ledger_for(self, pool: str) -> TenantLedger:
        """The pool's tenant ledger (created on first use): shared fairness for its held requests."""
        ledger = self._ledgers.get(pool)
        if ledger is None:
            ledger = self._ledgers[pool] = TenantLedger()
        return ledger

    def drop_ledger(self, pool: str) -> None:
        """The pool no longer holds requests (flow control off): nothing more to publish."""
        self._ledgers.pop(pool, None)

    def drop_pool(self, pool: str) -> None:
        self._mirrors.pop(pool, None)
        self._ledgers.pop(pool, None)
        for kind in ("prefix", "session", "scrapes", "kv-events"):
            self._last_ids.pop(self._key(pool, kind).encode(), None)
        if self.kv_relay is not None:
            self.kv_relay.followed.discard(pool)
        if self.scrapes is not None:
            self.scrapes.forget_pool(pool)

    @property
    def mirrors(self) -> Mapping[str, MirroredState]:
        return self._mirrors

    def events_dropped(self) -> int:
        return sum(m.dropped for m in self._mirrors.values())

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if not self._tasks:
            self._running = True
            self._tasks = [
                asyncio.create_task(self._loop(self.sync_once), name="kvgate-redis-sync"),
                asyncio.create_task(self._loop(self.read_once), name="kvgate-redis-read"),
                asyncio.create_task(self._publish_loop(), name="kvgate-redis-scrapes"),
            ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        self._running = False
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)  # an outer cancellation still propagates
            if pending:
                log.warning("shared-state loops did not stop in time")
        if self.link.healthy:  # leave no in-flight counts behind for the peers
            await self.link.run("unpublish", self._peers.unpublish)

    async def _loop(self, step: Callable[[], Any]) -> None:
        """``step`` every sync interval; at once again after a step that returned True (a read
        that brought entries: more may wait, and a blocking read waits for them itself)."""
        interval = self.settings.sync_interval_s
        task = asyncio.current_task()
        while self._running:
            started = self._clock()
            again = False
            try:
                again = await step() is True
            except Exception:  # a bug here must not end sharing for good
                log.exception("shared-state loop step failed")
            if task is not None and task.cancelling():
                # A cancellation that reached a Redis call as it timed out can come back as a
                # timeout (Python 3.11's asyncio.timeout): seen as a loop that outlived its cancel.
                raise asyncio.CancelledError
            if not again:
                await asyncio.sleep(max(0.0, interval - (self._clock() - started)))

    async def _publish_loop(self) -> None:
        """Publish this picker's scrapes as soon as they are made (the scraper says so: a batch
        waiting for the next sync round aged every adopted view by up to an interval more), and the
        KV-event messages its bound sockets received."""
        due = self._due
        task = asyncio.current_task()
        while self._running:
            await due.wait()
            await asyncio.sleep(SCRAPES_GATHER_S)  # the rest of the tick's answers join this batch
            due.clear()
            try:
                await self.publish_scrapes()
                await self.publish_kv_events()
            except Exception:  # a bug here must not end sharing for good
                log.exception("publishing scrapes failed")
            if task is not None and task.cancelling():
                raise asyncio.CancelledError  # one that came back as a Redis call's timeout (``_loop``)

    async def publish_kv_events(self) -> None:
        """Append each pool's relayed KV-event messages as one entry of its stream."""
        relay = self.kv_relay
        if relay is None or not self.link.available:
            return
        entries = relay.take()
        if not entries:
            return

        def write(pipe: Pipeline) -> None:
            for pool, payload in entries:
                pipe.xadd(self._key(pool, "kv-events"), {"o": self.picker_id, KV_FIELD: payload},
                          maxlen=KV_STREAM_LENGTH, approximate=True)

        await self.link.run("kv-events", write)

    async def publish_scrapes(self) -> None:
        """Append to each pool's stream the views this picker scraped since its last batch there."""
        scrapes = self.scrapes
        if scrapes is None:
            return
        pools = scrapes.take_due()
        if not self.link.available:
            return
        batches = [(pool, batch) for pool in pools
                   if pool in self._mirrors and (batch := scrapes.batch(pool)) is not None]
        if not batches:
            return

        def write(pipe: Pipeline) -> None:
            for pool, batch in batches:
                pipe.xadd(self._key(pool, "scrapes"), {"o": self.picker_id, BATCH_FIELD: batch},
                          maxlen=256, approximate=True)

        await self.link.run("scrapes", write)

    # --- one round of each loop (also called directly by tests) -------------------------------
    async def sync_once(self) -> None:
        """Flush outboxes, publish own in-flight counts, read the peers' counts."""
        self._peers.expire_stale()
        if not self.link.available:
            return
        batches: list[tuple[str, str, list[SharedEvent]]] = []
        for pool, mirror in self._mirrors.items():
            events = mirror.take_outbox(self.settings.batch_events)
            prefix: list[SharedEvent] = [e for e in events if isinstance(e, PrefixInsert)]
            sessions: list[SharedEvent] = [e for e in events if not isinstance(e, PrefixInsert)]
            batches += [(pool, "prefix", prefix), (pool, "session", sessions)]
        now_ms = self._wall_ms()
        pools = list(self._mirrors)
        known = list(self._peers.known)
        fair = self._peers.fairness_wanted(known)
        scrapes = self.scrapes

        def write(pipe: Pipeline) -> None:
            s = self.settings
            for pool, kind, events in batches:
                if events:
                    ttl = s.prefix_ttl_s if kind == "prefix" else s.session_ttl_s
                    pipe.xadd(
                        self._key(pool, kind),
                        {"o": self.picker_id, BATCH_FIELD: encode_batch(events)},
                        minid=now_ms - int(ttl * 1000),
                        approximate=True,
                    )
            self._peers.publish(pipe, now_ms, shares_scrapes=scrapes is not None)
            since = now_ms - int(s.inflight_ttl_s * 1000)
            for pool in pools:
                pipe.zrangebyscore(self._key(pool, "pickers"), since, "+inf")
            if scrapes is not None:
                for pool in pools:
                    pipe.zrangebyscore(self._key(pool, "scrapers"), since, "+inf")
            # The peers the last round knew, read in this same round trip: while nobody joins or
            # leaves (the usual case) a round is one round trip, not two.
            self._peers.read(pipe, known, fair)

        taken = sum(len(events) for _, _, events in batches)
        self.counters.events_writing += taken
        try:
            replies = await self.link.run("sync", write)
        finally:
            self.counters.events_writing -= taken
        if replies is None:
            self.counters.events_lost += taken
            return
        self.counters.syncs += 1
        self.counters.events_sent += taken
        # The pipeline ends with the pools' picker lists, their scrapers' lists (when this picker
        # shares scrapes) and the known peers' hashes.
        lists = len(pools) * (1 if scrapes is None else 2)
        tail = replies[len(replies) - lists - len(known) - sum(fair) :]
        members: list[list[bytes]] = tail[: len(pools)]
        peer_replies = tail[lists:]
        if scrapes is not None:
            for pool, ids in zip(pools, tail[len(pools) : lists], strict=True):
                scrapes.set_members(pool, (m.decode() for m in ids))
        me = self.picker_id.encode()
        wanted = [(pool, m) for pool, ids in zip(pools, members, strict=True) for m in ids if m != me]
        if wanted == known:
            self._apply_peers(pools, wanted, fair, peer_replies)
        else:  # someone joined or left: read the peers as they are now
            await self._read_peers(pools, wanted)

    async def _read_peers(self, pools: list[str], wanted: list[Peer]) -> None:
        fair = self._peers.fairness_wanted(wanted)
        replies = await self.link.run(
            "peers", lambda pipe: self._peers.read(pipe, wanted, fair)) if wanted else []
        if replies is None:
            return
        self._apply_peers(pools, wanted, fair, replies)

    def _apply_peers(self, pools: list[str], wanted: list[Peer], fair: list[bool],
                     replies: list[Any]) -> None:
        self.counters.bad_entries += self._peers.apply(pools, wanted, fair, replies)
        self.counters.peer_reads += 1
        self.counters.peers = len(wanted)

    async def read_once(self) -> bool:
        """Tail the streams once (blocking up to ``read_block_s``) and apply peers' events; True
        when entries came."""
        if not self._last_ids:
            return False
        if not self.link.available:
            if self.scrapes is not None:
                self.scrapes.read_failed()
            return False
        streams = dict(self._last_ids)
        block_ms = max(1, int(self.settings.read_block_s * 1000))
        replies = await self.link.run(
            "read",
            lambda pipe: pipe.xread(streams, count=1000, block=block_ms),  # type: ignore[arg-type]
            extra_wait_s=2 * self.settings.read_block_s,
        )
        if self.scrapes is not None:
            if replies is None:
                self.scrapes.read_failed()
            else:
                self.scrapes.read_done(self._clock())
        if not replies or not replies[0]:
            return False
        result = replies[0]
        items = result.items() if isinstance(result, dict) else result
        me = self.picker_id.encode()
        for stream_key, entries in items:
            key = stream_key if isinstance(stream_key, bytes) else str(stream_key).encode()
            pool = self._pool_of(key)
            mirror = self._mirrors.get(pool) if pool is not None else None
            scrape_batches = key.endswith(b":scrapes")
            kv_events = key.endswith(b":kv-events")
            for entry_id, fields in entries:
                if key in self._last_ids:
                    self._last_ids[key] = entry_id
                if mirror is None or pool is None or fields.get(b"o") == me:
                    continue
                if kv_events:
                    payload = fields.get(KV_FIELD)
                    if self.kv_relay is not None and payload is not None:
                        self.kv_relay.received_entry(pool, payload)
                    continue
                if scrape_batches:
                    batch = fields.get(BATCH_FIELD)
                    origin = fields.get(b"o", b"")
                    if self.scrapes is not None and batch is not None:
                        self.scrapes.received(pool, batch, origin.decode(errors="replace"))
                    continue
                try:
                    events = decode_entry(fields)
                except UnknownFormat as exc:
                    self.counters.unknown_format += 1
                    if self.counters.unknown_format == 1:
                        log.warning("skipping shared-state entries a different kvgate wrote: %s", exc)
                    continue
                except ValueError:
                    self.counters.bad_entries += 1
                    continue
                mirror.apply_peer_events(events)
                self.counters.events_received += len(events)
        return True

    # --- keys ---------------------------------------------------------------------------------
    def _key(self, pool: str, kind: str) -> str:
        return f"{self.settings.key_prefix}:{pool}:{kind}"

    def _pool_of(self, key: bytes) -> str | None:
        text = key.decode()
        head = f"{self.settings.key_prefix}:"
        if not text.startswith(head):
            return None
        return text[len(head) :].rpartition(":")[0]

    def _wall_ms(self) -> int:
        return int(self._wall() * 1000)
