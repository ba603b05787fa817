"""``gateway.picker.metric_aliases``: the Inference Extension's families also under llm-d's names,
made at scrape time, samples and labels the same."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from kvgate.gateway.picker.metric_aliases import LLM_D_NAMES, exposition


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {family.name: [(s.name, s.labels, s.value) for s in family.samples]
            for family in text_string_to_metric_families(text)}


def test_the_inference_extensions_families_are_copied_under_llm_ds_names() -> None:
    registry = CollectorRegistry()
    requests = Counter("inference_objective_request_total", "Requests.", ["model_name", "target_model_name"],
                       registry=registry)
    requests.labels("llama", "llama").inc(3)
    queued = Gauge("inference_extension_flow_control_queue_size", "Held.",
                   ["fairness_id", "priority", "inference_pool"], registry=registry)
    queued.labels("tenant-a", "0", "default/llama").set(2)
    waited = Histogram("inference_extension_flow_control_request_queue_duration_seconds", "Waits.",
                       ["outcome"], buckets=(0.1, 1.0), registry=registry)
    waited.labels("Dispatched").observe(0.5)
    Gauge("kvgate_session_pins", "Pins.", registry=registry).set(1)
    families = _families(exposition(registry).decode())
    assert families["llm_d_epp_request"] == [
        ("llm_d_epp_request_total", {"model_name": "llama", "target_model_name": "llama"}, 3.0)]
    assert families["llm_d_epp_flow_control_queue_size"] == [
        ("llm_d_epp_flow_control_queue_size",
         {"fairness_id": "tenant-a", "priority": "0", "inference_pool": "default/llama"}, 2.0)]
    copied = families["llm_d_epp_flow_control_request_queue_duration_seconds"]
    original = families["inference_extension_flow_control_request_queue_duration_seconds"]
    assert [(n.replace("llm_d_epp", "inference_extension"), labels, v) for n, labels, v in copied] == original
    assert not any(name.startswith("llm_d_epp") and "session" in name for name in families)
    assert all(new.startswith("llm_d_epp_") for names in LLM_D_NAMES.values() for new in names)
