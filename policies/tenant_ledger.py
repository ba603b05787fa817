"""Tenants' GPU work across pickers (issue 34: fairness that holds when several pickers hold
requests for one pool). Sans IO: the shared-state shell publishes :meth:`TenantLedger.own` and feeds
:meth:`TenantLedger.set_peers` through Redis once per sync round; the holding area
(``extproc.holding``) records its dispatches and asks the two questions below. No Redis round trip
on the request path: every answer comes from the last round's copy (bounded staleness: one sync
interval).

Each picker orders its own held requests fairly (``policies.holding_queue``), but alone it sees only
its own share of each tenant's traffic. Two things make fairness global:

- **Credits**: the work peers dispatched for a tenant since the last round is charged to that
  tenant's place in this picker's queue (:meth:`TenantLedger.take_credits` →
  ``HoldingQueue.credit``), as if this picker had served it: a tenant that peers serve a lot waits
  here behind tenants served less.
- **Yielding** (:meth:`TenantLedger.should_yield`): the pickers race for freed room, so the one
  whose queue holds only a well-served tenant holds back its next dispatch while a peer holds a
  tenant (not waiting here) served clearly less in the recent window, or a higher band: that
  peer then takes the room. The holding area bounds how long it holds back (``max_yield_s``), so
  room is never left unused for long when the peer cannot take it (stale, gone).

Service is compared as an exponentially decayed sum of GPU seconds (time constant ``window_s``),
this picker's and its peers' together. What peers publish per (band, tenant): the GPU seconds they
have dispatched in total (a counter; the deltas between rounds are the credits) and the GPU seconds
waiting in their queues now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

TenantKey = tuple[int, str]
"""(band: the priority, tenant: the fairness id)."""


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """One picker's figures for one (band, tenant)."""

    served_s: float
    """GPU seconds dispatched in total (grows; starts again from 0 when the picker restarts)."""
    waiting_s: float
    """GPU seconds of its requests held now."""


class TenantLedger:
    def __init__(self, *, window_s: float = 5.0, yield_ratio: float = 1.1,
                 max_tenants: int = 10_000) -> None:
        if window_s <= 0 or yield_ratio < 1 or max_tenants < 1:
            raise ValueError("window_s must be > 0, yield_ratio >= 1, max_tenants >= 1")
        self.window_s = window_s
        self.yield_ratio = yield_ratio
        self.max_tenants = max_tenants
        self._served: dict[TenantKey, float] = {}
        """This picker's dispatched GPU seconds in total (published)."""
        self._waiting: dict[TenantKey, float] = {}
        """This picker's held GPU seconds now (published)."""
        self._recent: dict[TenantKey, tuple[float, float]] = {}
        """Everyone's decayed service: key → (value, as of when)."""
        self._peer_served: dict[str, dict[TenantKey, float]] = {}
        """Peer → its counters as last read (deltas are taken against them)."""
        self._peer_waiting: dict[TenantKey, float] = {}
        """Summed over peers."""
        self._credits: dict[TenantKey, float] = {}
        """Peers' dispatches not yet charged to this picker's queue."""

    # --- this picker ------------------------------------------------------------------------------
    def served(self, key: TenantKey, seconds: float, now: float) -> None:
        """This picker sent a request of ``key`` costing ``seconds`` to an endpoint."""
        if key not in self._served and len(self._served) >= self.max_tenants:
            self._evict(now)
        self._served[key] = self._served.get(key, 0.0) + seconds
        self._add_recent(key, seconds, now)

    def set_waiting(self, waiting: Mapping[TenantKey, float]) -> None:
        """This picker's held work per (band, tenant) now."""
        self._waiting = dict(waiting)

    def own(self) -> dict[TenantKey, TenantUsage]:
        """What this picker publishes."""
        waiting = self._waiting
        out = {key: TenantUsage(served, waiting.get(key, 0.0)) for key, served in self._served.items()}
        for key, seconds in waiting.items():
            if key not in out:
                out[key] = TenantUsage(0.0, seconds)
        return out

    # --- peers ---------------------------------------------------------------------------------------
    def set_peers(self, peers: Mapping[str, Mapping[TenantKey, TenantUsage]], now: float) -> None:
        """Every live peer's latest figures (a peer missing from ``peers`` is gone). A peer read for
        the first time sets its baseline: only what it dispatches afterwards is credited."""
        waiting: dict[TenantKey, float] = {}
        known = self._peer_served
        fresh: dict[str, dict[TenantKey, float]] = {}
        for peer, usage in peers.items():
            before = known.get(peer)
            counters = fresh[peer] = {}
            for key, figures in usage.items():
                counters[key] = figures.served_s
                if figures.waiting_s > 0:
                    waiting[key] = waiting.get(key, 0.0) + figures.waiting_s
                if before is None:
                    continue
                last = before.get(key)
                # A counter below its last value, or new from a known peer: it started again (the
                # peer forgot the tenant, or restarted under the same id): all of it is new.
                restarted = last is None or figures.served_s < last
                delta = figures.served_s if restarted else figures.served_s - (last or 0.0)
                if delta > 0:
                    self._credits[key] = self._credits.get(key, 0.0) + delta
                    self._add_recent(key, delta, now)
        self._peer_served = fresh
        self._peer_waiting = waiting

    def take_credits(self) -> dict[TenantKey, float]:
        """Peers' dispatches per (band, tenant) since the last call (the holding queue charges them)."""
        credits, self._credits = self._credits, {}
        return credits

    # --- questions --------------------------------------------------------------------------------
    def recent(self, key: TenantKey, now: float) -> float:
        """``key``'s decayed GPU seconds served by every picker."""
        value, at = self._recent.get(key, (0.0, now))
        return value * math.exp(-(now - at) / self.window_s) if now > at else value

    def should_yield(self, key: TenantKey, now: float, waiting_here: Callable[[int, str], bool]) -> bool:
        """Whether this picker should hold back dispatching a request of ``key`` for a peer: a peer
        holds requests of a higher band, or of a tenant of the same band that has nothing waiting
        here (``waiting_here(band, tenant)``) and was served less than ``key``'s tenant by more
        than ``yield_ratio``."""
        band, tenant = key
        mine: float | None = None
        for (other_band, other), seconds in self._peer_waiting.items():
            if seconds <= 0 or other_band < band:
                continue
            if other_band > band:
                return True
            if other == tenant or waiting_here(other_band, other):
                continue  # this picker's own order already weighs it
            if mine is None:
                mine = self.recent(key, now)
            if self.recent((other_band, other), now) * self.yield_ratio < mine:
                return True
        return False

    def peers_waiting(self) -> Mapping[TenantKey, float]:
        return self._peer_waiting

    def forget_peers(self) -> None:
        """The peers' figures are too old (Redis gone): decide alone until the next read."""
        self._peer_served = {}
        self._peer_waiting = {}

    # --- inside --------------------------------------------------------------------------------------
    def _add_recent(self, key: TenantKey, seconds: float, now: float) -> None:
        if key not in self._recent and len(self._recent) >= self.max_tenants:
            self._evict(now)
        self._recent[key] = (self.recent(key, now) + seconds, now)

    def _evict(self, now: float) -> None:
        """Forget the tenants served least recently (a tenant id is a client's header: bounded)."""
        keep = self.max_tenants * 3 // 4
        by_age = sorted(self._recent, key=lambda k: self.recent(k, now), reverse=True)
        live = set(by_age[:keep]) | set(self._waiting)
        self._recent = {k: v for k, v in self._recent.items() if k in live}
        self._served = {k: v for k, v in self._served.items() if k in live}
