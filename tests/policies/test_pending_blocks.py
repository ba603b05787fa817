"""``policies.pending_blocks``: the keys of requests in flight, per endpoint, until they end."""

from __future__ import annotations

from kvgate.policies.pending_blocks import PendingBlocks


def test_requests_in_flight_hold_their_keys_until_they_end() -> None:
    pending = PendingBlocks()
    pending.add("r1", "a", [1, 2, 3, 4])
    pending.add("r2", "b", [1, 2])
    pending.add("r3", "a", [1, 2, 9])
    assert pending.matches([1, 2, 3, 5]) == {"a": 3, "b": 2}
    assert pending.matches([7, 1]) == {}
    pending.remove("r1")
    assert pending.matches([1, 2, 3, 5]) == {"a": 2, "b": 2}  # r3 still holds 1, 2 on a
    pending.move("r2", "c")
    assert pending.matches([1, 2]) == {"a": 2, "c": 2}
    pending.forget_endpoint("a")
    assert pending.matches([1, 2]) == {"c": 2}
    pending.remove("r2")
    pending.remove("r2")  # idempotent
    assert pending.matches([1, 2]) == {}
    assert len(pending) == 0


def test_it_is_bounded_oldest_first() -> None:
    pending = PendingBlocks(max_requests=2)
    for i in range(3):
        pending.add(f"r{i}", f"e{i}", [i, 100])
    assert len(pending) == 2
    assert pending.matches([0, 100]) == {}
    assert pending.matches([2, 100]) == {"e2": 2}
