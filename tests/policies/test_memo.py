from __future__ import annotations

from collections.abc import Sequence

from kvgate.policies.memo import TupleMemo, ViewRecords
from kvgate.policies.pool_views import PoolViews, ViewsAt
from kvgate.policies.types import EndpointView
from tests.policies.helpers import view


def test_tuple_memo_hits_only_for_the_same_tuple_object() -> None:
    calls: list[int] = []

    def count(endpoints: Sequence[EndpointView]) -> int:
        calls.append(len(endpoints))
        return len(endpoints)

    memo: TupleMemo[int] = TupleMemo()
    snapshot = (view(1), view(2))
    assert memo.get(snapshot, count) == 2
    assert memo.get(snapshot, count) == 2
    assert calls == [2]
    assert memo.get(tuple(snapshot), count) == 2  # tuple(t) is t: the same snapshot
    assert calls == [2]
    assert memo.get((view(1), view(2)), count) == 2  # an equal tuple is another snapshot
    assert calls == [2, 2]
    as_list = [view(1)]
    assert memo.get(as_list, count) == 1
    assert memo.get(as_list, count) == 1
    assert calls == [2, 2, 1, 1]  # lists are never memoised: they could change between calls


def test_view_records_rebuild_only_replaced_views() -> None:
    built: list[str] = []

    def record(v: EndpointView) -> str:
        built.append(v.address)
        return v.address

    records: ViewRecords[str] = ViewRecords(record)
    first = (view(1), view(2), view(3))
    assert list(records.get(first)) == [v.address for v in first]
    assert records.get(first) == records.get(first)
    assert len(built) == 3
    rescraped = (first[0], view(2, waiting=4), first[2])
    assert list(records.get(rescraped)) == [v.address for v in rescraped]
    assert built == [first[0].address, first[1].address, first[2].address, rescraped[1].address]
    shorter = (view(7),)
    assert list(records.get(shorter)) == ["10.0.0.7:8000"]
    assert list(records.get([view(8)])) == ["10.0.0.8:8000"]


def test_view_records_follow_a_snapshot_that_names_its_changes() -> None:
    built: list[str] = []

    def record(v: EndpointView) -> tuple[str, int]:
        built.append(v.address)
        return (v.address, v.metrics.waiting if v.metrics else -1)

    records: ViewRecords[tuple[str, int]] = ViewRecords(record)
    first = PoolViews.after(None, [view(i) for i in range(1, 6)], None)
    assert [r[1] for r in records.get(first)] == [0] * 5
    built.clear()
    second = PoolViews.after(first, (first[0], view(2, waiting=7), *first[2:]), {first[1].address})
    assert [r[1] for r in records.get(second)] == [0, 7, 0, 0, 0]
    assert built == [first[1].address]  # the named change alone
    assert [r[1] for r in records.get(first)] == [0] * 5  # the earlier list was not changed in place
    moved = PoolViews.after(first, (first[1], first[0], *first[2:]), {first[0].address})
    assert [r[0] for r in records.get(moved)] == [v.address for v in moved]  # not in place: all again


def test_view_records_of_a_subset_come_from_its_snapshot_by_position() -> None:
    built: list[str] = []

    def record(v: EndpointView) -> tuple[str, int]:
        built.append(v.address)
        return (v.address, v.metrics.waiting if v.metrics else -1)

    records: ViewRecords[tuple[str, int]] = ViewRecords(record)
    first = PoolViews.after(None, [view(i) for i in range(1, 9)], None)
    subset = ViewsAt.of(first, [1, 4, 6])
    assert list(subset) == [first[1], first[4], first[6]]
    assert records.get(subset) == [(first[i].address, 0) for i in (1, 4, 6)]
    assert len(built) == 8  # the snapshot's records, once
    built.clear()
    second = PoolViews.after(first, (*first[:4], view(5, waiting=3), *first[5:]), {first[4].address})
    assert records.get(ViewsAt.of(second, [0, 4])) == [(first[0].address, 0), (first[4].address, 3)]
    assert built == [first[4].address]  # the named change alone, though the subset is new
    built.clear()
    plain = tuple(second)  # a snapshot that names nothing: the subset's own views
    assert records.get(ViewsAt.of(plain, [2])) == [(first[2].address, 0)]
    assert built == []  # (seen before: kept per view)
    assert records.get(ViewsAt.of(plain, [4, 7])) == [(first[4].address, 3), (first[7].address, 0)]
