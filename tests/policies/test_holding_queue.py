"""``policies.holding_queue``: bands first, cost-weighted fairness between tenants inside a band,
bounded length (the lowest band's newest shed), deadlines, removal."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.policies.holding_queue import HoldingQueue, QueueOrder, Waiting


def waiting(rid: str, *, band: int = 0, tenant: str = "t", cost: float = 1.0,
            deadline: float = 100.0) -> Waiting:
    return Waiting(rid, band, tenant, cost, deadline)


def drain(queue: HoldingQueue) -> list[Waiting]:
    out = []
    while (item := queue.pop()) is not None:
        out.append(item)
    return out


def test_a_heavy_tenants_backlog_does_not_hold_up_a_light_one() -> None:
    """Tenant A queues 40 requests, then B and C 5 each (same band, same cost): B's and C's go out
    among the first ones, A is served its share, not its arrival order."""
    queue = HoldingQueue(1000)
    for i in range(40):
        queue.push(waiting(f"a{i}", tenant="A"))
    for i in range(5):
        queue.push(waiting(f"b{i}", tenant="B"))
        queue.push(waiting(f"c{i}", tenant="C"))
    order = [item.tenant for item in drain(queue)]
    assert Counter(order[:15]) == {"A": 5, "B": 5, "C": 5}
    assert order[15:] == ["A"] * 35


def test_fairness_counts_gpu_work_not_requests() -> None:
    """A's requests cost 4 s each, B's 1 s: over the first 20 dispatches B gets ~4 for each of A's."""
    queue = HoldingQueue(1000)
    for i in range(50):
        queue.push(waiting(f"a{i}", tenant="A", cost=4.0))
        queue.push(waiting(f"b{i}", tenant="B", cost=1.0))
    first = Counter(item.tenant for item in drain(queue)[:20])
    assert first["B"] in (15, 16, 17)
    assert first["A"] == 20 - first["B"]


def test_a_higher_band_always_goes_first_and_overflow_sheds_the_lowest_bands_newest() -> None:
    queue = HoldingQueue(4)
    assert queue.push(waiting("low1", band=-1)) is None
    assert queue.push(waiting("low2", band=-1)) is None
    assert queue.push(waiting("mid", band=0)) is None
    assert queue.push(waiting("high", band=5)) is None
    shed = queue.push(waiting("mid2", band=0))
    assert shed is not None
    assert shed.request_id == "low2"  # the lowest band's newest
    assert queue.push(waiting("low3", band=-1)) == waiting("low3", band=-1)  # itself: its tenant's newest
    assert queue.push(waiting("lower", band=-2)) == waiting("lower", band=-2)  # lower still: itself
    assert [item.request_id for item in drain(queue)] == ["high", "mid", "mid2", "low1"]


def test_a_full_queue_sheds_the_newest_of_the_tenant_with_the_most_queued_work() -> None:
    """A heavy tenant filled the queue: a light tenant's arrival displaces the heavy one's newest; the
    heavy tenant's own arrival is shed itself."""
    queue = HoldingQueue(4)
    for i in range(3):
        queue.push(waiting(f"heavy-{i}", tenant="heavy"))
    queue.push(waiting("light-0", tenant="light"))
    shed = queue.push(waiting("light-1", tenant="light"))
    assert shed is not None
    assert shed.request_id == "heavy-2"
    assert queue.push(waiting("heavy-3", tenant="heavy")) == waiting("heavy-3", tenant="heavy")
    # by work, not by count: one expensive request outweighs two cheap ones
    queue = HoldingQueue(3)
    queue.push(waiting("big", tenant="a", cost=10.0))
    queue.push(waiting("small-0", tenant="b"))
    queue.push(waiting("small-1", tenant="b"))
    shed = queue.push(waiting("small-2", tenant="b"))
    assert shed is not None
    assert shed.request_id == "big"


def test_deadlines_and_removal_take_requests_out_and_ids_can_come_back() -> None:
    queue = HoldingQueue(10)
    queue.push(waiting("r1", deadline=5.0))
    queue.push(waiting("r2", deadline=3.0))
    queue.push(waiting("r3", deadline=9.0))
    assert queue.remove("r3") is not None
    assert queue.remove("r3") is None
    assert [item.request_id for item in queue.expired(5.0)] == ["r2", "r1"]
    queue.push(waiting("r3", deadline=50.0))  # queued again: its old deadline (9) does not apply
    assert queue.expired(10.0) == []
    assert [item.request_id for item in drain(queue)] == ["r3"]
    assert len(queue) == 0
    with pytest.raises(ValueError, match="cost"):
        queue.push(waiting("bad", cost=0.0))
    queue.push(waiting("dup"))
    with pytest.raises(ValueError, match="already waiting"):
        queue.push(waiting("dup"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "pop", "remove", "expire"]), st.integers(-2, 2),
                          st.sampled_from("ABC"), st.floats(0.1, 5.0), st.integers(0, 30)), max_size=80),
       st.integers(1, 12))
