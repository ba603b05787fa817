"""``policies.flow_control``: when a pool has room, what a request costs, one grant at a time."""

from __future__ import annotations

import pytest

from kvgate.policies.flow_control import (
    FlowController,
    FlowControlSettings,
    WorkCosts,
    endpoint_has_room,
    pool_has_room,
    work_seconds,
)
from kvgate.policies.holding_queue import Waiting
from kvgate.policies.saturation import SaturationThresholds
from kvgate.policies.state import InFlight
from tests.policies.helpers import NOW, view

SETTINGS = FlowControlSettings(thresholds=SaturationThresholds())
"""With the Inference Extension's thresholds (queue 5, KV 0.8): the rule's cases are easy to read."""


def test_the_default_thresholds_are_kvgates_saturation_filters() -> None:
    assert FlowControlSettings().thresholds == SaturationThresholds(32, 1.0, 0.2)
    assert endpoint_has_room(view(1, waiting=31, kv=0.99), None, FlowControlSettings(), NOW)
    assert not endpoint_has_room(view(1, waiting=32), None, FlowControlSettings(), NOW)


def test_an_endpoint_has_room_below_the_inference_extensions_thresholds() -> None:
    assert endpoint_has_room(view(1, waiting=4, kv=0.79), None, SETTINGS, NOW)
    assert not endpoint_has_room(view(1, waiting=5), None, SETTINGS, NOW)
    assert not endpoint_has_room(view(1, kv=0.8), None, SETTINGS, NOW)
    assert not endpoint_has_room(view(1, age=0.5), None, SETTINGS, NOW)  # stale metrics
    assert not endpoint_has_room(view(1, healthy=False), None, SETTINGS, NOW)
    assert not endpoint_has_room(view(1, scraped=False), None, SETTINGS, NOW)


def test_requests_sent_since_the_scrape_count_as_the_queue_it_does_not_show_yet() -> None:
    """10 running at the scrape; 14 of ours in flight: 4 not running yet, room; 15: a queue of 5."""
    busy = view(1, waiting=0, running=10)
    assert endpoint_has_room(busy, InFlight(requests=14), SETTINGS, NOW)
    assert not endpoint_has_room(busy, InFlight(requests=15), SETTINGS, NOW)


def test_an_engine_without_a_running_count_is_bounded_by_its_slots_not_by_requests_since_the_scrape() -> None:
    """JetStream reports no running requests: its slots (KV usage) and the in-flight limit bound it."""
    import msgspec

    jetstream = view(1, waiting=0, running=0, kv=0.5)
    assert jetstream.metrics is not None
    jetstream = msgspec.structs.replace(
        jetstream, metrics=msgspec.structs.replace(jetstream.metrics, running_reported=False))
    assert endpoint_has_room(jetstream, InFlight(requests=40), SETTINGS, NOW)
    assert not endpoint_has_room(view(1, waiting=0, running=0, kv=0.5), InFlight(requests=40), SETTINGS, NOW)


def test_the_users_in_flight_limit_per_endpoint() -> None:
    limited = FlowControlSettings(max_inflight_per_endpoint=3, thresholds=SaturationThresholds())
    running = view(1, running=3)
    assert endpoint_has_room(running, InFlight(requests=2), limited, NOW)
    assert not endpoint_has_room(running, InFlight(requests=3), limited, NOW)


def test_a_pool_has_room_when_one_endpoint_has_and_none_without_endpoints() -> None:
    full, free = view(1, waiting=9), view(2)
    assert pool_has_room([full, free], {}, SETTINGS, NOW)
    assert not pool_has_room([full], {}, SETTINGS, NOW)
    assert not pool_has_room([], {}, SETTINGS, NOW)  # scale from zero: wait for a replica
    assert not pool_has_room([free], {free.address: InFlight(requests=5)}, SETTINGS, NOW)


def test_uncached_prompt_tokens_cost_more_than_cached_ones() -> None:
    costs = WorkCosts()
    cold = work_seconds(4000, 0, 100, costs)  # 1,000 prompt tokens, none cached
    warm = work_seconds(4000, 900, 100, costs)
    assert cold > warm > work_seconds(0, 0, 100, costs) > 0
    assert cold - warm == pytest.approx(900 * (costs.prefill_s_per_token - costs.cached_s_per_token))
    # no max_tokens: the default output; more output costs more
    assert work_seconds(400, 0, None, costs) == work_seconds(400, 0, costs.default_output_tokens, costs)
    assert work_seconds(400, 0, 1000, costs) > work_seconds(400, 0, 10, costs)
    assert work_seconds(400, 10_000, 10, costs) == work_seconds(400, 100, 10, costs)  # at most the prompt


def item(rid: str, tenant: str = "t") -> Waiting:
    return Waiting(rid, 0, tenant, 1.0, 100.0)


def test_arrivals_wait_while_others_wait_and_grants_go_one_at_a_time() -> None:
    flow = FlowController(SETTINGS)
    assert not flow.must_wait(has_room=True)
    assert flow.must_wait(has_room=False)
    assert flow.hold(item("a")) is None
    assert flow.hold(item("b")) is None
    assert flow.must_wait(has_room=True)  # no overtaking the held ones
    assert flow.dispatch(has_room=False) is None
    first = flow.dispatch(has_room=True)
    assert first is not None
    assert first.request_id == "a"
    assert flow.dispatch(has_room=True) is None  # until a's pick is counted
    assert flow.must_wait(has_room=True)
    flow.grant_used()
    second = flow.dispatch(has_room=True)
    assert second is not None
    assert second.request_id == "b"
    flow.grant_used()
    flow.grant_used()  # extra reports do not go negative
    assert not flow.must_wait(has_room=True)
    assert flow.dispatch(has_room=True) is None


def test_room_is_looked_for_only_when_nobody_waits() -> None:
    flow = FlowController(SETTINGS)
    looks: list[bool] = []

    def room() -> bool:
        looks.append(True)
        return True

    assert not flow.must_wait(room)
    assert looks == [True]
    flow.hold(item("a"))
    assert flow.must_wait(room)  # a waits: held without a look at the pool
    assert looks == [True]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout"):
        FlowControlSettings(queue_timeout_s=0)
    with pytest.raises(ValueError, match="queue length"):
        FlowControlSettings(max_queue_length=0)
    with pytest.raises(ValueError, match="in-flight limit"):
        FlowControlSettings(max_inflight_per_endpoint=0)


def test_reserved_slots_count_only_for_whom_they_are_reserved() -> None:
    settings = FlowControlSettings(max_inflight_per_endpoint=3, reserved_per_endpoint=2,
                                   thresholds=SaturationThresholds())
    busy = view(1, running=4)
    assert not endpoint_has_room(busy, InFlight(requests=3), settings, NOW)
    assert endpoint_has_room(busy, InFlight(requests=4), settings, NOW, reserved=True)
    assert not endpoint_has_room(busy, InFlight(requests=5), settings, NOW, reserved=True)
    with pytest.raises(ValueError, match="reserved slots"):
        FlowControlSettings(reserved_per_endpoint=2)
