"""Flow control's metrics: the Inference Extension's names, a zero series per pool for
autoscalers, and tenants (clients' header values) bounded."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.extproc.ports import OTHER_MODELS
from kvgate.gateway.picker.flow_telemetry import MAX_TENANTS, FlowTelemetry
from kvgate.policies.flow_control import HoldOutcome
from kvgate.policies.holding_queue import Waiting


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    page = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(page) for s in family.samples}


def test_queue_sizes_waits_and_outcomes_under_the_inference_extensions_names() -> None:
    registry = CollectorRegistry()
    held = {"llama": {(0, "a"): 2, (-1, "b"): 1}, "idle": {}}
    telemetry = FlowTelemetry(registry, lambda: held)
    telemetry.hold_ended("llama", Waiting("r1", 0, "a", 1.0, 9.0), HoldOutcome.DISPATCHED, 0.02)
    telemetry.hold_ended("llama", Waiting("r2", -1, "b", 1.0, 9.0), HoldOutcome.EVICTED_TTL, 5.0)
    s = samples(registry)
    size = "inference_extension_flow_control_queue_size"
    assert s[(size, (("fairness_id", "a"), ("inference_pool", "llama"), ("priority", "0")))] == 2
    assert s[(size, (("fairness_id", "b"), ("inference_pool", "llama"), ("priority", "-1")))] == 1
    assert s[("kvgate_flow_control_held_requests", (("inference_pool", "llama"),))] == 3
    assert s[("kvgate_flow_control_held_requests", (("inference_pool", "idle"),))] == 0
    duration = "inference_extension_flow_control_request_queue_duration_seconds_count"
    assert s[(duration, (("fairness_id", "a"), ("inference_pool", "llama"), ("outcome", "Dispatched"),
                         ("priority", "0")))] == 1
    assert s[(duration, (("fairness_id", "b"), ("inference_pool", "llama"), ("outcome", "EvictedTTL"),
                         ("priority", "-1")))] == 1


def test_tenants_beyond_the_bound_count_under_other() -> None:
    registry = CollectorRegistry()
    telemetry = FlowTelemetry(registry, dict)
    for i in range(MAX_TENANTS + 20):
        telemetry.hold_ended("p", Waiting(f"r{i}", 0, f"tenant-{i}", 1.0, 9.0), HoldOutcome.DISPATCHED, 0.01)
    tenants = {dict(labels)["fairness_id"] for name, labels in samples(registry)
               if name.endswith("queue_duration_seconds_count")}
    assert len(tenants) == MAX_TENANTS + 1
    assert OTHER_MODELS in tenants
