"""Feedback plugins (``policies.feedback``): what the scheduler tells them, in what order; and a
profile's declarations: what a plugin consumes must be produced by one of the profile's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kvgate.policies.errors import ConfigError
from kvgate.policies.feedback import FeedbackEnv, FeedbackPlugin
from kvgate.policies.framework import SchedulingContext
from kvgate.policies.profile import build_profile, load_profile
from kvgate.policies.registry import builtin_registry, no_parameters
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest, Usage
from tests.policies.helpers import NOW, request, text, view


class Journal(FeedbackPlugin):
    """Writes down each hook it is told of."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def on_scheduled(self, ctx: SchedulingContext, ranked: Sequence[EndpointView]) -> None:
        self.seen.append(f"scheduled {ranked[0].address}")

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self.seen.append(f"picked {endpoint.address}")

    def on_usage(self, request: InferenceRequest, endpoint: Endpoint, usage: Usage, now: float) -> None:
        self.seen.append(f"usage {usage.cached_tokens}")

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        self.seen.append(f"finished ok={ok}")


@dataclass(frozen=True)
class JournalBlueprint:
    seen: list[str] = field(default_factory=list)
    produces: frozenset[str] = frozenset()
    consumes: frozenset[str] = frozenset()

    def create(self, env: FeedbackEnv) -> FeedbackPlugin:
        return Journal(self.seen)


def profile_with(feedback: list[str], extra_plugins: Sequence[Mapping[str, Any]] = ()) -> Any:
    plugins = [{"type": "healthy-filter"}, {"type": "prefix-cache-scorer"}, {"type": "max-score-picker"},
               *extra_plugins]
    return {
        "name": "p",
        "plugins": plugins,
        "profile": {"filters": ["healthy-filter"], "scorers": [{"plugin": "prefix-cache-scorer"}],
                    "picker": "max-score-picker", "feedback": feedback},
    }


def test_a_custom_feedback_plugin_hears_a_picked_requests_life_in_order() -> None:
    blueprint = JournalBlueprint()
    registry = builtin_registry()
    registry.register("journal", no_parameters(lambda: blueprint, "journal"))
    listed = ["inflight-recorder", "prefix-index-recorder", "journal"]
    document = profile_with(listed, [{"type": name} for name in listed])
    s = ProfileScheduler(build_profile(document, registry))
    req = request("r1", text(1, 300))
    pick = s.schedule(req, [view(1), view(2)], NOW).pick
    s.on_picked(req, pick, NOW)
    s.on_first_token(req, pick, NOW)  # Journal does not override it: not called
    s.on_usage(req, pick, Usage(10, 1, cached_tokens=0), NOW)
    s.on_finished(req, pick, ok=True, now=NOW)
    address = pick.address
    assert blueprint.seen == [f"scheduled {address}", f"picked {address}", "usage 0", "finished ok=True"]


def test_what_a_plugin_consumes_must_be_produced_by_the_profile() -> None:
    with pytest.raises(ConfigError, match="'prefix-cache-scorer' consumes prefix-index"):
        build_profile(profile_with(["inflight-recorder"], [{"type": "inflight-recorder"}]))


def test_a_profile_listing_no_feedback_gets_the_defaults_and_the_index_its_scorers_read() -> None:
    document = profile_with([])
    del document["profile"]["feedback"]
    types = [f.plugin_type for f in build_profile(document).feedback]
    assert types == ["inflight-recorder", "session-recorder", "stored-response-recorder", "outlier-ejection",
                     "prefix-index-recorder"]


def test_each_scheduler_has_its_own_feedback_plugins() -> None:
    profile = load_profile("default")
    first, second = ProfileScheduler(profile), ProfileScheduler(profile)
    assert not set(map(id, first.feedback)) & set(map(id, second.feedback))
    req = request("r1", text(1, 300))
    pick = first.schedule(req, [view(1)], NOW).pick
    first.on_picked(req, pick, NOW)
    assert first.inflight_models
    assert not second.inflight_models
