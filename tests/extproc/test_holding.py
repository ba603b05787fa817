"""``extproc.holding.HoldingArea`` on a real event loop: held requests are dispatched when room
appears (one grant at a time, fair between tenants), time out, leave, and stop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from kvgate.extproc.holding import HoldingArea, PoolLoad
from kvgate.extproc.ports import MonotonicClock
from kvgate.policies.flow_control import FlowControlSettings, HoldOutcome, endpoint_has_room
from kvgate.policies.holding_queue import Waiting
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.state import InFlight
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView, InferenceRequest


@dataclass
class Pool:
    """A pool whose one endpoint has ``free`` room (requests in flight below it), or none at all."""

    free: int = 0
    endpoints_up: bool = True
    inflight: dict[str, InFlight] = field(default_factory=dict)
    ended: list[tuple[str, HoldOutcome, float]] = field(default_factory=list)

    def views(self) -> tuple[EndpointView, ...]:
        if not self.endpoints_up:
            return ()
        metrics = EndpointMetrics(updated_at=MonotonicClock().now())
        return (EndpointView(Endpoint("10.0.0.1:8000", "p"), metrics),)

    def load(self) -> PoolLoad:
        return PoolLoad(self.views, lambda: self.inflight, lambda request, now: 0)

    def take(self) -> None:
        """One more request of ours in flight."""
        own = self.inflight.get("10.0.0.1:8000", InFlight())
        self.inflight["10.0.0.1:8000"] = InFlight(own.requests + 1)

    def hold_ended(self, pool: str, item: Waiting, outcome: HoldOutcome, seconds: float) -> None:
        self.ended.append((item.request_id, outcome, seconds))


def area_for(pool: Pool, **settings: object) -> HoldingArea:
    limit = FlowControlSettings(max_inflight_per_endpoint=max(pool.free, 1), **settings)  # type: ignore[arg-type]
    if pool.free == 0:
        pool.inflight["10.0.0.1:8000"] = InFlight(1)  # at the limit of 1: no room
    return HoldingArea("p", limit, pool.load(), MonotonicClock(), metrics=pool, poll_s=0.002)


def request(rid: str, tenant: str = "t", priority: int = 0,
            headers: Mapping[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest(request_id=rid, pool="p", model="m", target_model="m", prompt="x" * 400,
                            fairness_id=tenant, priority=priority, headers=headers or {})


async def dispatch_order(area: HoldingArea, pool: Pool) -> list[str]:
    """Free room until every held request has gone; the order they went in."""
    order = []
    pool.inflight.clear()
    while area._waiters:  # (held, or granted and not yet picked)
        outcome_of = {rid: asyncio.ensure_future(area.outcome(rid)) for rid in list(area._waiters)}
        done, _ = await asyncio.wait(outcome_of.values(), timeout=1, return_when=asyncio.FIRST_COMPLETED)
        [rid] = [r for r, f in outcome_of.items() if f in done]
        order.append(rid)
        area.grant_used(rid)
        for f in outcome_of.values():
            f.cancel()
    return order


async def test_slo_deadline_order_releases_the_soonest_due_first() -> None:
    """``order: slo-deadline``: a request's ``x-slo-ttft-ms`` sets when its first token is due; the
    soonest due goes first, those without one last (the same requests go in arrival order under
    ``fcfs``, and a reconfiguration reorders the waiting ones)."""
    held = [("none", {}), ("relaxed", {"x-slo-ttft-ms": "5000"}), ("bad", {"x-slo-ttft-ms": "soon"}),
            ("urgent", {"x-slo-ttft-ms": "100"})]
    for order, expected in (("slo-deadline", ["urgent", "relaxed", "none", "bad"]),
                            ("fcfs", ["none", "relaxed", "bad", "urgent"])):
        pool = Pool()
        area = area_for(pool, order=order)
        for rid, headers in held:
            assert area.hold(area.waiting_item(request(rid, headers=headers), MonotonicClock().now()))
        assert await dispatch_order(area, pool) == expected
        await area.stop()
    pool = Pool()
    area = area_for(pool)
    for rid, headers in held:
        area.hold(area.waiting_item(request(rid, headers=headers), MonotonicClock().now()))
    area.reconfigure(FlowControlSettings(max_inflight_per_endpoint=1, order="slo-deadline"), pool.load())
    assert await dispatch_order(area, pool) == ["urgent", "relaxed", "none", "bad"]
    await area.stop()


async def test_held_requests_go_one_grant_at_a_time_as_room_appears() -> None:
    pool = Pool()
    area = area_for(pool)
    assert area.must_wait()
    for rid in ("a", "b"):
        assert area.hold(area.waiting_item(request(rid), MonotonicClock().now()))
    waiting = {rid: asyncio.ensure_future(area.outcome(rid)) for rid in ("a", "b")}
    await asyncio.sleep(0.02)
    assert not any(w.done() for w in waiting.values())
    assert dict(area.waiting()) == {(0, "t"): 2}
    pool.inflight.clear()  # the request in flight finished: room for one
    area.kick()
    assert await asyncio.wait_for(waiting["a"], 1) is HoldOutcome.DISPATCHED
    await asyncio.sleep(0.02)
    assert not waiting["b"].done()  # until a's pick is counted
    pool.take()
    area.grant_used("a")
    await asyncio.sleep(0.02)
    assert not waiting["b"].done()  # a's pick took the room
    pool.inflight.clear()
    assert await asyncio.wait_for(waiting["b"], 1) is HoldOutcome.DISPATCHED  # found by polling
    area.grant_used("b")
    assert not area.must_wait()
    assert len(area) == 0
    assert [(rid, outcome) for rid, outcome, _ in pool.ended] == [("a", HoldOutcome.DISPATCHED),
                                                                  ("b", HoldOutcome.DISPATCHED)]
    await area.stop()


async def test_a_light_tenant_does_not_wait_behind_a_heavy_tenants_backlog() -> None:
    pool = Pool()
    area = area_for(pool)
    for i in range(20):
        area.hold(area.waiting_item(request(f"heavy-{i}", "heavy"), MonotonicClock().now()))
    area.hold(area.waiting_item(request("light-0", "light"), MonotonicClock().now()))
    order = await dispatch_order(area, pool)
    assert order.index("light-0") <= 1
    await area.stop()


async def test_a_request_waits_at_most_its_timeout() -> None:
    pool = Pool()
    area = area_for(pool, queue_timeout_s=0.05)
    area.hold(area.waiting_item(request("a"), MonotonicClock().now()))
    assert await asyncio.wait_for(area.outcome("a"), 1) is HoldOutcome.EVICTED_TTL
    assert not area.must_wait() or pool.inflight  # the queue is empty again
    [(_, outcome, seconds)] = pool.ended
    assert outcome is HoldOutcome.EVICTED_TTL
    assert seconds >= 0.05
    await area.stop()


async def test_a_pool_without_replicas_holds_until_one_is_ready() -> None:
    """Scale from zero: no endpoint, no room; the first ready replica takes the held request."""
    pool = Pool(free=1, endpoints_up=False)
    area = area_for(pool)
    assert area.must_wait()
    area.hold(area.waiting_item(request("a"), MonotonicClock().now()))
    waiting = asyncio.ensure_future(area.outcome("a"))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    pool.endpoints_up = True
    assert await asyncio.wait_for(waiting, 1) is HoldOutcome.DISPATCHED
    await area.stop()


async def test_a_full_queue_sheds_the_lowest_band_first() -> None:
    pool = Pool()
    area = area_for(pool, max_queue_length=2)
    now = MonotonicClock().now()
    assert area.hold(area.waiting_item(request("batch", priority=-1), now))
    assert area.hold(area.waiting_item(request("chat-1"), now))
    shed = asyncio.ensure_future(area.outcome("batch"))
    assert area.hold(area.waiting_item(request("chat-2"), now))  # displaces the sheddable one
    assert await asyncio.wait_for(shed, 1) is HoldOutcome.REJECTED_CAPACITY
    assert not area.hold(area.waiting_item(request("batch-2", priority=-1), now))  # shed on arrival
    assert dict(area.waiting()) == {(0, "t"): 2}
    await area.stop()


async def test_leaving_takes_a_request_out_and_gives_back_an_unused_grant() -> None:
    pool = Pool()
    area = area_for(pool)
    now = MonotonicClock().now()
    for rid in ("a", "b", "c"):
        area.hold(area.waiting_item(request(rid), now))
    area.leave("b")  # its client went away while held
    pool.inflight.clear()
    assert await asyncio.wait_for(area.outcome("a"), 1) is HoldOutcome.DISPATCHED
    area.leave("a")  # dispatched, then its client went away before the pick
    assert await asyncio.wait_for(area.outcome("c"), 1) is HoldOutcome.DISPATCHED
    assert await area.outcome("b") is HoldOutcome.EVICTED_CANCELLED
    outcomes: Mapping[str, HoldOutcome] = {rid: outcome for rid, outcome, _ in pool.ended}
    assert outcomes == {"a": HoldOutcome.DISPATCHED, "b": HoldOutcome.EVICTED_CANCELLED,
                        "c": HoldOutcome.DISPATCHED}
    await area.stop()


async def test_a_grant_never_reported_does_not_stop_the_queue() -> None:
    pool = Pool()
    area = HoldingArea("p", FlowControlSettings(), pool.load(), MonotonicClock(), poll_s=0.002,
                       grant_timeout_s=0.05)
    pool.endpoints_up = False
    now = MonotonicClock().now()
    area.hold(area.waiting_item(request("a"), now))
    area.hold(area.waiting_item(request("b"), now))
    pool.endpoints_up = True
    assert await asyncio.wait_for(area.outcome("a"), 1) is HoldOutcome.DISPATCHED
    # "a" never reports its pick: after the grant timeout "b" goes
    assert await asyncio.wait_for(area.outcome("b"), 1) is HoldOutcome.DISPATCHED
    await area.stop()


async def test_stopping_ends_every_wait() -> None:
    pool = Pool()
    area = area_for(pool)
    area.hold(area.waiting_item(request("a"), MonotonicClock().now()))
    waiting = asyncio.ensure_future(area.outcome("a"))
    await area.stop()
    assert await waiting is HoldOutcome.EVICTED_TTL


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_settings_refuse_a_timeout_that_is_not_positive(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        FlowControlSettings(queue_timeout_s=timeout)


async def test_with_room_keeps_the_endpoints_that_have_it() -> None:
    pool = Pool(free=1)
    area = area_for(pool)
    [view] = pool.views()
    snapshot = (view,)
    assert area.with_room(snapshot) is snapshot  # all have room: the snapshot itself (its memos hold)
    pool.take()
    assert area.with_room((view,)) == ()
    await area.stop()


async def test_a_tenant_with_nothing_waiting_may_take_a_reserved_slot() -> None:
    pool = Pool(free=1)
    area = HoldingArea("p", FlowControlSettings(max_inflight_per_endpoint=1, reserved_per_endpoint=1),
                       pool.load(), MonotonicClock(), poll_s=0.002)
    pool.take()  # at the limit: no room, but the reserved slot is free
    assert area.must_wait()
    area.hold(area.waiting_item(request("heavy-1", "heavy"), MonotonicClock().now()))
    assert area.may_take_reserved("light", 0)
    assert not area.may_take_reserved("heavy", 0)  # it has a backlog: it waits its turn
    [view] = pool.views()
    assert area.with_room((view,)) == ()
    assert area.with_room((view,), reserved=True) == (view,)
    pool.take()  # the reserved slot taken
    assert not area.may_take_reserved("light", 0)
    await area.stop()


async def test_with_a_ledger_a_dispatch_waits_a_little_for_a_peer_whose_tenant_was_served_less() -> None:
    """Shared fairness: this picker holds only tenant a, a peer holds b (served nothing lately):
    the room is left to the peer for ``max_yield_s``, then this picker takes it after all; its
    dispatches and direct passes count as a's service, published with its waiting work."""
    from kvgate.policies.tenant_ledger import TenantLedger, TenantUsage

    pool = Pool()
    ledger = TenantLedger()
    limit = FlowControlSettings(max_inflight_per_endpoint=1)
    pool.inflight["10.0.0.1:8000"] = InFlight(1)
    area = HoldingArea("p", limit, pool.load(), MonotonicClock(), metrics=pool, poll_s=0.002,
                       ledger=ledger, max_yield_s=0.15)
    area.passed(request("direct", "a"))
    assert ledger.own()[(0, "a")].served_s > 0
    ledger.set_peers({"peer": {(0, "b"): TenantUsage(0.0, 0.0)}}, now=MonotonicClock().now())
    ledger.set_peers({"peer": {(0, "b"): TenantUsage(0.0, 5.0)}}, now=MonotonicClock().now())
    area.hold(area.waiting_item(request("a1", "a"), MonotonicClock().now()))
    waiting = asyncio.ensure_future(area.outcome("a1"))
    await asyncio.sleep(0.02)
    assert ledger.own()[(0, "a")].waiting_s > 0  # published for the peers
    started = MonotonicClock().now()
    pool.inflight.clear()
    area.kick()
    assert await asyncio.wait_for(waiting, 1) is HoldOutcome.DISPATCHED
    assert MonotonicClock().now() - started >= 0.14  # left to the peer first
    assert area.yields > 0
    area.grant_used("a1")
    await asyncio.sleep(0.01)
    assert ledger.own()[(0, "a")].waiting_s == 0
    await area.stop()