def test_any_sequence_keeps_the_bounds_and_the_bands_order(
    operations: list[tuple[str, int, str, float, int]], max_length: int,
) -> None:
    queue = HoldingQueue(max_length)
    live: dict[str, Waiting] = {}
    for step, (op, band, tenant, cost, n) in enumerate(operations):
        if op == "push":
            item = Waiting(f"r{step}", band, tenant, cost, float(n))
            shed = queue.push(item)
            live[item.request_id] = item
            if shed is not None:
                lowest = min(w.band for w in live.values())
                assert shed.band == lowest
                work: dict[str, float] = {}
                for w in live.values():
                    if w.band == lowest:
                        work[w.tenant] = work.get(w.tenant, 0.0) + w.cost
                assert work[shed.tenant] == pytest.approx(max(work.values()))  # the heaviest tenant's
                assert shed.request_id == max((w.request_id for w in live.values()  # newest
                                               if w.band == lowest and w.tenant == shed.tenant),
                                              key=lambda rid: int(rid[1:]))
                del live[shed.request_id]
        elif op == "pop":
            popped = queue.pop()
            if popped is None:
                assert not live
            else:
                assert popped.band == max(w.band for w in live.values())
                del live[popped.request_id]
        elif op == "remove" and live:
            rid = sorted(live)[n % len(live)]
            assert queue.remove(rid) == live.pop(rid)
        elif op == "expire":
            for item in queue.expired(float(n)):
                assert item.deadline <= n
                del live[item.request_id]
            assert all(w.deadline > n for w in live.values())
        assert len(queue) == len(live) <= max_length
        assert sum(queue.waiting().values()) == len(live)


def test_slo_deadline_order_serves_a_tenants_most_urgent_request_first() -> None:
    """One tenant: the request whose first token is due soonest goes first, those without an
    objective last in arrival order; ``fcfs`` (the default) keeps arrival order."""
    dues = {"none1": math.inf, "late": 9.0, "none2": math.inf, "soon": 2.0, "mid": 5.0}
    cases: list[tuple[QueueOrder, list[str]]] = [
        ("slo-deadline", ["soon", "mid", "late", "none1", "none2"]), ("fcfs", list(dues))]
    for order, expected in cases:
        queue = HoldingQueue(100, order=order)
        for rid, due in dues.items():
            queue.push(Waiting(rid, 0, "t", 1.0, 100.0, due))
        first = queue.peek()
        assert first is not None
        assert first.request_id == expected[0]
        assert [item.request_id for item in drain(queue)] == expected


def test_slo_deadline_order_keeps_the_fairness_between_tenants() -> None:
    """A's urgent requests take A's turns, not B's: the tenants alternate as under ``fcfs``."""
    queue = HoldingQueue(100, order="slo-deadline")
    for i in range(4):
        queue.push(Waiting(f"a{i}", 0, "A", 1.0, 100.0, 50.0 - i))
    for i in range(4):
        queue.push(Waiting(f"b{i}", 0, "B", 1.0, 100.0))
    out = [item.request_id for item in drain(queue)]
    assert [rid[0] for rid in out] == list("abababab")
    assert [rid for rid in out if rid[0] == "a"] == ["a3", "a2", "a1", "a0"]


def test_slo_deadline_order_after_removals_and_expiries() -> None:
    queue = HoldingQueue(100, order="slo-deadline")
    queue.push(Waiting("x", 0, "t", 1.0, 10.0, 1.0))  # most urgent, but times out in the queue
    queue.push(Waiting("y", 0, "t", 1.0, 100.0, 3.0))
    queue.push(Waiting("z", 0, "t", 1.0, 100.0, 2.0))
    queue.push(Waiting("w", 0, "t", 1.0, 100.0, 4.0))
    first = queue.peek()
    assert first is not None
    assert first.request_id == "x"
    assert [item.request_id for item in queue.expired(10.0)] == ["x"]
    assert queue.remove("z") is not None
    assert [item.request_id for item in drain(queue)] == ["y", "w"]


def test_an_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown queue order"):
        HoldingQueue(10, order="lifo")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "pop", "remove", "expire"]), st.sampled_from("AB"),
                          st.integers(0, 30), st.one_of(st.none(), st.integers(0, 30))), max_size=60))
def test_slo_deadline_order_pops_each_tenants_most_urgent(
    operations: list[tuple[str, str, int, int | None]],
) -> None:
    """Whatever happens, a popped request is the most urgent of its tenant's waiting ones (ties:
    the oldest), and ``peek`` names it first."""
    queue = HoldingQueue(1000, order="slo-deadline")
    live: dict[str, Waiting] = {}
    for step, (op, tenant, n, due) in enumerate(operations):
        if op == "push":
            item = Waiting(f"r{step}", 0, tenant, 1.0, float(n), math.inf if due is None else float(due))
            queue.push(item)
            live[item.request_id] = item
        elif op == "pop":
            peeked = queue.peek()
            popped = queue.pop()
            assert peeked == popped
            assert (popped is None) == (not live)
            if popped is not None:
                mine = [w for w in live.values() if w.tenant == popped.tenant]
                assert (popped.due, int(popped.request_id[1:])) == min(
                    (w.due, int(w.request_id[1:])) for w in mine)
                del live[popped.request_id]
        elif op == "remove" and live:
            rid = sorted(live)[n % len(live)]
            assert queue.remove(rid) == live.pop(rid)
        elif op == "expire":
            for item in queue.expired(float(n)):
                del live[item.request_id]
        assert len(queue) == len(live)
    assert sorted(w.request_id for w in drain(queue)) == sorted(live)
