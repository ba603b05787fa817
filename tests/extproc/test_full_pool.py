"""``extproc.full_pool``: while a pool stays full, a look checks only what could have room since."""

from __future__ import annotations

from kvgate.extproc.full_pool import FullPool
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.types import EndpointView
from tests.policies.helpers import view


class Room:
    """Which addresses have room, and which were asked about."""

    def __init__(self, *having: str) -> None:
        self.having = set(having)
        self.asked: list[str] = []

    def __call__(self, v: EndpointView) -> bool:
        self.asked.append(v.address)
        return v.address in self.having


def snapshot() -> PoolViews:
    return PoolViews.after(None, [view(i) for i in range(1, 6)], None)


def test_nothing_is_known_before_a_pass_found_the_pool_full() -> None:
    assert FullPool().still_full(snapshot(), 0.0, Room()) is None


def test_the_same_snapshot_stays_full_without_a_look_at_any_endpoint() -> None:
    full, pool, room = FullPool(), snapshot(), Room()
    full.found_full(pool, 0.0)
    assert full.still_full(pool, 0.001, room) is True
    assert room.asked == []


def test_only_the_changed_and_freed_endpoints_are_looked_at() -> None:
    full, first = FullPool(), snapshot()
    full.found_full(first, 0.0)
    second = PoolViews.after(first, (*first[:2], view(3, waiting=1), *first[3:]), {first[2].address})
    room = Room()
    full.freed(first[0].address)
    assert full.still_full(second, 0.001, room) is True
    assert sorted(room.asked) == sorted([first[0].address, first[2].address])
    room = Room(first[2].address)
    full.freed(first[2].address)
    assert full.still_full(second, 0.002, room) is False  # room there now: the next look passes over all
    assert full.still_full(second, 0.003, Room()) is None


def test_a_pass_again_after_recheck_s_for_another_snapshot_or_a_moved_endpoint() -> None:
    full, pool = FullPool(), snapshot()
    full.found_full(pool, 0.0)
    assert full.still_full(pool, FullPool.RECHECK_S, Room()) is None  # peers' ends are not told
    full.found_full(pool, 1.0)
    assert full.still_full(tuple(pool), 1.001, Room()) is None  # a plain tuple: what changed is unknown
    moved = PoolViews.after(pool, (pool[1], pool[0], *pool[2:]), {pool[0].address})
    assert full.still_full(moved, 1.001, Room()) is None
    full.found_full(pool, 2.0)
    full.freed("10.9.9.9:8000")  # a request that ended on an endpoint no longer in the pool
    assert full.still_full(pool, 2.001, Room()) is True
    full.forget()
    assert full.still_full(pool, 2.002, Room()) is None
