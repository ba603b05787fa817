"""``policies.holding_queue``: bands first, cost-weighted fairness between tenants inside a band,
bounded length (the lowest band's newest shed), deadlines, removal."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.policies.holding_queue import HoldingQueue, Waiting


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
