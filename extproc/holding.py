"""A pool's holding area (issue 34): the asyncio shell around ``policies.flow_control``.

The lifecycle (sans IO) asks :meth:`HoldingArea.must_wait`; a request that must wait is queued with
:meth:`HoldingArea.hold`, and the servicer awaits its :meth:`HoldingArea.outcome`: dispatched (the
lifecycle picks it, then reports :meth:`HoldingArea.grant_used`), timed out, or shed. A client that
goes away is taken out by :meth:`HoldingArea.leave` (the lifecycle's end of stream).

Room is looked for when a request of the pool ends (:meth:`HoldingArea.kick`, after the scheduler
has been told), when a grant is used, and every ``poll_s`` while requests wait (fresh scrapes, a
replica becoming ready, deadlines). A grant not used within ``grant_timeout_s`` is given up (a
lifecycle that never reported it must not stop the queue). A pool that spills
(``kvgate.io/spill-to``) has room while a pool down its chain has: its held requests then go there
(the lifecycle picks the tier).

With a :class:`~policies.tenant_ledger.TenantLedger` (several pickers sharing state through
Redis), fairness between tenants counts every picker's dispatches: peers' work is charged to the
tenants' places in this queue, and a dispatch is held back (at most ``max_yield_s`` at a time) while
a peer holds a tenant served clearly less or a higher band (tenant_ledger.py says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvgate.extproc.full_pool import FullPool
from kvgate.extproc.ports import Clock
from kvgate.policies.flow_control import (
    FlowController,
    FlowControlSettings,
    HoldOutcome,
    endpoint_has_room,
    pool_has_room,
    queue_budget_s,
    work_seconds,
)
from kvgate.policies.holding_queue import Waiting
from kvgate.policies.latency_objectives import latency_objectives
from kvgate.policies.state import InFlight
from kvgate.policies.tenant_ledger import TenantLedger
from kvgate.policies.types import EndpointView, InferenceRequest

_log = logging.getLogger(__name__)


class HoldingMetrics(Protocol):
    def hold_ended(self, pool: str, item: Waiting, outcome: HoldOutcome, seconds: float) -> None:
        """A held request's wait ended after ``seconds`` (GIE:
        ``inference_extension_flow_control_request_queue_duration_seconds``)."""
        ...


class NoHoldingMetrics:
    def hold_ended(self, pool: str, item: Waiting, outcome: HoldOutcome, seconds: float) -> None:
        pass


@dataclass(frozen=True, slots=True)
class PoolLoad:
    """How the area reads its pool: the live endpoints, this picker's requests in flight on them,
    and the prompt tokens the best endpoint probably caches for a request (for its cost)."""

    endpoints: Callable[[], Sequence[EndpointView]]
    inflight: Callable[[], Mapping[str, InFlight]]
    cached_tokens: Callable[[InferenceRequest, float], int]
    spill_room: Callable[[], bool] = lambda: False
    """Whether a pool down this one's spill chain has room (then held requests go, to it)."""


