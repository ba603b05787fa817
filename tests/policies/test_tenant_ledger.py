"""``policies.tenant_ledger``: credits from peers' counters, decayed service, when to yield."""

from __future__ import annotations

import math

import pytest

from kvgate.policies.holding_queue import HoldingQueue, Waiting
from kvgate.policies.tenant_ledger import TenantLedger, TenantUsage

A, B, C = (0, "a"), (0, "b"), (0, "c")


def nowhere(band: int, tenant: str) -> bool:
    return False


def test_a_peer_read_the_first_time_is_a_baseline_then_its_dispatches_are_credited() -> None:
    ledger = TenantLedger()
    ledger.set_peers({"p1": {A: TenantUsage(100.0, 0.0)}}, now=0.0)
    assert ledger.take_credits() == {}  # what it served before this picker knew it is not charged
    ledger.set_peers({"p1": {A: TenantUsage(103.0, 0.0), B: TenantUsage(2.0, 0.0)}}, now=1.0)
    assert ledger.take_credits() == {A: 3.0, B: 2.0}  # B is new from a known peer: all of it
    assert ledger.take_credits() == {}
    ledger.set_peers({"p1": {A: TenantUsage(1.0, 0.0)}}, now=2.0)  # the counter started again
    assert ledger.take_credits() == {A: 1.0}


def test_a_peer_that_disappears_and_returns_is_a_new_baseline() -> None:
    ledger = TenantLedger()
    ledger.set_peers({"p1": {A: TenantUsage(5.0, 1.0)}}, now=0.0)
    ledger.set_peers({}, now=1.0)
    assert ledger.peers_waiting() == {}
    ledger.set_peers({"p1": {A: TenantUsage(9.0, 0.0)}}, now=2.0)
    assert ledger.take_credits() == {}


def test_recent_service_decays_and_sums_this_pickers_and_peers() -> None:
    ledger = TenantLedger(window_s=5.0)
    ledger.served(A, 2.0, now=0.0)
    ledger.set_peers({"p1": {A: TenantUsage(0.0, 0.0)}}, now=0.0)
    ledger.set_peers({"p1": {A: TenantUsage(3.0, 0.0)}}, now=5.0)
    assert ledger.recent(A, 5.0) == pytest.approx(2.0 * math.exp(-1) + 3.0)
    assert ledger.recent(B, 5.0) == 0.0
    assert ledger.own()[A] == TenantUsage(2.0, 0.0)  # this picker publishes only its own


def test_own_figures_carry_the_waiting_work() -> None:
    ledger = TenantLedger()
    ledger.served(A, 1.0, now=0.0)
    ledger.set_waiting({A: 4.0, B: 2.0})
    assert ledger.own() == {A: TenantUsage(1.0, 4.0), B: TenantUsage(0.0, 2.0)}


def test_yields_to_a_tenant_waiting_only_at_a_peer_and_served_clearly_less() -> None:
    ledger = TenantLedger(yield_ratio=1.1)
    ledger.served(A, 10.0, now=0.0)
    ledger.served(B, 9.5, now=0.0)
    ledger.set_peers({"p1": {B: TenantUsage(0.0, 1.0)}}, now=0.0)
    assert not ledger.should_yield(A, 0.0, nowhere)  # within the ratio
    ledger.served(A, 2.0, now=0.0)
    assert ledger.should_yield(A, 0.0, nowhere)
    assert not ledger.should_yield(A, 0.0, lambda band, tenant: tenant == "b")  # B waits here too
    assert not ledger.should_yield(B, 0.0, nowhere)  # the less served one never yields


def test_yields_to_a_higher_band_at_a_peer_and_never_to_a_lower_one() -> None:
    ledger = TenantLedger()
    ledger.set_peers({"p1": {(1, "x"): TenantUsage(0.0, 1.0), (-1, "y"): TenantUsage(0.0, 5.0)}}, now=0.0)
    assert ledger.should_yield(A, 0.0, nowhere)
    ledger.set_peers({"p1": {(-1, "y"): TenantUsage(0.0, 5.0)}}, now=0.0)
    ledger.served(A, 100.0, now=0.0)
    assert not ledger.should_yield(A, 0.0, nowhere)


def test_forgetting_peers_stops_yielding() -> None:
    ledger = TenantLedger()
    ledger.served(A, 10.0, now=0.0)
    ledger.set_peers({"p1": {B: TenantUsage(0.0, 1.0)}}, now=0.0)
    assert ledger.should_yield(A, 0.0, nowhere)
    ledger.forget_peers()
    assert not ledger.should_yield(A, 0.0, nowhere)


def test_tenants_are_bounded() -> None:
    ledger = TenantLedger(max_tenants=100)
    for i in range(1000):
        ledger.served((0, f"t{i}"), 1.0, now=float(i))
    assert len(ledger.own()) <= 100
    assert ledger.recent((0, "t999"), 999.0) == pytest.approx(1.0)  # the newest kept


def item(rid: str, tenant: str, cost: float = 1.0) -> Waiting:
    return Waiting(rid, 0, tenant, cost, deadline=100.0)


def test_a_credited_tenant_goes_after_others_in_the_queue() -> None:
    queue = HoldingQueue(100)
    for i in range(4):
        queue.push(item(f"a{i}", "a"))
        queue.push(item(f"b{i}", "b"))
    order = [queue.pop().request_id for _ in range(2)]  # type: ignore[union-attr]
    assert order == ["a0", "b0"]
    queue.credit(0, "a", 2.0)  # peers served A two requests' worth
    for i in range(4, 8):
        queue.push(item(f"a{i}", "a"))
        queue.push(item(f"b{i}", "b"))
    rest = [w.request_id for w in iter(queue.pop, None)]
    assert rest.index("b7") < rest.index("a7")
    served_a = [r for r in rest[:8] if r.startswith("a")]
    assert len(served_a) < 4  # A's share here shrank by what peers served it


def test_credit_is_bounded_by_the_bands_queued_work_and_needs_the_tenant_waiting() -> None:
    queue = HoldingQueue(100)
    queue.credit(0, "a", 5.0)  # no band: nothing
    queue.push(item("b0", "b"))
    queue.credit(0, "a", 5.0)  # A waits nowhere here: nothing
    queue.push(item("a0", "a"))
    queue.credit(0, "a", 1e9)  # at most behind all queued work (2 s)
    queue.push(item("a1", "a"))
    queue.push(item("b1", "b"))
    queue.push(item("b2", "b"))
    queue.push(item("b3", "b"))
    # without the credit a1 would go before b1; unbounded, after b3
    assert [w.request_id for w in iter(queue.pop, None)] == ["b0", "a0", "b1", "a1", "b2", "b3"]


def test_peek_is_what_pop_returns() -> None:
    queue = HoldingQueue(10)
    assert queue.peek() is None
    queue.push(item("a0", "a"))
    queue.push(item("b0", "b"))
    queue.remove("a0")
    head = queue.peek()
    assert head is not None
    assert head.request_id == "b0"
    assert queue.pop() == head
    assert queue.peek() is None
    queue.push(Waiting("x", 0, "a", 2.0, 1.0))
    queue.push(Waiting("y", 0, "b", 1.0, 1.0))
    assert queue.queued_work() == {(0, "a"): 2.0, (0, "b"): 1.0}
