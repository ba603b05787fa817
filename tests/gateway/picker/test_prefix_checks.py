"""The prefix-prediction check's metrics (``gateway.picker.telemetry``)."""

from __future__ import annotations

from kvgate.extproc.ports import RequestLabels
from kvgate.gateway.picker.telemetry import GatewayTelemetry, prefix_outcome


def test_outcomes() -> None:
    assert prefix_outcome(512, 512) == "as_predicted"
    assert prefix_outcome(512, 500) == "as_predicted"  # within a block
    assert prefix_outcome(512, 200) == "missed"
    assert prefix_outcome(0, 0) == "as_predicted"
    assert prefix_outcome(0, 64) == "unpredicted"


def test_counted_per_pool_and_kind() -> None:
    telemetry = GatewayTelemetry()
    labels = RequestLabels("pool-a", "m", "m")
    telemetry.prefix_checked(labels, 256, 512, 240)
    telemetry.prefix_checked(labels, 512, 512, 0)
    page = telemetry.exposition().decode()
    assert 'kvgate_prefix_tokens_total{kind="predicted",pool="pool-a"} 768.0' in page
    assert 'kvgate_prefix_tokens_total{kind="best",pool="pool-a"} 1024.0' in page
    assert 'kvgate_prefix_tokens_total{kind="cached",pool="pool-a"} 240.0' in page
    assert 'kvgate_prefix_checks_total{outcome="missed",pool="pool-a"} 1.0' in page
    assert 'kvgate_prefix_checks_total{outcome="as_predicted",pool="pool-a"} 1.0' in page