async def test_with_a_ledger_peers_dispatches_are_charged_to_the_tenants_place_here() -> None:
    from kvgate.policies.tenant_ledger import TenantLedger, TenantUsage

    pool = Pool()
    ledger = TenantLedger()
    pool.inflight["10.0.0.1:8000"] = InFlight(1)
    area = HoldingArea("p", FlowControlSettings(max_inflight_per_endpoint=1), pool.load(), MonotonicClock(),
                       metrics=pool, poll_s=0.002, ledger=ledger)
    now = MonotonicClock().now()
    ledger.set_peers({"peer": {(0, "a"): TenantUsage(0.0, 0.0)}}, now=now)
    for i in range(3):
        area.hold(area.waiting_item(request(f"a{i}", "a"), now))
        area.hold(area.waiting_item(request(f"b{i}", "b"), now))
    ledger.set_peers({"peer": {(0, "a"): TenantUsage(100.0, 0.0)}}, now=now)  # the peer served a lots
    for i in range(3, 5):
        area.hold(area.waiting_item(request(f"a{i}", "a"), now))
        area.hold(area.waiting_item(request(f"b{i}", "b"), now))
    order = []
    pool.inflight.clear()
    for _ in range(10):
        outcome_of = {rid: asyncio.ensure_future(area.outcome(rid)) for rid in list(area._waiters)}
        done, _ = await asyncio.wait(outcome_of.values(), timeout=1, return_when=asyncio.FIRST_COMPLETED)
        [rid] = [r for r, f in outcome_of.items() if f in done]
        order.append(rid)
        area.grant_used(rid)
        for f in outcome_of.values():
            f.cancel()
    assert order.index("b4") < order.index("a3")  # a's later requests go after b's
    await area.stop()


