"""``policies.plugins.candidates``: a large pool is narrowed to likely winners before scoring."""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvgate.policies.plugins.candidates import CandidateSetFilter, CandidateSetParams
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.profile import load_profile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.state import InProcessState
from kvgate.policies.types import EndpointView
from tests.policies.helpers import NOW, context, index_of, request, text, view


def pool(n: int) -> tuple[EndpointView, ...]:
    return tuple(view(i, waiting=3, running=20, kv=0.5) for i in range(n))


def test_a_pool_at_or_below_the_bound_passes_whole_and_unchanged() -> None:
    endpoints = pool(128)
    assert CandidateSetFilter().filter(context(request()), endpoints) is endpoints


def test_above_it_keeps_the_prefix_holders_the_adapters_the_least_loaded_and_a_sample() -> None:
    views = list(pool(400))
    views[7] = view(7, waiting=0, running=1, kv=0.1)  # the least loaded
    views[300] = view(300, waiting=3, running=20, kv=0.5, active=frozenset({"sql-lora"}))
    endpoints = tuple(views)
    state = InProcessState()
    prompt = text(1, 4000)
    ctx = context(request(prompt=prompt, model="sql-lora"), state)
    state.prefix_insert(endpoints[123].address, ctx.prefix_hashes(), 10_000)
    state.prefix_insert(endpoints[222].address, ctx.prefix_hashes()[:3], 10_000)
    narrow = CandidateSetFilter(CandidateSetParams(holders=1, least_loaded=1, sample=10))
    chosen = narrow.filter(ctx, endpoints)
    kept = [index_of(e.address) for e in chosen]
    assert 123 in kept  # the longest holder (222's shorter match is beyond holders=1)
    assert 7 in kept
    assert 300 in kept
    assert kept == sorted(kept)  # the pool's order
    assert 10 <= len(kept) <= 1 + 1 + 1 + 10
    assert len(chosen) < len(endpoints)


def test_the_default_profile_still_picks_the_prefix_holder_in_a_pool_of_a_thousand() -> None:
    endpoints = pool(1000)
    scheduler = ProfileScheduler(load_profile("default"), rng=random.Random(3))
    prompt = text(2, 20_000)
    warm = request("warm", prompt)
    first = scheduler.schedule(warm, endpoints, NOW).pick
    scheduler.on_picked(warm, first, NOW)
    scheduler.on_finished(warm, first, ok=True, now=NOW)
    again = request("again", prompt + " and one more question")
    assert scheduler.schedule(again, endpoints, NOW).pick == first


def kept_after(narrow: CandidateSetFilter, endpoints: Sequence[EndpointView], now: float,
               state: InProcessState | None = None, prompt: str = "", model: str = "base") -> list[int]:
    ctx = context(request(prompt=prompt, model=model), state)
    ctx.now = now
    return [index_of(e.address) for e in narrow.filter(ctx, endpoints)]


def test_the_least_loaded_follow_each_new_snapshot_and_the_unchanged_each_rebuild() -> None:
    narrow = CandidateSetFilter(CandidateSetParams(holders=0, least_loaded=2, sample=0))
    views = list(pool(300))
    views[10] = view(10, waiting=0, running=1, kv=0.1)
    views[11] = view(11, waiting=0, running=2, kv=0.1)
    views[12] = view(12, waiting=0, running=3, kv=0.1)
    assert kept_after(narrow, tuple(views), NOW) == [10, 11]
    soon = NOW + CandidateSetFilter.REBUILD_S / 2
    views[20] = view(20, waiting=0, running=0, kv=0.0)  # rescraped: now the least loaded
    assert kept_after(narrow, tuple(views), soon) == [10, 20]
    views[10] = view(10, waiting=9)  # rescraped: busy now; 11, unchanged, ranks second from the next rebuild
    assert kept_after(narrow, tuple(views), soon) == [10, 20]
    later = NOW + 2 * CandidateSetFilter.REBUILD_S
    assert kept_after(narrow, tuple(views), later) == [11, 20]
    views[12] = view(12, healthy=False)  # an unhealthy endpoint is never among them
    views[11] = view(11, healthy=False)
    assert kept_after(narrow, tuple(views), later + 2 * CandidateSetFilter.REBUILD_S) == [0, 20]  # by place


def test_an_adapter_loaded_since_the_last_rebuild_counts_at_once_and_one_unloaded_no_more() -> None:
    narrow = CandidateSetFilter(CandidateSetParams(holders=0, least_loaded=0, sample=0))
    views = list(pool(300))
    views[10] = view(10, active=frozenset({"a"}))
    assert kept_after(narrow, tuple(views), NOW, model="a") == [10]
    views[20] = view(20, active=frozenset({"a"}))  # rescraped: it loaded the adapter
    views[10] = view(10)  # and 10 unloaded it
    soon = NOW + CandidateSetFilter.REBUILD_S / 2
    assert kept_after(narrow, tuple(views), soon, model="a") == [20]
    assert kept_after(narrow, tuple(views), soon, model="b") == []
    views[30] = view(30, waiting_loras=frozenset({"b"}))  # waiting for a slot counts too
    assert kept_after(narrow, tuple(views), soon, model="b") == [30]
    assert kept_after(narrow, views, soon, model="b") == [30]  # a list: rebuilt