class HoldingArea:
    """One pool's held requests in one picker process."""

    def __init__(self, pool: str, settings: FlowControlSettings, load: PoolLoad, clock: Clock, *,
                 metrics: HoldingMetrics | None = None, poll_s: float = 0.005,
                 grant_timeout_s: float = 1.0, ledger: TenantLedger | None = None,
                 max_yield_s: float = 0.1) -> None:
        self.pool = pool
        self.settings = settings
        self._load = load
        self._clock = clock
        self._metrics: HoldingMetrics = metrics or NoHoldingMetrics()
        self._poll_s = poll_s
        self._grant_timeout_s = grant_timeout_s
        self._controller = FlowController(settings)
        self._full = FullPool()
        """What the last look that found the pool full learned (``extproc.full_pool``)."""
        self._waiters: dict[str, tuple[Waiting, float, asyncio.Future[HoldOutcome]]] = {}
        """Held (or granted, not yet picked) request id → (item, when it was held, its outcome)."""
        self._granted: tuple[str, float] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.ledger = ledger
        self._max_yield_s = max_yield_s
        self._yielding_since: float | None = None
        self.yields = 0
        """Dispatch rounds held back for a peer (shared fairness)."""

    def reconfigure(self, settings: FlowControlSettings, load: PoolLoad) -> None:
        """New settings and a new view of the pool (a configuration change): held requests keep
        their place and deadlines; the new bounds apply from now on (over a shorter bound, each
        arrival sheds one request, as any arrival at the bound does)."""
        self.settings = settings
        self._load = load
        self._controller.reconfigure(settings)
        self._full.forget()
        self.kick()

    @property
    def timeout_s(self) -> float:
        return self.settings.queue_timeout_s

    @property
    def retry_after_s(self) -> float:
        return self.settings.retry_after_s

    # --- the lifecycle's calls (synchronous) ----------------------------------------------------
    def must_wait(self) -> bool:
        return self._controller.must_wait(self._has_room)

    def may_take_reserved(self, tenant: str, band: int) -> bool:
        """Whether a request of ``tenant`` (nothing of it waiting in ``band``) may go now into a slot
        reserved for tenants without a backlog (``FlowControlSettings.reserved_per_endpoint``)."""
        settings = self.settings
        if not settings.reserved_per_endpoint or self._controller.queue.has_waiting(band, tenant):
            return False
        load = self._load
        return pool_has_room(load.endpoints(), load.inflight(), settings, self._clock.now(), reserved=True)

    def with_room(self, endpoints: Sequence[EndpointView], *,
                  reserved: bool = False) -> Sequence[EndpointView]:
        inflight, now, settings = self._load.inflight(), self._clock.now(), self.settings
        kept = tuple(v for v in endpoints
                     if endpoint_has_room(v, inflight.get(v.address), settings, now, reserved=reserved))
        # every one has room: the snapshot itself, so the scheduler's per-snapshot structures hold
        return endpoints if len(kept) == len(endpoints) else kept

    def waiting_item(self, request: InferenceRequest, now: float) -> Waiting:
        """``request`` as the queue holds it: its band, tenant, cost and deadline."""
        cost = work_seconds(len(request.prompt), self._load.cached_tokens(request, now), request.max_tokens,
                            self.settings.work)
        ttft_s = latency_objectives(request.headers).ttft_s
        return Waiting(request.request_id, request.priority, request.fairness_id or "",
                       cost, now + queue_budget_s(request.headers, self.settings.queue_timeout_s),
                       math.inf if ttft_s is None else now + ttft_s)

    def passed(self, request: InferenceRequest) -> None:
        """``request`` goes to an endpoint without waiting (room, or a reserved slot): with a
        ledger, its work counts as served to its tenant."""
        ledger = self.ledger
        if ledger is not None:
            now = self._clock.now()
            item = self.waiting_item(request, now)
            ledger.served((item.band, item.tenant), item.cost, now)

    def hold(self, item: Waiting) -> bool:
        """Queue ``item``; False when it was shed at once (the queue is full of requests that
        rank above it). The request it displaced, if any, ends REJECTED_CAPACITY."""
        now = self._clock.now()
        self._take_credits()  # peers' dispatches count before this request's place is set
        shed = self._controller.hold(item)
        if shed is item:
            self._metrics.hold_ended(self.pool, item, HoldOutcome.REJECTED_CAPACITY, 0.0)
            return False
        self._waiters[item.request_id] = (item, now, asyncio.get_running_loop().create_future())
        if shed is not None:
            self._end(shed.request_id, HoldOutcome.REJECTED_CAPACITY)
        self._ensure_running()
        return True

    async def outcome(self, request_id: str) -> HoldOutcome:
        """How the wait of a held request ends (at once when it already has)."""
        waiter = self._waiters.get(request_id)
        if waiter is None:
            return HoldOutcome.EVICTED_CANCELLED
        return await asyncio.shield(waiter[2])

    def grant_used(self, request_id: str) -> None:
        """The dispatched request has been picked (the scheduler told): the next may go."""
        self._waiters.pop(request_id, None)
        if self._granted is not None and self._granted[0] == request_id:
            self._granted = None
            self._controller.grant_used()
            self.kick()

    def leave(self, request_id: str) -> None:
        """The client went away (or the stream ended) while held or granted."""
        if self._controller.remove(request_id) is not None:
            self._end(request_id, HoldOutcome.EVICTED_CANCELLED)
        self.grant_used(request_id)
        self._waiters.pop(request_id, None)

    def kick(self, *freed: str) -> None:
        """Look for room now: a request of the pool ended (on the ``freed`` endpoints: where it ran,
        and where a fallback moved it from), a grant was used, the configuration changed."""
        for address in freed:
            self._full.freed(address)
        if self._waiters or self._controller.granting:
            self._dispatch()

    def waiting(self) -> Mapping[tuple[int, str], int]:
        """Held requests per (band, tenant), for metrics."""
        return self._controller.queue.waiting()

    def __len__(self) -> int:
        return len(self._controller.queue)

    # --- inside -----------------------------------------------------------------------------------
    def _has_room(self) -> bool:
        load = self._load
        endpoints, inflight, now = load.endpoints(), load.inflight(), self._clock.now()
        settings = self.settings

        def room(view: EndpointView) -> bool:
            return endpoint_has_room(view, inflight.get(view.address), settings, now)

        full = self._full.still_full(endpoints, now, room)  # (while full: the changed endpoints alone)
        if full is None:
            full = not any(room(view) for view in endpoints)
            if full:
                self._full.found_full(endpoints, now)
        return not full or load.spill_room()

    def _dispatch(self) -> None:
        now = self._clock.now()
        for late in self._controller.expired(now):
            self._end(late.request_id, HoldOutcome.EVICTED_TTL)
        granted = self._granted
        if granted is not None and now - granted[1] > self._grant_timeout_s:
            _log.warning("pool %s: request %s was dispatched %.1f s ago and not picked; the queue goes on",
                         self.pool, granted[0], now - granted[1])
            self._granted = None
            self._controller.grant_used()
        queue = self._controller.queue
        ledger = self.ledger
        if ledger is not None:
            self._take_credits()
            ledger.set_waiting(queue.queued_work())
        if not queue or self._controller.granting:
            return  # nothing held, or the last grant not yet picked: no room to look for
        room = self._has_room()
        if room and ledger is not None and not self._controller.granting and self._holds_back(ledger, now):
            return
        item = self._controller.dispatch(room)
        if item is not None:
            self._granted = (item.request_id, now)
            if ledger is not None:
                ledger.served((item.band, item.tenant), item.cost, now)
            self._end(item.request_id, HoldOutcome.DISPATCHED)

    def _take_credits(self) -> None:
        if self.ledger is not None:
            queue = self._controller.queue
            for (band, tenant), seconds in self.ledger.take_credits().items():
                queue.credit(band, tenant, seconds)

    def _holds_back(self, ledger: TenantLedger, now: float) -> bool:
        """Whether to leave the room to a peer this round (at most ``max_yield_s`` in a row)."""
        head = self._controller.queue.peek()
        if head is None or not ledger.should_yield((head.band, head.tenant), now,
                                                    self._controller.queue.has_waiting):
            self._yielding_since = None
            return False
        if self._yielding_since is None:
            self._yielding_since = now
        if now - self._yielding_since < self._max_yield_s:
            self.yields += 1
            return True
        self._yielding_since = None  # the peer did not take the room: this picker does
        return False

    def _end(self, request_id: str, outcome: HoldOutcome) -> None:
        waiter = self._waiters.get(request_id)
        if waiter is None:
            return
        item, since, future = waiter  # kept until the lifecycle has read it (``leave``, ``grant_used``)
        if not future.done():
            future.set_result(outcome)
        self._metrics.hold_ended(self.pool, item, outcome, self._clock.now() - since)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"holding-{self.pool}")
        self._wake.set()

    async def _run(self) -> None:
        """While requests wait: look for room every ``poll_s`` (or when woken)."""
        while self._controller.queue or self._controller.granting:
            self._wake.clear()
            try:
                self._dispatch()
            except Exception:  # a bug must not strand the waiting requests: they time out instead
                _log.exception("pool %s: dispatching held requests failed", self.pool)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_s)
        if self.ledger is not None:
            self.ledger.set_waiting({})

    async def stop(self) -> None:
        """End every wait (the pool was removed or the picker stops): they time out now."""
        for request_id in list(self._waiters):
            self._controller.remove(request_id)
            self._end(request_id, HoldOutcome.EVICTED_TTL)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