async def test_a_full_pool_is_looked_at_whole_once_then_where_room_can_come_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the pool stays full, a request's end is checked on its endpoint alone (and the rest
    again every ``FullPool.RECHECK_S``): a pass over a large pool at every end and every poll cost
    ~0.4 ms at 1,000 endpoints."""
    addresses = [f"10.0.0.{i}:8000" for i in range(1, 201)]
    now = MonotonicClock().now
    snapshot = PoolViews.after(None, [EndpointView(Endpoint(a, "p"), EndpointMetrics(updated_at=now() + 60))
                                      for a in addresses], None)
    inflight = {a: InFlight(1) for a in addresses}  # each at its limit of 1
    looks: list[str] = []

    def counting(view: EndpointView, own: InFlight | None, settings: FlowControlSettings, at: float,
                 *, reserved: bool = False) -> bool:
        looks.append(view.address)
        return endpoint_has_room(view, own, settings, at, reserved=reserved)

    monkeypatch.setattr("kvgate.extproc.holding.endpoint_has_room", counting)
    area = HoldingArea("p", FlowControlSettings(max_inflight_per_endpoint=1),
                       PoolLoad(lambda: snapshot, lambda: inflight, lambda request, at: 0),
                       MonotonicClock(), poll_s=0.001)
    assert area.must_wait()
    assert len(looks) == len(addresses)  # the first look: the whole pool
    assert area.hold(area.waiting_item(request("a"), now()))
    held = asyncio.ensure_future(area.outcome("a"))
    looks.clear()
    area.kick(addresses[7])  # a request there ended, but another of ours is still there: full
    assert looks[:1] == [addresses[7]]
    assert len(looks) < len(addresses)
    del inflight[addresses[42]]
    area.kick(addresses[42])  # room there now
    assert await asyncio.wait_for(held, 1) is HoldOutcome.DISPATCHED
    await area.stop()


async def test_a_request_may_ask_to_wait_less_than_its_pool_in_llm_ds_header() -> None:
    """``x-llm-d-inference-ttl`` (a Go duration; llm-d's router's per-request queue budget): the
    request leaves the queue at its own budget, never later than the pool's timeout."""
    pool = Pool(free=0)
    area = area_for(pool, queue_timeout_s=5.0)
    now = MonotonicClock().now()
    short = area.waiting_item(request("short", headers={"x-llm-d-inference-ttl": "50ms"}), now)
    assert short.deadline == pytest.approx(now + 0.05)
    for text in ("9s", "0s", "soon", ""):  # longer than the pool's, none, not a duration: the pool's
        item = area.waiting_item(request(text, headers={"x-llm-d-inference-ttl": text}), now)
        assert item.deadline == pytest.approx(now + 5.0)
    assert area.hold(short)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.wait_for(area.outcome("short"), 2) is HoldOutcome.EVICTED_TTL
    assert loop.time() - started < 1.0
    await area.stop()
