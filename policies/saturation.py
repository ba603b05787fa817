"""When an endpoint counts as saturated (GIE's rule), shared by the saturation filter and admission."""

from __future__ import annotations

from collections.abc import Sequence
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

    def level(self, view: EndpointView, now: float) -> float:
        """How full ``view`` is against the thresholds: ``max(waiting / queue_threshold, kv_cache_usage
        / kv_threshold)`` (1.0: saturated); 1.0 for one unhealthy, never scraped or stale."""
        metrics = view.metrics
        if metrics is None or not view.healthy or now - metrics.updated_at > self.metrics_staleness_s:
            return 1.0
        return max(metrics.waiting / self.queue_threshold, metrics.kv_cache_usage / self.kv_threshold)


def pool_saturation(views: Sequence[EndpointView], thresholds: SaturationThresholds, now: float) -> float:
    """A pool's saturation as the Inference Extension's utilization detector reports it (llm-d's
    ``flow_control_pool_saturation``): the mean of its endpoints' :meth:`SaturationThresholds.level`;
    1.0 for a pool without endpoints (nothing can take a request). Above 1.0: overloaded."""
    if not views:
        return 1.0
    return sum(thresholds.level(view, now) for view in views) / len(views)
