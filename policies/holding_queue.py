"""The order in which requests held at the gateway are dispatched (issue 34, its first part; sans-IO).

When no endpoint of a pool has capacity, a request waits in the picker instead of in a replica's
queue; when one frees, the queue says which waiting request goes next. This module is that order
and its bounds, with no clock and no IO: the picker's shell (not built yet) holds the waiting
requests' streams, asks ``pop`` when capacity frees, ``expired`` on a timer, ``remove`` when a
client goes away.

- **Bands** by priority (an InferenceObjective's): a higher band always goes first.
- **Fairness inside a band** between tenants (``x-gateway-inference-fairness-id``), by the GPU work
  each request costs, not by request count: start-time fair queuing. Each tenant has a virtual
  finish time; a request's virtual start is the later of the band's virtual time and its tenant's
  last finish, its finish that start plus its ``cost`` (kvgate's estimate of its prefill and decode
  seconds: uncached prompt tokens cost more than cached ones); the waiting request with the least
  virtual start goes first (ties: arrival order), and the band's virtual time moves to it. A tenant
  sending eight times more work is served its share, and a light tenant's request does not wait
  behind a heavy tenant's backlog.
- **Bounds**: at most ``max_length`` requests; a push beyond it sheds from the lowest band (the
  pushed request itself when its band is lower still): that band's newest request of the tenant
  with the most queued work there (counting the pushed one), so a full queue costs the tenant who
  filled it, not a light tenant's next request. Each request has a deadline;
  ``expired`` takes out those past it (call it regularly: it also drops what the deadline heap
  keeps of requests dispatched or removed before their deadline).
- **Order inside a tenant** (``order``): which of a tenant's requests takes its turn. ``fcfs``
  (default): the oldest. ``slo-deadline``: the one whose first token is due soonest (``due``: its
  arrival plus its ``x-slo-ttft-ms``, llm-d's ``slo-deadline-ordering-policy``); requests without
  an objective after those with one, ties in arrival order. The tenant's turns (its virtual starts)
  do not change: its requests trade places among them, so fairness between tenants is the same.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

QueueOrder = Literal["fcfs", "slo-deadline"]
QUEUE_ORDERS: tuple[QueueOrder, ...] = ("fcfs", "slo-deadline")


@dataclass(frozen=True, slots=True)
class Waiting:
    request_id: str
    band: int
    """The request's priority: higher bands go first."""
    tenant: str
    cost: float
    """Its GPU work in seconds (> 0): what fairness between tenants counts."""
    deadline: float
    """When it stops waiting (the caller's clock)."""
    due: float = math.inf
    """When its first token is due (its arrival plus its TTFT objective; inf: no objective): the
    ``slo-deadline`` order's key."""


@dataclass(slots=True)
class _Band:
    virtual_time: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)
    """Tenant → virtual finish time of its last request queued in this band."""
    heap: list[tuple[float, int]] = field(default_factory=list)
    """(virtual start, turn): the turn's request is ``HoldingQueue._owner[turn]``; turns of
    removed requests are skipped."""
    urgent: dict[str, list[tuple[float, int, str]]] = field(default_factory=dict)
    """Tenant → (due, arrival number, request id) of its waiting requests (``slo-deadline`` only;
    entries of requests gone are skipped)."""
    order: dict[str, None] = field(default_factory=dict)
    """Request ids in arrival order."""
    tenants: dict[str, dict[str, None]] = field(default_factory=dict)
    """Tenant → its waiting request ids in arrival order (the newest last: the one shed first)."""
    queued: dict[str, float] = field(default_factory=dict)
    """Tenant → the cost of its waiting requests."""


