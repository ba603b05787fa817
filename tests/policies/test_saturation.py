"""``policies.saturation``: an endpoint's level against the thresholds and a pool's saturation, as
the Inference Extension's utilization detector (and llm-d's ``flow_control_pool_saturation``) have them."""

from __future__ import annotations

import pytest

from kvgate.policies.saturation import SaturationThresholds, pool_saturation
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView

THRESHOLDS = SaturationThresholds(queue_threshold=5, kv_threshold=0.8, metrics_staleness_s=0.2)


def view(waiting: int, kv: float, *, age_s: float = 0.0, healthy: bool = True) -> EndpointView:
    metrics = EndpointMetrics(waiting=waiting, kv_cache_usage=kv, updated_at=100.0 - age_s)
    return EndpointView(Endpoint("10.0.0.1:8000", "p"), metrics, healthy=healthy)


def test_an_endpoints_level_is_its_fuller_side() -> None:
    assert THRESHOLDS.level(view(2, 0.2), 100.0) == pytest.approx(0.4)  # 2/5 > 0.2/0.8
    assert THRESHOLDS.level(view(1, 0.6), 100.0) == pytest.approx(0.75)
    assert THRESHOLDS.level(view(10, 0.1), 100.0) == pytest.approx(2.0)  # overloaded: above 1
    assert THRESHOLDS.level(view(0, 0.0, age_s=1.0), 100.0) == 1.0  # stale
    assert THRESHOLDS.level(view(0, 0.0, healthy=False), 100.0) == 1.0
    assert THRESHOLDS.level(EndpointView(Endpoint("10.0.0.2:8000", "p")), 100.0) == 1.0  # never scraped
    assert THRESHOLDS.saturated(view(5, 0.0), 100.0)  # (the level reaches 1 where saturated begins)


def test_a_pools_saturation_is_the_mean_and_an_empty_pool_is_full() -> None:
    assert pool_saturation([view(2, 0.2), view(1, 0.6)], THRESHOLDS, 100.0) == pytest.approx(0.575)
    assert pool_saturation([], THRESHOLDS, 100.0) == 1.0
