"""The scheduler as its callers see it (the ext_proc service, benchmarks, tests).

The ext_proc request lifecycle calls, in order:
``schedule`` once (after the body is parsed), ``on_picked`` when the data plane is told the pick,
``on_served`` if the data plane reports a different served endpoint (fallback),
``on_first_token`` when the first response body bytes arrive (the prompt's prefill is done), or
``on_first_token_unseen`` when the data plane will not show the response body (kvgate's one-pass
data path: the scheduler then ends the prefill at its own estimate),
``on_endpoint_failed`` when an endpoint failed it (a 5xx, or a fallback served it),
``on_usage`` when the response carries token usage, and ``on_finished`` exactly once per picked
request, success or not (client gone, upstream error, stream reset), so in-flight bookkeeping
never leaks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from kvgate.policies.framework import SchedulingTrace
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest, Usage


@dataclass(frozen=True, slots=True)
class PrefillPick:
    """The prefill half of a disaggregated request: the endpoint that computes the prompt's KV, and
    the request as that endpoint's bookkeeping knows it (its own id; one output token). Its life is
    reported with the scheduler's usual calls on ``request`` (``on_first_token`` when the prefill
    answered, ``on_endpoint_failed``, ``on_finished``); one not reported ends with the decode's first
    token or finish."""

    request: InferenceRequest
    endpoint: Endpoint


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    """``ranked`` is the pick first, then fallbacks in order (never empty). ``prefill`` is set when
    the request is disaggregated: ``ranked`` are then decode endpoints
    (``policies.disaggregation``)."""

    ranked: tuple[Endpoint, ...]
    profile: str
    scores: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    prefill: PrefillPick | None = None
    predicted_cached_tokens: int | None = None
    """Prompt tokens the prefix index expected cached on the pick (None: the profile has no index)."""
    best_cached_tokens: int | None = None
    """... and on the endpoint where it expected the most (the pick's regret is the difference)."""
    prefix_block_tokens: int = 0
    """The index's granularity in tokens (a prediction is a whole number of its blocks)."""

    @property
    def pick(self) -> Endpoint:
        return self.ranked[0]


Keep = Callable[[Sequence[EndpointView]], Sequence[EndpointView]]
"""Narrows endpoints to those a request may go to now (flow control: those with room); returns
its argument itself when it keeps them all, and may keep none."""


class Scheduler(Protocol):
    def schedule(
        self, request: InferenceRequest, candidates: Sequence[EndpointView], now: float,
        trace: SchedulingTrace | None = None, keep: Keep | None = None,
    ) -> SchedulingResult:
        """Rank ``candidates`` for ``request`` (``trace``: a traced request's, told what was done).

        Only endpoints the request's subset hint allows (``request.subset``: ``ip:port`` or a
        bare ``ip``) are ranked: the data plane can route nowhere else.

        ``keep`` narrows the endpoints once the profile's filters have chosen them (a large pool's
        candidate set: checking every endpoint of the pool per pick cost O(pool)); when it keeps
        none of those, it is asked about all of ``candidates``, and when it keeps none at all, the
        pick is among all as if it were not given.

        Raises ``NoEligibleEndpointError`` (503) when nothing is eligible and ``RequestShedError``
        (429) when a sheddable request meets a saturated pool. Pure apart from reading the
        scheduler's state; it records nothing (``on_picked`` does).
        """
        ...

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None: ...

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None: ...

    def on_first_token(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """The response's first body bytes arrived: the request no longer waits for prefill."""
        ...

    def on_endpoint_failed(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """``endpoint`` failed this request (a 5xx, or the data plane went on to a fallback): counts
        towards ejecting it from picking (``policies.outliers``)."""
        ...

    def on_endpoint_outcome(self, address: str, *, ok: bool, now: float) -> None:
        """A request's outcome at ``address``, reported after the request ended (Envoy's access log:
        ``extproc.outcomes``): a failure counts towards ejecting it, a success resets its count."""
        ...

    def on_first_token_unseen(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        """The response started and its body will not be shown: the scheduler ends the request's
        prefill by its own estimate of the first token's time (at once if it has none)."""
        ...

    def on_usage(self, request: InferenceRequest, endpoint: Endpoint, usage: Usage, now: float) -> None: ...

    def on_finished(
        self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float
    ) -> None: ...