class HoldingQueue:
    def __init__(self, max_length: int, order: QueueOrder = "fcfs") -> None:
        if max_length < 1:
            raise ValueError("max_length must be at least 1")
        if order not in QUEUE_ORDERS:
            raise ValueError(f"unknown queue order {order!r} (one of {', '.join(QUEUE_ORDERS)})")
        self.max_length = max_length
        self.order: QueueOrder = order
        self._bands: dict[int, _Band] = {}
        self._items: dict[str, Waiting] = {}
        self._arrival_of: dict[str, int] = {}
        """Waiting request id → its arrival number (heap entries of an earlier stay are skipped)."""
        self._turn_of: dict[str, int] = {}
        """Waiting request id → the turn it holds (at first its arrival number; ``slo-deadline``
        trades a tenant's turns among its requests)."""
        self._owner: dict[int, str] = {}
        """Turn → the waiting request holding it."""
        self._deadlines: list[tuple[float, int, str]] = []
        self._arrivals = 0

    def reorder(self, order: QueueOrder) -> None:
        """Order each tenant's requests by ``order`` from now on (a configuration change): the
        waiting ones keep their turns."""
        if order not in QUEUE_ORDERS:
            raise ValueError(f"unknown queue order {order!r} (one of {', '.join(QUEUE_ORDERS)})")
        if order == self.order:
            return
        self.order = order
        for band in self._bands.values():
            band.urgent = {}
        if order == "slo-deadline":
            for item in self._items.values():
                heapq.heappush(self._bands[item.band].urgent.setdefault(item.tenant, []),
                               (item.due, self._arrival_of[item.request_id], item.request_id))

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._items

    def push(self, item: Waiting) -> Waiting | None:
        """Queue ``item``; returns the request shed to stay within ``max_length`` (maybe ``item``
        itself), or None. ValueError for a request id already waiting or a cost that is not > 0."""
        if item.request_id in self._items:
            raise ValueError(f"request {item.request_id!r} is already waiting")
        if not item.cost > 0:
            raise ValueError("a waiting request's cost must be > 0")
        shed = None
        if len(self._items) >= self.max_length:
            lowest = min(self._bands)
            if item.band < lowest:
                return item
            low = self._bands[lowest]
            queued = dict(low.queued)
            if item.band == lowest:
                queued[item.tenant] = queued.get(item.tenant, 0.0) + item.cost
            heaviest = max(queued, key=queued.__getitem__)
            if item.band == lowest and heaviest == item.tenant:
                return item  # its own tenant's backlog is the largest: the newest of it is this one
            shed = self._items[next(reversed(low.tenants[heaviest]))]
            self.remove(shed.request_id)
        band = self._bands.get(item.band)
        if band is None:
            band = self._bands[item.band] = _Band()
        start = max(band.virtual_time, band.finish.get(item.tenant, 0.0))
        band.finish[item.tenant] = start + item.cost
        self._arrivals += 1
        arrival = self._arrivals
        heapq.heappush(band.heap, (start, arrival))
        heapq.heappush(self._deadlines, (item.deadline, arrival, item.request_id))
        if self.order == "slo-deadline":
            heapq.heappush(band.urgent.setdefault(item.tenant, []), (item.due, arrival, item.request_id))
        band.order[item.request_id] = None
        band.tenants.setdefault(item.tenant, {})[item.request_id] = None
        band.queued[item.tenant] = band.queued.get(item.tenant, 0.0) + item.cost
        self._items[item.request_id] = item
        self._arrival_of[item.request_id] = arrival
        self._turn_of[item.request_id] = arrival
        self._owner[arrival] = item.request_id
        return shed

    def pop(self) -> Waiting | None:
        """The request to dispatch next (None: none waits)."""
        for priority in sorted(self._bands, reverse=True):
            band = self._bands[priority]
            turn = self._head(band)
            if turn is not None:
                start, _ = heapq.heappop(band.heap)
                band.virtual_time = max(band.virtual_time, start)
                item = self._items[self._owner[turn]]
                self._forget(item)
                return item
        return None

    def peek(self) -> Waiting | None:
        """The request :meth:`pop` would return, left waiting."""
        for priority in sorted(self._bands, reverse=True):
            turn = self._head(self._bands[priority])
            if turn is not None:
                return self._items[self._owner[turn]]
        return None

    def _head(self, band: _Band) -> int | None:
        """The band's next turn (its stale entries dropped), its owner the tenant's request that
        goes first by ``order`` (turns traded to make it so); None: the band is empty."""
        heap = band.heap
        while heap:
            turn = heap[0][1]
            owner = self._owner.get(turn)
            if owner is None:
                heapq.heappop(heap)  # a turn of a request removed or expired earlier
                continue
            if self.order == "slo-deadline":
                first = self._most_urgent(band, self._items[owner].tenant)
                if first != owner:  # trade turns: the tenant's first request takes this one
                    theirs = self._turn_of[first]
                    self._owner[turn], self._owner[theirs] = first, owner
                    self._turn_of[first], self._turn_of[owner] = turn, theirs
            return turn
        return None

    def _most_urgent(self, band: _Band, tenant: str) -> str:
        urgent = band.urgent[tenant]
        while True:
            _, arrival, request_id = urgent[0]
            if request_id in self._items and self._arrival_of[request_id] == arrival:
                return request_id
            heapq.heappop(urgent)  # gone (dispatched, removed or expired)

    def credit(self, band: int, tenant: str, seconds: float) -> None:
        """Charge ``tenant`` for ``seconds`` of work served elsewhere (other pickers: issue 34's
        shared fairness) while it waits in ``band``: its next request starts that much later, at
        most behind all the band's queued work. Nothing when it waits nowhere in the band here."""
        found = self._bands.get(band)
        if found is None or tenant not in found.tenants or seconds <= 0:
            return
        begin = max(found.finish.get(tenant, 0.0), found.virtual_time)
        ceiling = found.virtual_time + sum(found.queued.values())
        found.finish[tenant] = max(found.finish.get(tenant, 0.0), min(begin + seconds, ceiling))

    def queued_work(self) -> dict[tuple[int, str], float]:
        """The cost of the waiting requests per (band, tenant)."""
        return {(priority, tenant): cost for priority, band in self._bands.items()
                for tenant, cost in band.queued.items()}

    def remove(self, request_id: str) -> Waiting | None:
        """Take a request out (its client went away); None when it was not waiting."""
        item = self._items.get(request_id)
        if item is not None:
            self._forget(item)
        return item

    def expired(self, now: float) -> list[Waiting]:
        """Take out and return the requests whose deadline is at or before ``now``, earliest first."""
        out: list[Waiting] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, arrival, request_id = heapq.heappop(deadlines)
            item = self._items.get(request_id)
            if item is not None and self._arrival_of[request_id] == arrival:
                self._forget(item)
                out.append(item)
        return out

    def has_waiting(self, band: int, tenant: str) -> bool:
        """Whether ``tenant`` has a request waiting in ``band``."""
        found = self._bands.get(band)
        return found is not None and tenant in found.tenants

    def waiting(self) -> Mapping[tuple[int, str], int]:
        """Requests waiting per (band, tenant), for metrics."""
        return Counter((item.band, item.tenant) for item in self._items.values())

    def _forget(self, item: Waiting) -> None:
        del self._items[item.request_id]
        del self._arrival_of[item.request_id]
        del self._owner[self._turn_of.pop(item.request_id)]
        band = self._bands[item.band]
        del band.order[item.request_id]
        mine = band.tenants[item.tenant]
        del mine[item.request_id]
        if mine:
            band.queued[item.tenant] -= item.cost
        else:
            del band.tenants[item.tenant]
            del band.queued[item.tenant]
            band.urgent.pop(item.tenant, None)
        if not band.order:  # an empty band starts afresh (its heap holds only skipped entries)
            del self._bands[item.band]
