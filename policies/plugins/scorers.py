"""Scorers: each returns ``{address: score in [0, 1]}``; higher is better.

The load scorers normalise GIE's way, ``(max − x) / (max − min)`` over the candidates, 1 when all
are equal. Endpoints without metrics count as zero load (filters drop them first where it matters).
Scorers that score every endpoint also implement ``dense_scores`` (``policies.framework.DenseScorer``):
one pass, a list in endpoint order, which is what the scheduler calls; ``score`` maps the same values
by address. The sparse scorers (prefix, session) return only the endpoints they favour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvgate.policies.framework import IN_FLIGHT, PREFIX_INDEX, SESSIONS, SchedulingContext
from kvgate.policies.memo import TupleMemo
from kvgate.policies.types import EndpointView


def spread(values: Sequence[float]) -> list[float]:
    """``(max − v) / (max − min)`` per value, 1.0 for all when every value is equal."""
    high = max(values)
    low = min(values)
    if high == low:
        return [1.0] * len(values)
    span = high - low
    return [(high - v) / span for v in values]


def spread_scores(endpoints: Sequence[EndpointView], values: Sequence[float]) -> dict[str, float]:
    """:func:`spread` keyed by endpoint address."""
    return by_address(endpoints, spread(values))


def by_address(endpoints: Sequence[EndpointView], scores: Sequence[float]) -> dict[str, float]:
    return dict(zip([e.endpoint.address for e in endpoints], scores, strict=True))


class _DenseScorer:
    """``score`` derived from ``dense_scores``."""

    def dense_scores(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        raise NotImplementedError

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        return by_address(endpoints, self.dense_scores(ctx, endpoints))


class _SnapshotScorer(_DenseScorer):
    """Scores that depend on the scraped views alone: computed once per snapshot (``TupleMemo``)."""

    def __init__(self) -> None:
        self._memo: TupleMemo[Sequence[float]] = TupleMemo()

    def dense_scores(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        return self._memo.get(endpoints, self._compute)

    def _compute(self, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        raise NotImplementedError


class QueueScorer(_SnapshotScorer):
    """GIE's queue scorer over the scraped waiting queue."""

    def _compute(self, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        return tuple(spread([m.waiting if (m := e.metrics) is not None else 0.0 for e in endpoints]))


class RunningRequestsScorer(_SnapshotScorer):
    """Fewer running requests (scraped) is better."""

    def _compute(self, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        return tuple(spread([m.running if (m := e.metrics) is not None else 0.0 for e in endpoints]))


class InFlightRequestsScorer(_DenseScorer):
    """Fewer of this picker's own in-flight requests is better (updates at pick time)."""

    consumes = frozenset({IN_FLIGHT})

    def dense_scores(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> list[float]:
        own = ctx.state.inflight_by_endpoint().get
        return spread([n.requests if (n := own(e.endpoint.address)) is not None else 0 for e in endpoints])


class InFlightTokensScorer(_DenseScorer):
    """Fewer of this picker's own in-flight prefill tokens is better (updates at pick time)."""

    consumes = frozenset({IN_FLIGHT})

    def dense_scores(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> list[float]:
        own = ctx.state.inflight_by_endpoint().get
        return spread([n.tokens if (n := own(e.endpoint.address)) is not None else 0 for e in endpoints])


class KvCacheUtilizationScorer(_SnapshotScorer):
    """``1 − kv_cache_usage`` (clamped to [0, 1])."""

    def _compute(self, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        return tuple(_unit(1.0 - m.kv_cache_usage) if (m := e.metrics) else 1.0 for e in endpoints)


def _unit(value: float) -> float:
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value


class LoraAffinityScorer(_DenseScorer):
    """GIE's LoRA affinity: 1.0 adapter active, 0.8 a free slot, 0.6 adapter waiting, else 0.

    Endpoints that serve no adapters at all (``max_loras == 0``, none active) score 1.0, so a fleet
    without LoRA is not penalised.
    """

    def dense_scores(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> list[float]:
        adapter = ctx.request.target_model
        out: list[float] = []
        for e in endpoints:
            m = e.metrics
            if m is None:
                out.append(0.0)
            elif adapter in m.active_loras:
                out.append(1.0)
            elif m.max_loras > 0 and len(m.active_loras) + len(m.waiting_loras) < m.max_loras:
                out.append(0.8)
            elif adapter in m.waiting_loras:
                out.append(0.6)
            elif m.max_loras == 0 and not m.active_loras:
                out.append(1.0)
            else:
                out.append(0.0)
        return out


class PrefixCacheScorer:
    """GIE's approximate prefix-cache scorer: matched leading blocks / total blocks (sparse: only
    endpoints holding a prefix of the prompt, usually a few, whatever the number of candidates)."""

    consumes = frozenset({PREFIX_INDEX})

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        total = len(ctx.prefix_hashes())
        if total == 0:
            return {}
        return {address: blocks / total for address, blocks in ctx.prefix_matches().items()}


class SessionAffinityScorer:
    """1.0 for the endpoint this request's session last used (if it is still a candidate)."""

    consumes = frozenset({SESSIONS})

    def score(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Mapping[str, float]:
        if ctx.session_id is None:
            return {}
        sticky = ctx.state.session_get(ctx.session_id)
        return {sticky: 1.0} if sticky is not None else {}
