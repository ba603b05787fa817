from __future__ import annotations

import pytest

from kvgate.policies.errors import NoEligibleEndpointError
from kvgate.policies.plugins.estimated_ttft import EstimatedTtftScorer
from kvgate.policies.plugins.filters import HealthyFilter, LoraFilter, SaturationFilter, SubsetHintFilter
from kvgate.policies.plugins.pickers import (
    MaxScorePicker,
    RandomPicker,
    RoundRobinPicker,
    WeightedRandomPicker,
)
from kvgate.policies.plugins.scorers import (
    InFlightRequestsScorer,
    InFlightTokensScorer,
    KvCacheUtilizationScorer,
    LoraAffinityScorer,
    PrefixCacheScorer,
    QueueScorer,
    RunningRequestsScorer,
    SessionAffinityScorer,
)
from kvgate.policies.pool_views import PoolViews
from kvgate.policies.state import InProcessState
from tests.policies.helpers import context, request, text, view


def addr(i: int) -> str:
    return f"10.0.0.{i}:8000"


def test_queue_scorer_normalises_and_all_equal_is_one() -> None:
    eps = [view(1, waiting=0), view(2, waiting=5), view(3, waiting=10)]
    assert QueueScorer().score(context(request()), eps) == {addr(1): 1.0, addr(2): 0.5, addr(3): 0.0}
    same = [view(1, waiting=3), view(2, waiting=3)]
    assert QueueScorer().score(context(request()), same) == {addr(1): 1.0, addr(2): 1.0}


def test_running_and_kv_scorers() -> None:
    eps = [view(1, running=2, kv=0.25), view(2, running=6, kv=0.75)]
    assert RunningRequestsScorer().score(context(request()), eps) == {addr(1): 1.0, addr(2): 0.0}
    assert KvCacheUtilizationScorer().score(context(request()), eps) == {addr(1): 0.75, addr(2): 0.25}


def test_inflight_scorers_read_own_counts() -> None:
    state = InProcessState()
    state.inflight_add("a", addr(1), 100)
    state.inflight_add("b", addr(1), 100)
    state.inflight_add("c", addr(2), 1000)
    eps = [view(1), view(2), view(3)]
    ctx = context(request(), state)
    assert InFlightRequestsScorer().score(ctx, eps) == {addr(1): 0.0, addr(2): 0.5, addr(3): 1.0}
    assert InFlightTokensScorer().score(ctx, eps) == {addr(1): 0.8, addr(2): 0.0, addr(3): 1.0}


def test_lora_affinity_scores() -> None:
    eps = [
        view(1, active=frozenset({"x"}), max_loras=2),
        view(2, active=frozenset({"y"}), max_loras=2),
        view(3, active=frozenset({"y", "z"}), waiting_loras=frozenset({"x"}), max_loras=2),
        view(4, active=frozenset({"y", "z"}), max_loras=2),
    ]
    scores = LoraAffinityScorer().score(context(request(model="x")), eps)
    assert scores == {addr(1): 1.0, addr(2): 0.8, addr(3): 0.6, addr(4): 0.0}


def test_lora_filter_prefers_active_then_free_slot() -> None:
    eps = [view(1, active=frozenset({"x"}), max_loras=1), view(2, max_loras=1), view(3, max_loras=0)]
    assert LoraFilter().filter(context(request(model="x")), eps) == [eps[0]]
    queued_x = view(4, active=frozenset({"y"}), waiting_loras=frozenset({"x"}), max_loras=1)
    cold = [view(2, max_loras=1), queued_x]
    assert LoraFilter().filter(context(request(model="x")), cold) == [cold[0]]
    assert LoraFilter().filter(context(request(model="base")), eps) == eps


def test_prefix_scorer_matched_over_total() -> None:
    state = InProcessState()
    prompt = text(1, 64 * 10)
    ctx = context(request(prompt=prompt), state)
    state.prefix_insert(addr(1), ctx.prefix_hashes(), 100)
    state.prefix_insert(addr(2), ctx.prefix_hashes()[:4], 100)
    scores = PrefixCacheScorer().score(context(request(prompt=prompt), state), [view(1), view(2), view(3)])
    assert scores == {addr(1): 1.0, addr(2): 0.4}


def test_session_affinity_scorer() -> None:
    state = InProcessState()
    state.session_set("s1", addr(2))
    ctx = context(request(), state)
    ctx.session_id = "s1"
    assert SessionAffinityScorer().score(ctx, [view(1), view(2)]) == {addr(2): 1.0}
    ctx.session_id = None
    assert SessionAffinityScorer().score(ctx, [view(1), view(2)]) == {}


