"""Each picker's in-flight hash (and, for pools with flow control, its fairness hash), per pool:
this picker's written into a sync round's pipeline, its peers' read in the same round trip and
handed to the pools' mirrors and ledgers (``SharedStateSync`` runs the rounds; sync.py).

Keys (``P`` = ``key_prefix``)::

    P:{pool}:pickers             sorted set: picker id -> last publish (ms)
    P:{pool}:scrapers            sorted set: the same, of the pickers that share scrapes
    P:{pool}:inflight:{picker}   hash: endpoint -> "requests tokens" (expires after inflight_ttl_s)
    P:{pool}:fairness:{picker}   hash: "band tenant" -> TenantUsage (flow control; same expiry)

A picker's hashes expire with their TTL, so a dead picker's counts age out; when the peers could
not be read for ``inflight_ttl_s`` (Redis gone), their counts are dropped locally too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from redis.asyncio.client import Pipeline

from kvgate.gateway.picker.shared_state.codec import (
    decode_inflight,
    decode_tenant_usage,
    encode_inflight,
    encode_tenant_usage,
)
from kvgate.gateway.picker.shared_state.mirror import MirroredState
from kvgate.policies.state import InFlight
from kvgate.policies.tenant_ledger import TenantLedger, TenantUsage

Peer = tuple[str, bytes]
"""(pool, picker id)."""


class PeerHashes:
    def __init__(self, picker_id: str, key: Callable[[str, str], str], inflight_ttl_s: float,
                 mirrors: Mapping[str, MirroredState], ledgers: Mapping[str, TenantLedger],
                 clock: Callable[[], float]) -> None:
        """``mirrors``, ``ledgers``: the sync's own maps of pools (read as they are at each call)."""
        self.picker_id = picker_id
        self._key = key
        self._ttl_s = inflight_ttl_s
        self._mirrors = mirrors
        self._ledgers = ledgers
        self._clock = clock
        self.known: list[Peer] = []
        """The (pool, picker) pairs whose hashes the last round read."""
        self.read_at = clock()

    def publish(self, pipe: Pipeline, now_ms: int, *, shares_scrapes: bool) -> None:
        """This picker's hashes and its membership of each pool's picker sets (and scrapers' set)."""
        ttl_ms = int(self._ttl_s * 1000)
        for pool, mirror in self._mirrors.items():
            key = self._key(pool, f"inflight:{self.picker_id}")
            own = mirror.own_inflight()
            pipe.delete(key)
            if own:
                pipe.hset(key, mapping={a: encode_inflight(v) for a, v in own.items()})
                pipe.pexpire(key, ttl_ms)
            ledger = self._ledgers.get(pool)
            if ledger is not None:
                key = self._key(pool, f"fairness:{self.picker_id}")
                usage = ledger.own()
                pipe.delete(key)
                if usage:
                    pipe.hset(key, mapping=encode_tenant_usage(usage))  # type: ignore[arg-type]
                    pipe.pexpire(key, ttl_ms)
            for kind in ("pickers", "scrapers") if shares_scrapes else ("pickers",):
                members = self._key(pool, kind)
                pipe.zadd(members, {self.picker_id: now_ms})
                pipe.zremrangebyscore(members, "-inf", now_ms - 10 * ttl_ms)
                pipe.pexpire(members, 10 * ttl_ms)

    def unpublish(self, pipe: Pipeline) -> None:
        for pool in self._mirrors:
            pipe.delete(self._key(pool, f"inflight:{self.picker_id}"))
            pipe.delete(self._key(pool, f"fairness:{self.picker_id}"))
            pipe.zrem(self._key(pool, "pickers"), self.picker_id)
            pipe.zrem(self._key(pool, "scrapers"), self.picker_id)

    def fairness_wanted(self, peers: list[Peer]) -> list[bool]:
        """Per peer: whether its fairness hash is read too (its pool holds requests here)."""
        return [pool in self._ledgers for pool, _ in peers]

    def read(self, pipe: Pipeline, peers: list[Peer], fair: list[bool]) -> None:
        """Each peer's in-flight hash, and its fairness hash where ``fair`` says."""
        for (pool, member), with_fairness in zip(peers, fair, strict=True):
            pipe.hgetall(self._key(pool, f"inflight:{member.decode()}"))
            if with_fairness:
                pipe.hgetall(self._key(pool, f"fairness:{member.decode()}"))

    def apply(self, pools: list[str], peers: list[Peer], fair: list[bool], replies: list[Any]) -> int:
        """The replies of :meth:`read` into the mirrors (peers' in-flight counts) and ledgers; the
        number of entries that could not be read is returned."""
        self.known = peers
        bad_entries = 0
        per_pool: dict[str, list[dict[str, InFlight]]] = {pool: [] for pool in pools}
        usage: dict[str, dict[str, dict[tuple[int, str], TenantUsage]]] = {pool: {} for pool in self._ledgers}
        answers = iter(replies)
        for (pool, member), with_fairness in zip(peers, fair, strict=True):
            fields = next(answers)
            if with_fairness:
                figures, bad = decode_tenant_usage(next(answers))
                bad_entries += bad
                if pool in usage:
                    usage[pool][member.decode()] = figures
            contribution: dict[str, InFlight] = {}
            for address, value in fields.items():
                try:
                    contribution[address.decode()] = decode_inflight(value)
                except ValueError:
                    bad_entries += 1
            per_pool[pool].append(contribution)
        for pool, contributions in per_pool.items():
            mirror = self._mirrors.get(pool)
            if mirror is not None:
                mirror.set_peer_inflight(contributions)
        now = self._clock()
        for pool, figures_by_peer in usage.items():
            ledger = self._ledgers.get(pool)
            if ledger is not None:
                ledger.set_peers(figures_by_peer, now)
        self.read_at = now
        return bad_entries

    def expire_stale(self) -> None:
        """Peers not read for the in-flight TTL: their counts and usage no longer count."""
        if self._clock() - self.read_at > self._ttl_s:
            for mirror in self._mirrors.values():
                if mirror.peer_inflight():
                    mirror.set_peer_inflight([])
            for ledger in self._ledgers.values():
                ledger.forget_peers()
