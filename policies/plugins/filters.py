"""Filters: each narrows the candidate endpoints, keeping their order.

The soft filters (healthy, saturation, LoRA) never empty the set: when nothing would remain they
return their input, so the scorers still choose the least-bad endpoint and admission decides
whether to shed. The subset hint is a hard constraint from the data plane: nothing left → 503.
A filter that drops nothing returns its input object itself, and a tuple in gives a tuple out, so
the filters' and scorers' per-snapshot memos (``policies.memo``) hold across the whole chain.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

from pydantic import Field

from kvgate.policies.errors import NoEligibleEndpointError
from kvgate.policies.framework import SchedulingContext
from kvgate.policies.memo import TupleMemo
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.pool_views import SubsetViews
from kvgate.policies.saturation import SaturationThresholds
from kvgate.policies.types import EndpointView


class HealthyFilter:
    """Drops endpoints never scraped or unhealthy, unless none would remain (once per snapshot)."""

    def __init__(self) -> None:
        self._memo: TupleMemo[Sequence[EndpointView]] = TupleMemo()

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        return self._memo.get(endpoints, _healthy)


def _healthy(endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
    return _narrowed(endpoints, [e for e in endpoints if e.healthy and e.metrics is not None])


class SaturationParams(Params):
    queue_threshold: Annotated[int, Field(ge=1)] = 5
    kv_threshold: Annotated[float, Field(gt=0.0, le=1.0)] = 0.8
    metrics_staleness_s: Annotated[float, Field(gt=0.0)] = 0.2


class SaturationFilter:
    """Drops saturated endpoints (queue, KV, stale metrics, unhealthy), unless all are saturated."""

    def __init__(self, thresholds: SaturationThresholds | None = None) -> None:
        self.thresholds = thresholds or SaturationThresholds()
        self._memo: TupleMemo[_Eligible] = TupleMemo()

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> SaturationFilter:
        p = parse_params(SaturationParams, parameters, "saturation-filter")
        thresholds = SaturationThresholds(p.queue_threshold, p.kv_threshold, p.metrics_staleness_s)
        return SaturationFilter(thresholds)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        eligible = self._memo.get(endpoints, self._eligible)
        oldest = ctx.now - self.thresholds.metrics_staleness_s
        if oldest <= eligible.least_recent_update:
            return eligible.endpoints
        fresh = [e for e in eligible.kept if (m := e.metrics) is not None and m.updated_at >= oldest]
        return _narrowed(endpoints, fresh)

    def _eligible(self, endpoints: Sequence[EndpointView]) -> _Eligible:
        """The part that depends on the snapshot alone: all but the staleness check."""
        t = self.thresholds
        queue, kv = t.queue_threshold, t.kv_threshold
        kept = [
            e
            for e in endpoints
            if (m := e.metrics) is not None and e.healthy and m.waiting < queue and m.kv_cache_usage < kv
        ]
        least_recent = min([m.updated_at for e in kept if (m := e.metrics) is not None], default=math.inf)
        return _Eligible(_narrowed(endpoints, kept), kept, least_recent)


@dataclass(frozen=True, slots=True)
class _Eligible:
    """Endpoints neither unhealthy, unscraped, full nor queued (``kept``; ``endpoints`` as the filter
    returns them when none is stale), and the least recent scrape time among them."""

    endpoints: Sequence[EndpointView]
    kept: list[EndpointView]
    least_recent_update: float


class SubsetHintFilter:
    """Keeps only endpoints whose ``ip`` or ``ip:port`` is in the request's subset hint.

    What a hint allows is kept per snapshot for the last ``HINTS`` distinct hints
    (``SubsetViews``): a gateway that sends a hint sends the same one request after request, and
    selecting anew cost a pass over the pool per pick and a new list that every per-snapshot
    structure downstream rebuilt from (``candidate-set``'s included: O(pool) in Python per pick).
    A hint that allows every endpoint gives the snapshot itself.
    """

    HINTS = 8

    def __init__(self) -> None:
        self._hinted: OrderedDict[frozenset[str], SubsetViews] = OrderedDict()

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        subset = ctx.request.subset
        if subset is None:
            return endpoints
        hinted = self._hinted
        views = hinted.get(subset)
        if views is None:
            views = hinted[subset] = SubsetViews(partial(_allowed_by, subset))
            if len(hinted) > self.HINTS:
                hinted.popitem(last=False)
        else:
            hinted.move_to_end(subset)
        kept = views.of(endpoints)
        if not kept:
            raise NoEligibleEndpointError("no endpoint of the pool matches the subset hint")
        return endpoints if len(kept) == len(endpoints) else kept


def _allowed_by(subset: frozenset[str], view: EndpointView) -> bool:
    return view.address in subset or view.endpoint.host in subset


class LoraFilter:
    """For a known adapter (active or waiting somewhere): keep endpoints with it active, else those
    with a free slot, else all. Requests for names no endpoint reports (base models) pass through."""

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        adapter = ctx.request.target_model
        active: list[EndpointView] = []
        free: list[EndpointView] = []
        for e in endpoints:
            m = e.metrics
            if m is None:
                continue
            if adapter in m.active_loras:
                active.append(e)
            elif m.max_loras > 0 and len(m.active_loras) + len(m.waiting_loras) < m.max_loras:
                free.append(e)
        if active:
            return _narrowed(endpoints, active)
        return free if free and _is_known_adapter(adapter, endpoints) else endpoints


def _narrowed(endpoints: Sequence[EndpointView], kept: list[EndpointView]) -> Sequence[EndpointView]:
    """``kept`` (a subset of ``endpoints``, order kept); ``endpoints`` itself when it kept all or none;
    a tuple when ``endpoints`` is one."""
    if not kept or len(kept) == len(endpoints):
        return endpoints
    return tuple(kept) if isinstance(endpoints, tuple) else kept


def _is_known_adapter(adapter: str, endpoints: Sequence[EndpointView]) -> bool:
    return any(
        e.metrics is not None and (adapter in e.metrics.active_loras or adapter in e.metrics.waiting_loras)
        for e in endpoints
    )
