"""Flow control's metrics under the Inference Extension's names (issue 34).

- ``inference_extension_flow_control_queue_size{fairness_id,priority,inference_pool}``: requests held
  now (collected at scrape time from the holding areas).
- ``inference_extension_flow_control_request_queue_duration_seconds{fairness_id,priority,outcome,
  inference_pool}``: how long each held request waited, by how its wait ended (Dispatched,
  RejectedCapacity, EvictedTTL, EvictedContextCancelled); its ``_count`` counts dispatches, timeouts
  and sheds.
- ``kvgate_flow_control_held_requests{inference_pool}``: held now, one series per pool with flow
  control, zero included (what an autoscaler scales a pool from zero on).

Tenants are the clients' own header values: the first :data:`MAX_TENANTS` seen get their own label,
later ones count under ``__other__`` (a client must not grow the metrics page without bound).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.extproc.ports import OTHER_MODELS
from kvgate.policies.flow_control import HoldOutcome
from kvgate.policies.holding_queue import Waiting

MAX_TENANTS = 100
QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                 30.0, 60.0)
"""The Inference Extension's buckets for the queue duration."""

HeldCounts = Callable[[], Mapping[str, Mapping[tuple[int, str], int]]]
"""pool → (band, tenant) → requests held now."""


class TenantLabels:
    """A tenant's label: its own for the first ``limit`` tenants, then ``__other__``."""

    def __init__(self, limit: int = MAX_TENANTS) -> None:
        self._limit = limit
        self._known: set[str] = set()

    def of(self, tenant: str) -> str:
        if tenant in self._known:
            return tenant
        if len(self._known) < self._limit:
            self._known.add(tenant)
            return tenant
        return OTHER_MODELS


class FlowTelemetry(Collector):
    """``extproc.holding.HoldingMetrics`` and the queue-size gauge, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry, held: HeldCounts) -> None:
        self._held = held
        self._tenants = TenantLabels()
        self._duration = Histogram(
            "inference_extension_flow_control_request_queue_duration_seconds",
            "Time requests spent held in the picker's flow control, by how the wait ended.",
            ["fairness_id", "priority", "outcome", "inference_pool"], buckets=QUEUE_BUCKETS,
            registry=registry,
        )
        registry.register(self)

    def hold_ended(self, pool: str, item: Waiting, outcome: HoldOutcome, seconds: float) -> None:
        self._duration.labels(self._tenants.of(item.tenant), str(item.band), outcome.value,
                              pool).observe(seconds)

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "inference_extension_flow_control_queue_size", "Requests held in the picker's flow control now.",
            labels=["fairness_id", "priority", "inference_pool"],
        )
        total = GaugeMetricFamily(
            "kvgate_flow_control_held_requests",
            "Requests held in the picker's flow control now, per pool (0 included: for autoscalers).",
            labels=["inference_pool"],
        )
        for pool, counts in sorted(self._held().items()):
            total.add_metric([pool], float(sum(counts.values())))
            merged: dict[tuple[str, str], int] = {}
            for (band, tenant), count in counts.items():
                key = (self._tenants.of(tenant), str(band))
                merged[key] = merged.get(key, 0) + count
            for (tenant_label, band_label), count in sorted(merged.items()):
                family.add_metric([tenant_label, band_label, pool], float(count))
        yield family
        yield total
