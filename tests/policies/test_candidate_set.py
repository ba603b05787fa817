"""``policies.plugins.candidates``: a large pool is narrowed to likely winners before scoring."""

from __future__ import annotations

import random

from kvgate.policies.plugins.candidates import CandidateSetFilter, CandidateSetParams
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
    assert len(kept) <= 1 + 1 + 1 + 10
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
