"""Filters: each narrows the candidate endpoints, keeping their order.

The soft filters (healthy, saturation, LoRA) never empty the set: when nothing would remain they
return their input, so the scorers still choose the least-bad endpoint and admission decides
whether to shed. The subset hint is a hard constraint from the data plane: nothing left → 503.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field

from policies.errors import NoEligibleEndpointError
from policies.framework import SchedulingContext
from policies.plugins.params import Params, parse_params
from policies.saturation import SaturationThresholds
from policies.types import EndpointView


class HealthyFilter:
    """Drops endpoints never scraped or unhealthy, unless none would remain."""

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        kept = [e for e in endpoints if e.healthy and e.metrics is not None]
        return kept or endpoints


class SaturationParams(Params):
    queue_threshold: Annotated[int, Field(ge=1)] = 5
    kv_threshold: Annotated[float, Field(gt=0.0, le=1.0)] = 0.8
    metrics_staleness_s: Annotated[float, Field(gt=0.0)] = 0.2


class SaturationFilter:
    """Drops saturated endpoints (queue, KV, stale metrics, unhealthy), unless all are saturated."""

    def __init__(self, thresholds: SaturationThresholds | None = None) -> None:
        self.thresholds = thresholds or SaturationThresholds()

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> SaturationFilter:
        p = parse_params(SaturationParams, parameters, "saturation-filter")
        thresholds = SaturationThresholds(p.queue_threshold, p.kv_threshold, p.metrics_staleness_s)
        return SaturationFilter(thresholds)

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        t = self.thresholds
        oldest = ctx.now - t.metrics_staleness_s
        queue, kv = t.queue_threshold, t.kv_threshold
        kept = [
            e
            for e in endpoints
            if (m := e.metrics) is not None
            and e.healthy
            and m.updated_at >= oldest
            and m.waiting < queue
            and m.kv_cache_usage < kv
        ]
        return kept or endpoints


class SubsetHintFilter:
    """Keeps only endpoints whose ``ip`` or ``ip:port`` is in the request's subset hint."""

    def filter(self, ctx: SchedulingContext, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        subset = ctx.request.subset
        if subset is None:
            return endpoints
        kept = [e for e in endpoints if e.address in subset or e.endpoint.host in subset]
        if not kept:
            raise NoEligibleEndpointError("no endpoint of the subset hint is eligible")
        return kept


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
            return active
        return free if free and _is_known_adapter(adapter, endpoints) else endpoints


def _is_known_adapter(adapter: str, endpoints: Sequence[EndpointView]) -> bool:
    return any(
        e.metrics is not None and (adapter in e.metrics.active_loras or adapter in e.metrics.waiting_loras)
        for e in endpoints
    )
