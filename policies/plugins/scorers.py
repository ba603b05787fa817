"""Scorers: each returns ``{address: score in [0, 1]}``; higher is better.

The load scorers normalise GIE's way, ``(max − x) / (max − min)`` over the candidates, 1 when all
are equal. Endpoints without metrics count as zero load (filters drop them first where it matters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from policies.framework import SchedulingContext
from policies.types import EndpointView


def spread_scores(endpoints: Sequence[EndpointView], values: Sequence[float]) -> dict[str, float]:
    """``(max − v) / (max − min)`` per endpoint, 1.0 for all when every value is equal."""
    high = max(values)
    low = min(values)
    if high == low:
        return dict.fromkeys((e.address for e in endpoints), 1.0)
    span = high - low
    return {e.address: (high - v) / span for e, v in zip(endpoints, values, strict=True)}


class _SpreadScorer:
    """Lower ``value`` is better, normalised across candidates."""

    def __init__(self, value: Callable[[SchedulingContext, EndpointView], float]) -> None:
        self._value = value

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        value = self._value
        return spread_scores(endpoints, [value(ctx, e) for e in endpoints])


def _waiting(ctx: SchedulingContext, e: EndpointView) -> float:
    return e.metrics.waiting if e.metrics is not None else 0.0


def _running(ctx: SchedulingContext, e: EndpointView) -> float:
    return e.metrics.running if e.metrics is not None else 0.0


def _inflight_requests(ctx: SchedulingContext, e: EndpointView) -> float:
    return ctx.state.inflight(e.address).requests


def _inflight_tokens(ctx: SchedulingContext, e: EndpointView) -> float:
    return ctx.state.inflight(e.address).tokens


class QueueScorer(_SpreadScorer):
    """GIE's queue scorer over the scraped waiting queue."""

    def __init__(self) -> None:
        super().__init__(_waiting)


class RunningRequestsScorer(_SpreadScorer):
    """Fewer running requests (scraped) is better."""

    def __init__(self) -> None:
        super().__init__(_running)


class InFlightRequestsScorer(_SpreadScorer):
    """Fewer of this picker's own in-flight requests is better (updates at pick time)."""

    def __init__(self) -> None:
        super().__init__(_inflight_requests)


class InFlightTokensScorer(_SpreadScorer):
    """Fewer of this picker's own in-flight prefill tokens is better (updates at pick time)."""

    def __init__(self) -> None:
        super().__init__(_inflight_tokens)


class KvCacheUtilizationScorer:
    """``1 − kv_cache_usage``."""

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        return {e.address: 1.0 - e.metrics.kv_cache_usage if e.metrics else 1.0 for e in endpoints}


class LoraAffinityScorer:
    """GIE's LoRA affinity: 1.0 adapter active, 0.8 a free slot, 0.6 adapter waiting, else 0.

    Endpoints that serve no adapters at all (``max_loras == 0``, none active) score 1.0, so a fleet
    without LoRA is not penalised.
    """

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        adapter = ctx.request.target_model
        out: dict[str, float] = {}
        for e in endpoints:
            m = e.metrics
            if m is None:
                out[e.address] = 0.0
            elif adapter in m.active_loras:
                out[e.address] = 1.0
            elif m.max_loras > 0 and len(m.active_loras) + len(m.waiting_loras) < m.max_loras:
                out[e.address] = 0.8
            elif adapter in m.waiting_loras:
                out[e.address] = 0.6
            elif m.max_loras == 0 and not m.active_loras:
                out[e.address] = 1.0
            else:
                out[e.address] = 0.0
        return out


class PrefixCacheScorer:
    """GIE's approximate prefix-cache scorer: matched leading blocks / total blocks."""

    uses_prefix_index = True

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        total = len(ctx.prefix_hashes())
        if total == 0:
            return {}
        matches = ctx.prefix_matches()
        return {e.address: matches.get(e.address, 0) / total for e in endpoints if e.address in matches}


class SessionAffinityScorer:
    """1.0 for the endpoint this request's session last used (if it is still a candidate)."""

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        if ctx.session_id is None:
            return {}
        sticky = ctx.state.session_get(ctx.session_id)
        return {sticky: 1.0} if sticky is not None else {}
