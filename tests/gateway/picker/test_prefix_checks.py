"""The prefix-prediction check's metrics (``gateway.picker.telemetry``)."""

from __future__ import annotations

from kvgate.extproc.ports import RequestLabels
from kvgate.gateway.picker.telemetry import GatewayTelemetry, prefix_outcome


def test_outcomes() -> None:
    assert prefix_outcome(512, 512, 64) == "as_predicted"
    assert prefix_outcome(512, 560, 64) == "as_predicted"  # the engine's finer blocks: within one of ours
    assert prefix_outcome(512, 200, 64) == "missed"
    assert prefix_outcome(0, 0, 64) == "as_predicted"
    assert prefix_outcome(0, 64, 64) == "unpredicted"


def test_counted_per_pool_and_kind() -> None:
    telemetry = GatewayTelemetry()
    labels = RequestLabels("pool-a", "m", "m")
    telemetry.prefix_checked(labels, 256, 512, 240, 64)
    telemetry.prefix_checked(labels, 512, 512, 0, 64)
    page = telemetry.exposition().decode()
    assert 'kvgate_prefix_tokens_total{kind="predicted",pool="pool-a"} 768.0' in page
    assert 'kvgate_prefix_tokens_total{kind="best",pool="pool-a"} 1024.0' in page
    assert 'kvgate_prefix_tokens_total{kind="cached",pool="pool-a"} 240.0' in page
    assert 'kvgate_prefix_checks_total{outcome="missed",pool="pool-a"} 1.0' in page
    assert 'kvgate_prefix_checks_total{outcome="as_predicted",pool="pool-a"} 1.0' in page
