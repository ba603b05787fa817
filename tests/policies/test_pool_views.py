"""``policies.pool_views``: a published tuple says which endpoints changed since earlier ones."""

from __future__ import annotations

from kvgate.policies.pool_views import PoolViews
from tests.policies.helpers import view


def test_a_first_tuple_starts_a_lineage_and_equals_the_plain_tuple() -> None:
    views = (view(0), view(1))
    first = PoolViews.after(None, views, None)
    assert first.generation == 0
    assert first.changed_since(first) == set()
    assert first.changed_since(views) is None  # a plain tuple: compare them
    assert PoolViews.after(views, views, {"x"}).changed_since(views) is None  # a new lineage
    assert tuple(first) == views  # a tuple of the same views


def test_changes_accumulate_over_the_publishes_between_two_tuples() -> None:
    first = PoolViews.after(None, (view(0), view(1), view(2)), None)
    second = PoolViews.after(first, (view(0, waiting=1), first[1], first[2]), {first[0].address})
    third = PoolViews.after(second, (second[0], second[1], view(2, waiting=2)), {first[2].address})
    assert third.changed_since(second) == {first[2].address}
    assert third.changed_since(first) == {first[0].address, first[2].address}
    assert second.changed_since(third) is None  # later than itself: cannot say
    unknown = PoolViews.after(third, (view(0), view(1)), None)  # the membership changed
    after = PoolViews.after(unknown, (view(0), view(1)), set())
    assert after.changed_since(unknown) == set()
    assert after.changed_since(third) is None


def test_only_the_last_keep_publishes_are_remembered() -> None:
    first = PoolViews.after(None, (view(0),), None)
    latest = first
    for _ in range(PoolViews.KEEP):
        latest = PoolViews.after(latest, (view(0),), {first[0].address})
    assert len(latest.recent) == PoolViews.KEEP
    assert latest.changed_since(first) == {first[0].address}
    latest = PoolViews.after(latest, (view(0),), set())
    assert latest.changed_since(first) is None  # KEEP + 1 publishes back


def test_another_lineage_of_the_same_views_cannot_say() -> None:
    views = (view(0),)
    one, other = PoolViews.after(None, views, None), PoolViews.after(None, views, None)
    assert PoolViews.after(one, views, set()).changed_since(other) is None
