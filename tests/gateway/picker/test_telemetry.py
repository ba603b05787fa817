from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvgate.extproc.ports import RequestLabels
from kvgate.gateway.picker.telemetry import (
    MAX_MODEL_LABEL_SETS,
    OTHER,
    GatewayTelemetry,
    SessionPinsCollector,
)
from kvgate.policies.state import InProcessState
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointSnapshot, EndpointView


def _samples(telemetry: GatewayTelemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    page = telemetry.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def test_request_lifecycle_uses_the_inference_extension_names() -> None:
    t = GatewayTelemetry()
    labels = RequestLabels(pool="p", model="llama", target_model="llama-lora")
    t.request_picked(labels, 1024)
    t.first_token(labels, 0.05)
    t.tokens(labels, 100, 20)
    t.request_finished(labels, 0.5, ok=True)
    t.request_error(labels, "request_shed")
    t.scheduled("p", 0.0001)
    t.observe("scorer", "queue-scorer", "queue", 0.00002)
    s = _samples(t)
    key = (("model_name", "llama"), ("target_model_name", "llama-lora"))
    assert s[("inference_objective_request_total", key)] == 1
    assert s[("inference_objective_request_ttft_seconds_count", key)] == 1
    assert s[("inference_objective_input_tokens_sum", key)] == 100
    assert s[("inference_objective_output_tokens_sum", key)] == 20
    assert s[("inference_objective_request_duration_seconds_count", key)] == 1
    assert s[("inference_objective_running_requests", (("model_name", "llama"),))] == 0
    assert s[("inference_objective_request_error_total", (("error_code", "request_shed"), *key))] == 1
    assert s[("inference_extension_scheduler_e2e_duration_seconds_count", (("pool", "p"),))] == 1
    plugin = (("extension_point", "scorer"), ("plugin_name", "queue"), ("plugin_type", "queue-scorer"))
    assert s[("inference_extension_plugin_duration_seconds_count", plugin)] == 1


def test_arbitrary_model_names_cannot_grow_the_page_without_bound() -> None:
    t = GatewayTelemetry()
    for i in range(MAX_MODEL_LABEL_SETS + 50):
        labels = RequestLabels(pool="p", model=f"m{i}", target_model=f"m{i}")
        t.request_picked(labels, 10)
        t.request_finished(labels, 0.1, ok=True)
    s = _samples(t)
    models = {dict(k[1]).get("model_name") for k in s if k[0] == "inference_objective_request_total"}
    assert len(models) == MAX_MODEL_LABEL_SETS + 1
    other = (("model_name", OTHER), ("target_model_name", OTHER))
    assert s[("inference_objective_request_total", other)] == 50
    assert s[("inference_objective_running_requests", (("model_name", OTHER),))] == 0


def test_pool_gauges_come_from_the_live_snapshot() -> None:
    t = GatewayTelemetry()

    def view(address: str, waiting: int, kv: float, healthy: bool = True) -> EndpointView:
        return EndpointView(
            Endpoint(address, "p"), EndpointMetrics(waiting=waiting, kv_cache_usage=kv), healthy
        )

    snapshot = EndpointSnapshot.of(
        {
            "p": (
                view("10.0.0.1:8000", 2, 0.2),
                view("10.0.0.2:8000", 4, 0.6),
                view("10.0.0.3:8000", 9, 1.0, False),
            )
        }
    )
    t.watch_pools(lambda: snapshot, lambda: {"10.0.0.1:8000": (5, 1)})
    s = _samples(t)
    assert s[("inference_pool_ready_pods", (("name", "p"),))] == 2
    assert s[("inference_pool_average_queue_size", (("name", "p"),))] == 3
    assert abs(s[("inference_pool_average_kv_cache_utilization", (("name", "p"),))] - 0.4) < 1e-9
    assert s[("kvgate_endpoint_scrapes_total", (("endpoint", "10.0.0.1:8000"), ("result", "failure")))] == 1


def test_session_pins_count_those_kept_and_those_dropped_for_room() -> None:
    t = GatewayTelemetry()
    state = InProcessState(max_sessions=2)
    t.registry.register(SessionPinsCollector(lambda: {"p": state.session_counts()}))
    for session in ("a", "b", "a", "c"):  # "a" used again: "b" is the least recent
        state.session_set(session, "10.0.0.1:8000")
    s = _samples(t)
    assert s[("kvgate_session_pins", (("pool", "p"),))] == 2
    assert s[("kvgate_session_pins_dropped_total", (("pool", "p"),))] == 1
    state.forget_endpoint("10.0.0.1:8000")  # the endpoint left: its pins go, none dropped for room
    s = _samples(t)
    assert s[("kvgate_session_pins", (("pool", "p"),))] == 0
    assert s[("kvgate_session_pins_dropped_total", (("pool", "p"),))] == 1
