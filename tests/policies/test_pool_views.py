"""``policies.pool_views``: a published tuple says which endpoints changed since earlier ones."""

from __future__ import annotations

import random

from kvgate.policies.pool_views import PoolViews, SubsetViews
from kvgate.policies.types import EndpointView
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


def test_a_subset_follows_named_changes_and_names_its_own() -> None:
    rng = random.Random(3)
    def odd(v: EndpointView) -> bool:
        return int(v.address.split(".")[3].split(":")[0]) % 2 == 1

    decodes = SubsetViews(odd)
    parent = PoolViews.after(None, [view(i) for i in range(40)], None)
    subset = decodes.of(parent)
    assert isinstance(subset, PoolViews)
    for _ in range(200):
        i = rng.randrange(40)
        views = list(parent)
        views[i] = view(i, waiting=rng.randint(0, 9))
        before = subset
        parent = PoolViews.after(parent, views, {views[i].address})
        subset = decodes.of(parent)
        assert list(subset) == [v for v in parent if odd(v)]
        assert isinstance(subset, PoolViews)
        assert subset.changed_since(before) == ({views[i].address} if i % 2 else set())
        assert decodes.of(parent) is subset  # the same snapshot: the same subset


def test_a_subset_of_another_snapshot_is_selected_anew_and_of_a_list_every_time() -> None:
    odd = SubsetViews(lambda v: v.address.endswith("1:8000") or v.address.endswith("3:8000"))
    first = odd.of(PoolViews.after(None, [view(i) for i in range(5)], None))
    plain = tuple(view(i, waiting=1) for i in range(5))
    again = odd.of(plain)
    assert isinstance(again, PoolViews)
    assert [v.metrics.waiting for v in again if v.metrics] == [1, 1]
    assert again.changed_since(first) is None  # selected anew: not known
    listed = odd.of(list(plain))
    assert isinstance(listed, list)
    assert listed == list(again)


def test_with_replaced_copies_the_tuple_with_the_changed_views_at_their_positions() -> None:
    first = PoolViews.after(None, [view(i) for i in range(1, 5)], None)
    positions = {v.address: i for i, v in enumerate(first)}
    new = {first[2].address: view(3, waiting=9)}
    second = PoolViews.with_replaced(first, positions, set(new), new.get)
    assert second is not None
    assert [v.metrics.waiting for v in second if v.metrics] == [0, 0, 9, 0]
    assert second[0] is first[0]
    assert second.changed_since(first) == set(new)
    wrong = {first[1].address: 2}  # not where the tuple has it
    assert PoolViews.with_replaced(first, wrong, {first[1].address}, lambda a: view(1)) is None
    assert PoolViews.with_replaced(first, positions, {first[1].address}, lambda a: None) is None