def test_healthy_filter_drops_unscraped_and_unhealthy_unless_none_remain() -> None:
    eps = [view(1), view(2, healthy=False), view(3, scraped=False)]
    assert HealthyFilter().filter(context(request()), eps) == [eps[0]]
    bad = eps[1:]
    assert HealthyFilter().filter(context(request()), bad) == bad


@pytest.mark.parametrize(
    "saturated",
    [
        {"waiting": 5},
        {"kv": 0.8},
        {"age": 0.5},
        {"healthy": False},
    ],
)
def test_saturation_filter(saturated: dict[str, object]) -> None:
    eps = [view(1), view(2, **saturated)]  # type: ignore[arg-type]
    assert SaturationFilter().filter(context(request()), eps) == [eps[0]]
    assert SaturationFilter().filter(context(request()), eps[1:]) == eps[1:]


def test_saturation_filter_parameters() -> None:
    lenient = SaturationFilter.from_parameters({"queue_threshold": 50, "kv_threshold": 0.99})
    eps = [view(1), view(2, waiting=10, kv=0.9)]
    assert lenient.filter(context(request()), eps) == eps


def test_subset_hint_filter() -> None:
    eps = [view(1), view(2), view(3)]
    by_ip = request(subset=frozenset({"10.0.0.2"}))
    assert SubsetHintFilter().filter(context(by_ip), eps) == [eps[1]]
    by_address = request(subset=frozenset({addr(3), "10.9.9.9:1"}))
    assert SubsetHintFilter().filter(context(by_address), eps) == [eps[2]]
    with pytest.raises(NoEligibleEndpointError):
        SubsetHintFilter().filter(context(request(subset=frozenset({"10.9.9.9"}))), eps)


def test_subset_hint_filter_keeps_what_a_hint_allows_per_snapshot() -> None:
    hint = SubsetHintFilter()
    first = PoolViews.after(None, [view(i) for i in range(1, 7)], None)
    every = frozenset(v.address for v in first)
    assert hint.filter(context(request(subset=every)), first) is first  # all allowed: the snapshot itself
    # the same hint, as each request brings it (a new set, equal)
    half = hint.filter(context(request(subset=frozenset({addr(2), "10.0.0.5"}))), first)
    assert list(half) == [first[1], first[4]]
    assert hint.filter(context(request(subset=frozenset({addr(2), "10.0.0.5"}))), first) is half
    rescraped = PoolViews.after(first, (*first[:4], view(5, waiting=2), first[5]), {first[4].address})
    again = hint.filter(context(request(subset=frozenset({addr(2), "10.0.0.5"}))), rescraped)
    assert list(again) == [first[1], rescraped[4]]
    # the subset names its own change, so what follows it downstream follows it by that change alone
    assert isinstance(again, PoolViews)
    assert again.changed_since(half) == {first[4].address}
    other_hint = hint.filter(context(request(subset=frozenset({"10.0.0.1"}))), rescraped)
    assert list(other_hint) == [first[0]]


def test_max_score_picker_spreads_ties_and_ranks_fallbacks() -> None:
    eps = [view(i) for i in range(1, 9)]
    scored = [(e, 1.0) for e in eps]
    picks = {MaxScorePicker().pick(context(request(), seed=s), scored, 1)[0].address for s in range(200)}
    assert len(picks) == 8
    graded = [(e, i / 10) for i, e in enumerate(eps)]
    ranked = MaxScorePicker().pick(context(request()), graded, 3)
    assert [e.address for e in ranked] == [addr(8), addr(7), addr(6)]


def test_max_score_tie_tolerance() -> None:
    scored = [(view(1), 1.0), (view(2), 0.99), (view(3), 0.5)]
    tolerant = MaxScorePicker(tie_tolerance=0.02)
    picks = {tolerant.pick(context(request(), seed=s), scored, 1)[0].address for s in range(50)}
    assert picks == {addr(1), addr(2)}
    ranked = tolerant.pick(context(request()), scored, 3)
    assert ranked[2].address == addr(3)


def test_weighted_random_picker_follows_weights() -> None:
    scored = [(view(1), 0.9), (view(2), 0.1)]
    ctx = context(request())
    counts = {addr(1): 0, addr(2): 0}
    for _ in range(2000):
        counts[WeightedRandomPicker().pick(ctx, scored, 2)[0].address] += 1
    assert 1600 < counts[addr(1)] < 1990