def test_a_prefix_holder_is_found_when_the_positions_moved_and_a_newcomer_after_the_rebuild_period() -> None:
    narrow = CandidateSetFilter(CandidateSetParams(holders=2, least_loaded=0, sample=0))
    endpoints = pool(300)
    assert kept_after(narrow, endpoints, NOW) == []
    state = InProcessState()
    prompt = text(3, 4000)
    hashes = context(request(prompt=prompt)).prefix_hashes()
    newcomer = view(999, waiting=3, running=20, kv=0.5)
    state.prefix_insert(newcomer.address, hashes, 10_000)
    state.prefix_insert(endpoints[123].address, hashes, 10_000)
    moved = (*endpoints[1:], newcomer)  # the same size: endpoint 0 left, 999 came
    soon = NOW + CandidateSetFilter.REBUILD_S / 2
    assert kept_after(narrow, moved, soon, state, prompt) == [123, 999]  # 123 moved: rebuilt
    narrow = CandidateSetFilter(CandidateSetParams(holders=2, least_loaded=0, sample=0))
    kept_after(narrow, endpoints, NOW)
    replaced = (*endpoints[:50], newcomer, *endpoints[51:])  # in 50's place: nothing else moved
    assert kept_after(narrow, replaced, soon, state, prompt) == [123]
    assert kept_after(narrow, replaced, NOW + 2 * CandidateSetFilter.REBUILD_S, state, prompt) == [999, 123]


def test_named_changes_keep_the_same_candidates_as_comparing_the_tuples() -> None:
    rng = random.Random(5)
    named = CandidateSetFilter(CandidateSetParams(holders=0, least_loaded=8, sample=0))
    compared = CandidateSetFilter(CandidateSetParams(holders=0, least_loaded=8, sample=0))
    published = PoolViews.after(None, pool(300), None)
    plain: tuple[EndpointView, ...] = tuple(published)
    now = NOW
    for step in range(400):
        rescraped = {rng.randrange(300) for _ in range(rng.randint(1, 5))}
        views = list(plain)
        for i in rescraped:
            views[i] = view(i, waiting=rng.randint(0, 4), running=rng.randint(0, 30), kv=rng.random(),
                            active=frozenset({"a"}) if rng.random() < 0.1 else frozenset())
        plain = tuple(views)
        published = PoolViews.after(published, views, {views[i].address for i in rescraped})
        now += 0.001
        if step % 3:  # some picks see several publishes
            continue
        for model in ("base", "a"):
            expected = kept_after(compared, plain, now, model=model)
            assert kept_after(named, published, now, model=model) == expected


def test_a_named_endpoint_away_from_its_place_rebuilds() -> None:
    narrow = CandidateSetFilter(CandidateSetParams(holders=0, least_loaded=1, sample=0))
    first = PoolViews.after(None, pool(300), None)
    assert kept_after(narrow, first, NOW) == [0]
    moved = (view(299, waiting=0, running=0, kv=0.0), *first[1:299], first[0])  # 299 and 0 swapped
    second = PoolViews.after(first, moved, {moved[0].address})  # (a scraper would say None)
    assert kept_after(narrow, second, NOW + CandidateSetFilter.REBUILD_S / 2) == [299]  # found, now first


def test_keep_is_asked_about_the_candidates_and_about_the_pool_only_when_none_of_them_pass() -> None:
    endpoints = pool(400)
    scheduler = ProfileScheduler(load_profile("default"), rng=random.Random(5))
    asked: list[tuple[str, ...]] = []

    def everyone(views: Sequence[EndpointView]) -> Sequence[EndpointView]:
        asked.append(tuple(v.address for v in views))
        return views

    scheduler.schedule(request("a"), endpoints, NOW, keep=everyone)
    assert len(asked) == 1
    assert len(asked[0]) < 100  # the candidate set's, not the pool's 400
    asked.clear()

    def only_outside_the_candidates(views: Sequence[EndpointView]) -> Sequence[EndpointView]:
        asked.append(tuple(v.address for v in views))
        if len(asked) == 1:
            return ()  # none of the candidates has room
        return tuple(v for v in views if v.address not in asked[0])[-1:]

    result = scheduler.schedule(request("b"), endpoints, NOW, keep=only_outside_the_candidates)
    assert len(asked[1]) == 400  # the pool was asked
    assert result.pick.address not in asked[0]
    assert result.pick.address == tuple(a for a in asked[1] if a not in asked[0])[-1]
    nobody = scheduler.schedule(request("c"), endpoints, NOW, keep=lambda views: ())
    assert nobody.pick in {v.endpoint for v in endpoints}  # nobody has room: the pick among all
