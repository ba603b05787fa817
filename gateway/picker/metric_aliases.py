"""The picker's metrics under llm-d's names as well (``llm_d_epp_*``), for the dashboards and
autoscalers written against llm-d's endpoint picker: its guides scale on
``llm_d_epp_flow_control_queue_size`` and ``llm_d_epp_request_running`` (KEDA), its variant
autoscaler reads the queue size under that name before the Inference Extension's. llm-d exports both
its names and the Inference Extension's (``inference_objective_*``, ``inference_pool_*``,
``inference_extension_*``), which kvgate's own dashboard reads; so does kvgate, the copies made at
scrape time alone (nothing on the request path).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Protocol

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

LLM_D_NAMES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    # family names as prometheus_client keeps them (a counter's without ``_total``)
    "inference_objective_request": ("llm_d_epp_request",),
    "inference_objective_request_error": ("llm_d_epp_request_error",),
    "inference_objective_request_duration_seconds": ("llm_d_epp_request_duration_seconds",),
    "inference_objective_request_ttft_seconds": ("llm_d_epp_request_ttft_seconds",),
    "inference_objective_request_sizes": ("llm_d_epp_request_size_bytes",),
    "inference_objective_input_tokens": ("llm_d_epp_request_input_tokens",),
    "inference_objective_output_tokens": ("llm_d_epp_request_output_tokens",),
    # (llm-d renamed it; its guides' autoscalers of either vintage read one of the two)
    "inference_objective_running_requests": ("llm_d_epp_request_running", "llm_d_epp_running_requests"),
    "inference_pool_average_kv_cache_utilization": ("llm_d_epp_average_kv_cache_utilization",),
    "inference_pool_average_queue_size": ("llm_d_epp_average_queue_size",),
    "inference_pool_ready_pods": ("llm_d_epp_ready_endpoints",),
    "inference_extension_scheduler_e2e_duration_seconds": ("llm_d_epp_scheduler_e2e_duration_seconds",),
    "inference_extension_plugin_duration_seconds": ("llm_d_epp_plugin_duration_seconds",),
    "inference_extension_flow_control_queue_size": ("llm_d_epp_flow_control_queue_size",),
    "inference_extension_flow_control_pool_saturation": ("llm_d_epp_flow_control_pool_saturation",),
    "inference_extension_flow_control_request_queue_duration_seconds":
        ("llm_d_epp_flow_control_request_queue_duration_seconds",),
})
"""The Inference Extension's family → llm-d's names for it (its ``llm_d_epp`` subsystem, the names of
its current release; the running-request gauge under its earlier name too)."""


class _Source(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class WithLlmdNames:
    """``source``'s families, each of :data:`LLM_D_NAMES` followed by its copy under llm-d's name."""

    def __init__(self, source: _Source, names: Mapping[str, tuple[str, ...]] = LLM_D_NAMES) -> None:
        self._source = source
        self._names = names

    def collect(self) -> Iterable[Metric]:
        for family in self._source.collect():
            yield family
            for name in self._names.get(family.name, ()):
                copy = Metric(name, f"{family.documentation} (llm-d's name)", family.type, family.unit)
                for sample in family.samples:
                    copy.add_sample(name + sample.name[len(family.name):], sample.labels, sample.value,
                                    sample.timestamp, sample.exemplar)
                yield copy


def exposition(source: _Source) -> bytes:
    """The text format of ``source`` with llm-d's names (:class:`WithLlmdNames`)."""
    return generate_latest(WithLlmdNames(source))
