"""When an endpoint counts as saturated (GIE's rule), shared by the saturation filter and admission."""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.policies.types import EndpointView


@dataclass(frozen=True, slots=True)
class SaturationThresholds:
    """Saturated: unhealthy, never scraped, metrics older than ``metrics_staleness_s``,
    ``waiting >= queue_threshold`` or ``kv_cache_usage >= kv_threshold``."""

    queue_threshold: int = 5
    kv_threshold: float = 0.8
    metrics_staleness_s: float = 0.2

    def saturated(self, view: EndpointView, now: float) -> bool:
        metrics = view.metrics
        if metrics is None or not view.healthy:
            return True
        if now - metrics.updated_at > self.metrics_staleness_s:
            return True
        return metrics.waiting >= self.queue_threshold or metrics.kv_cache_usage >= self.kv_threshold
