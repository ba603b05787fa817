"""``stored-response-filter`` and ``stored-response-recorder``: a Responses API request that continues a
stored response goes to the endpoint that stored it, in every shipped profile and any pool size."""

from __future__ import annotations

import dataclasses

import pytest

from kvgate.policies.profile import load_profile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.state import InProcessState
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView, InferenceRequest
from tests.policies.helpers import NOW, request, text, view


def pool(n: int, busy: str = "") -> tuple[EndpointView, ...]:
    """``n`` endpoints; ``busy``'s queue and KV cache nearly full."""
    views = []
    for i in range(n):
        address = f"10.0.{i // 250}.{i % 250}:8000"
        full = address == busy
        metrics = EndpointMetrics(waiting=20 if full else 0, running=i % 7,
                                  kv_cache_usage=0.97 if full else 0.2, updated_at=NOW - 0.01)
        views.append(EndpointView(Endpoint(address, "pool"), metrics))
    return tuple(views)


def responses(rid: str, response_id: str | None, previous: str | None = None) -> InferenceRequest:
    return dataclasses.replace(request(rid, text(hash(rid) % 1000, 400)), response_id=response_id,
                               previous_response_id=previous)


@pytest.mark.parametrize("profile", ["default", "gie-default", "pd-decode", "random", "round-robin"])
@pytest.mark.parametrize("size", [8, 300])
def test_a_continued_response_goes_where_it_is_stored(profile: str, size: int) -> None:
    s = ProfileScheduler(load_profile(profile), state=InProcessState())
    endpoints = pool(size)
    first = responses("r1", "resp_1")
    stored_on = s.schedule(first, endpoints, NOW).pick
    s.on_picked(first, stored_on, NOW)
    s.on_finished(first, stored_on, ok=True, now=NOW)
    # the endpoint that stored it is now the busiest of all: only it can answer the next turn
    busier = pool(size, busy=stored_on.address)
    for i in range(2, 12):
        turn = responses(f"r{i}", f"resp_{i}", previous="resp_1")
        assert s.schedule(turn, busier, NOW + i).pick.address == stored_on.address


def test_a_fallback_that_served_it_is_where_it_is_stored_and_unknown_ones_route_as_any() -> None:
    s = ProfileScheduler(load_profile("default"), state=InProcessState())
    endpoints = (view(1), view(2), view(3))
    first = responses("r1", "resp_1")
    s.on_picked(first, endpoints[0].endpoint, NOW)
    s.on_served(first, endpoints[2].endpoint, NOW)  # the pick failed over to another
    assert s.schedule(responses("r2", None, "resp_1"), endpoints, NOW).pick.address == endpoints[2].address
    picks = {s.schedule(responses(f"u{i}", None, "resp_unknown"), endpoints, NOW).pick.address
             for i in range(30)}
    assert len(picks) > 1  # not pinned anywhere
    gone = (view(1), view(2))  # the endpoint that stored it left: the engines answer (404)
    assert s.schedule(responses("r3", None, "resp_1"), gone, NOW).pick.address in {v.address for v in gone}