def test_random_and_round_robin_pickers() -> None:
    eps = [view(i) for i in range(1, 4)]
    scored = [(e, 0.0) for e in eps]
    rr = RoundRobinPicker()
    ctx = context(request())
    assert [rr.pick(ctx, scored, 2)[0].address for _ in range(4)] == [addr(1), addr(2), addr(3), addr(1)]
    assert [e.address for e in rr.pick(ctx, scored, 3)] == [addr(2), addr(3), addr(1)]
    ranked = RandomPicker().pick(context(request(), seed=3), scored, 5)
    assert sorted(e.address for e in ranked) == [addr(1), addr(2), addr(3)]


def test_estimated_ttft_prefers_cached_idle_endpoint_and_yields_to_queue() -> None:
    state = InProcessState()
    prompt = text(1, 8192 * 4)
    scorer = EstimatedTtftScorer()
    ctx = context(request(prompt=prompt), state)
    state.prefix_insert(addr(1), ctx.prefix_hashes(), 10_000)
    idle = [view(1), view(2)]
    est = scorer.estimates(context(request(prompt=prompt), state), idle)
    assert est[0] < est[1]
    deep = [view(1, waiting=40, running=100), view(2)]
    est = scorer.estimates(context(request(prompt=prompt), state), deep)
    assert est[0] > est[1]


def test_estimated_ttft_counts_picks_since_the_last_scrape() -> None:
    state = InProcessState()
    for i in range(8):
        state.inflight_add(f"r{i}", addr(1), 2000)
    est = EstimatedTtftScorer().estimates(context(request(prompt=text(1, 4000)), state), [view(1), view(2)])
    assert est[0] > est[1]


def test_estimated_ttft_lora_costs() -> None:
    eps = [
        view(1, active=frozenset({"x"}), max_loras=1),
        view(2, max_loras=1),
        view(3, active=frozenset({"y"}), max_loras=1),
    ]
    est = EstimatedTtftScorer().estimates(context(request(model="x", prompt=text(1, 400))), eps)
    assert est[0] < est[1] < est[2]


def test_estimated_ttft_counts_lora_slots_by_distinct_adapter_and_queues_behind_waiting_ones() -> None:
    """vLLM lists an adapter that runs and has requests queued in both ``running_lora_adapters`` and
    ``waiting_lora_adapters``: it takes one slot, not two. With every slot taken, each adapter
    already waiting there for a slot goes first."""
    a, b, c = frozenset({"a"}), frozenset({"a", "b"}), frozenset({"a", "b", "c"})
    eps = [
        view(1, active=b, waiting_loras=a, max_loras=3),  # 2 distinct adapters: a slot is free
        view(2, active=c, max_loras=3),  # full
        view(3, active=c, waiting_loras=frozenset({"d"}), max_loras=3),  # full, d queued for a slot
        view(4, active=c, waiting_loras=frozenset({"d", "e"}), max_loras=3),  # full, two queued
    ]
    seen = [view(9, active=frozenset({"x", "d", "e"}), max_loras=3)]  # x, d, e are adapters
    scorer = EstimatedTtftScorer()
    scorer.estimates(context(request(model="x", prompt=text(1, 400))), seen)
    est = scorer.estimates(context(request(model="x", prompt=text(1, 400))), eps)
    p = scorer.params
    base = est[0] - p.lora_load_s
    assert est == pytest.approx([base + p.lora_load_s, base + p.lora_no_slot_s, base + 2 * p.lora_no_slot_s,
                                 base + 3 * p.lora_no_slot_s])


def test_estimated_ttft_knows_an_adapter_by_the_endpoints_model_name_before_any_scrape_shows_it() -> None:
    """A model other than the one the endpoint labels its metrics with is an adapter on a LoRA-enabled
    endpoint, from its very first request; the base model pays no LoRA cost."""
    full = frozenset({"a", "b", "c"})
    eps = [view(1, max_loras=3, served=frozenset({"base"})),
           view(2, active=full, max_loras=3, served=frozenset({"base"}))]
    scorer = EstimatedTtftScorer()
    new_adapter = scorer.estimates(context(request(model="x", prompt=text(1, 400))), eps)
    p = scorer.params
    assert new_adapter[1] - new_adapter[0] == pytest.approx(p.lora_no_slot_s - p.lora_load_s)
    base = scorer.estimates(context(request(model="base", prompt=text(1, 400))), eps)
    assert base[0] == pytest.approx(base[1])
    # without the label (an engine that has none) an unseen model is priced as a base model
    unlabelled = [view(1, max_loras=3), view(2, active=full, max_loras=3)]
    est = EstimatedTtftScorer().estimates(context(request(model="y", prompt=text(1, 400))), unlabelled)
    assert est[0] == pytest.approx(est[1])
