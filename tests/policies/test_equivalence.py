"""The optimised scheduler (memos, dense scores, positional sums) ranks and scores exactly like the
straightforward reference in ``tests/policies/reference.py``, on seeded random fleets and traffic.

Snapshots evolve the way the scraper publishes them: the same tuple again (memos hit), one view
replaced (positional reuse), a new tuple, or a list (never memoised); ``now`` moves so that metrics
go stale under an unchanged tuple. Requests mix shared prompt groups (prefix matches), LoRA
adapters, sessions, sheddable priorities and subset hints; in-flight requests pile up and finish.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from kvgate.policies.errors import NoEligibleEndpointError, RequestShedError
from kvgate.policies.profile import build_profile, load_profile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView, InferenceRequest, Usage
from tests.policies.helpers import text
from tests.policies.reference import Reference

ADAPTERS = ("a1", "a2", "a3")
EVERY_PLUGIN: dict[str, Any] = {
    "name": "every-plugin",
    "plugins": [
        {"type": "healthy-filter"},
        {"type": "lora-filter"},
        {"type": "saturation-filter", "parameters": {"queue_threshold": 6, "kv_threshold": 0.95}},
        {"type": "queue-scorer"},
        {"type": "running-requests-scorer"},
        {"type": "inflight-requests-scorer"},
        {"type": "inflight-tokens-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "lora-affinity-scorer"},
        {"type": "prefix-cache-scorer"},
        {"type": "session-affinity-scorer"},
        {"type": "estimated-ttft-scorer",
         "parameters": {"miss_penalty_factor": 1.5, "delay_externality": 0.7, "time_scale": 2.0}},
        {"type": "weighted-random-picker"},
        {"type": "stored-response-filter"},  # (its recorder: among the default feedback)
    ],
    "profile": {
        "filters": ["stored-response-filter", "healthy-filter", "lora-filter", "saturation-filter"],
        "scorers": [
            {"plugin": "queue-scorer", "weight": 1.5},
            {"plugin": "session-affinity-scorer", "weight": 0.3},
            {"plugin": "running-requests-scorer", "weight": 0.5},
            {"plugin": "inflight-requests-scorer", "weight": 1.0},
            {"plugin": "inflight-tokens-scorer", "weight": 0.7},
            {"plugin": "kv-cache-utilization-scorer", "weight": 2.0},
            {"plugin": "lora-affinity-scorer", "weight": 1.0},
            {"plugin": "prefix-cache-scorer", "weight": 3.0},
            {"plugin": "estimated-ttft-scorer", "weight": 1.0},
        ],
        "picker": "weighted-random-picker",
    },
}


def random_view(rng: random.Random, i: int, now: float) -> EndpointView:
    endpoint = Endpoint(f"10.1.{i // 200}.{i % 200}:8000", "pool")
    if rng.random() < 0.05:
        return EndpointView(endpoint, None, healthy=rng.random() < 0.5)
    max_loras = rng.choice((0, 0, 1, 2))
    active = frozenset(rng.sample(ADAPTERS, rng.randint(0, max_loras))) if max_loras else frozenset()
    metrics = EndpointMetrics(
        waiting=rng.choice((0, 0, 0, 1, 2, 3, 5, 9)),
        running=rng.randint(0, 80),
        kv_cache_usage=rng.choice((rng.uniform(0.0, 0.75), rng.uniform(0.75, 1.0), 1.2)),
        active_loras=active,
        waiting_loras=frozenset(rng.sample(ADAPTERS, rng.randint(0, 1))),
        max_loras=max_loras,
        block_size=16,
        num_gpu_blocks=rng.choice((None, 2_000, 30_000)),
        updated_at=now - rng.choice((0.0, 0.01, 0.05, 0.15, 0.3)),
    )
    return EndpointView(endpoint, metrics, healthy=rng.random() < 0.95)


def evolve(rng: random.Random, views: Sequence[EndpointView], now: float) -> Sequence[EndpointView]:
    roll = rng.random()
    if roll < 0.4:
        return views  # the same snapshot again
    if roll < 0.75:  # the scraper replaced one endpoint's view
        i = rng.randrange(len(views))
        return (*views[:i], random_view(rng, i, now), *views[i + 1 :])
    if roll < 0.9:
        return tuple(random_view(rng, i, now) for i in range(rng.choice((1, 2, 5, 12, 40))))
    return list(views)


def random_request(
    rng: random.Random, n: int, systems: list[str], views: Sequence[EndpointView]
) -> InferenceRequest:
    roll = rng.random()
    prompt = (
        ""
        if roll < 0.05
        else text(n, 30)
        if roll < 0.15
        else rng.choice(systems) + text(n, rng.randint(0, 900))
    )
    subset = None
    if rng.random() < 0.1:
        subset = frozenset(
            v.address if rng.random() < 0.5 else v.endpoint.host for v in rng.sample(list(views), 1)
        )
    session = rng.choice(("s1", "s2", "s3")) if rng.random() < 0.3 else None
    model = rng.choice(("base", "base", "a1", "a2", "zz"))
    # Responses API: a response stored where the request is served; a later one continuing it
    response_id = f"resp_{n}" if rng.random() < 0.5 else None
    previous = f"resp_{rng.randrange(n)}" if n and rng.random() < 0.3 else None
    return InferenceRequest(
        request_id=f"r{n}",
        pool="pool",
        model=model,
        target_model=model,
        prompt=prompt,
        priority=-1 if rng.random() < 0.2 else 0,
        session_id=session,
        subset=subset,
        response_id=response_id,
        previous_response_id=previous,
    )


def check(scheduler: ProfileScheduler, seed: int, steps: int) -> int:
    """Runs ``steps`` requests; returns how many were scheduled (the rest raised, like the reference)."""
    rng = random.Random(seed)
    now = 1000.0
    systems = [text(seed * 10 + g, 64 * rng.randint(3, 40)) for g in range(4)]
    views: Sequence[EndpointView] = tuple(random_view(rng, i, now) for i in range(rng.choice((3, 8, 30))))
    in_flight: list[tuple[InferenceRequest, Endpoint]] = []
    known_adapters: set[str] = set()  # the estimated-TTFT scorer's memory of adapter names
    arrivals: list[float] = []  # and of the times of the requests it scored (its arrival rate)
    scheduled = 0
    for n in range(steps):
        now += rng.choice((0.0, 0.0, 0.01, 0.1))
        views = evolve(rng, views, now)
        request = random_request(rng, n, systems, views)
        reference = Reference(scheduler, request, now, known_adapters, arrivals)
        try:
            expected = reference.schedule(views)
        except (NoEligibleEndpointError, RequestShedError) as exc:
            with pytest.raises(type(exc)):
                scheduler.schedule(request, views, now)
            continue
        result = scheduler.schedule(request, views, now)
        assert result.ranked == expected.ranked, f"seed {seed} step {n}"
        assert dict(result.scores) == dict(expected.scores), f"seed {seed} step {n}"
        assert list(result.scores) == list(expected.scores)
        assert scheduler.rng.getstate() == reference.rng.getstate()
        scheduled += 1
        scheduler.on_picked(request, result.pick, now)
        pick = result.pick
        if len(result.ranked) > 1 and rng.random() < 0.1:
            pick = result.ranked[1]
            scheduler.on_served(request, pick, now)
        if rng.random() < 0.3:
            cached = rng.randint(0, request.prompt_tokens_estimate + 1)
            scheduler.on_usage(request, pick, Usage(request.prompt_tokens_estimate, 1, cached), now)
        in_flight.append((request, pick))
        while in_flight and (len(in_flight) > 40 or rng.random() < 0.4):
            done, where = in_flight.pop(rng.randrange(len(in_flight)))
            scheduler.on_finished(done, where, ok=True, now=now)
    return scheduled


@pytest.mark.parametrize("profile", ["default", "gie-default", "random"])
@pytest.mark.parametrize("seed", range(4))
def test_shipped_profiles_match_the_reference(profile: str, seed: int) -> None:
    scheduler = ProfileScheduler(load_profile(profile), rng=random.Random(seed))
    assert check(scheduler, seed, 120) > 40


@pytest.mark.parametrize("seed", range(4))
def test_every_plugin_matches_the_reference(seed: int) -> None:
    scheduler = ProfileScheduler(build_profile(EVERY_PLUGIN), rng=random.Random(seed))
    assert check(scheduler, seed, 120) > 40


@pytest.mark.parametrize("tie_tolerance", [0.0, 0.3])
def test_max_score_ties_match_the_reference(tie_tolerance: float) -> None:
    data = dict(EVERY_PLUGIN)
    data["plugins"] = [
        *EVERY_PLUGIN["plugins"],
        {"type": "max-score-picker", "parameters": {"tie_tolerance": tie_tolerance}},
    ]
    data["profile"] = {**EVERY_PLUGIN["profile"], "picker": "max-score-picker"}
    scheduler = ProfileScheduler(build_profile(data), rng=random.Random(3))
    assert check(scheduler, 3, 200) > 50
