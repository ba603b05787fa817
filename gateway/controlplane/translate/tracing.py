"""Envoy's own tracing (``kvgate up --otlp-endpoint``): the HTTP connection manager's OpenTelemetry
tracer and the cluster it exports to over OTLP/gRPC.

Envoy starts each sampled trace (``random_sampling``: the ratio as a percentage) unless the client
sent a ``traceparent`` (then its decision holds), makes a span for the request, one for the ext_proc
call to the picker (whose gRPC metadata carries the W3C context, so the picker's spans are its
children) and, with ``spawn_upstream_span``, one per upstream attempt (a retry shows as a second),
and forwards ``traceparent`` to the model server, whose own spans (vLLM's
``--otlp-traces-endpoint``) join the trace.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Final

from kvgate.gateway.controlplane import envoy_clusters as ecl

JsonDict = dict[str, Any]

OTLP_CLUSTER: Final = "kvgate_otlp"
_OTEL_CONFIG_TYPE = "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig"
_UUID_CONFIG_TYPE = "type.googleapis.com/envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig"


@dataclass(frozen=True, slots=True)
class EnvoyTracing:
    """Where Envoy sends its spans, the share of requests it traces and its ``service.name``."""

    host: str
    port: int
    sampling_ratio: float = 1.0
    service_name: str = "kvgate-envoy"
    tls: bool = False


def hcm_tracing(tracing: EnvoyTracing) -> JsonDict:
    """The connection manager's ``tracing`` field."""
    return {
        "provider": {
            "name": "envoy.tracers.opentelemetry",
            "typed_config": {
                "@type": _OTEL_CONFIG_TYPE,
                "grpc_service": {"envoy_grpc": {"cluster_name": OTLP_CLUSTER}, "timeout": "1s"},
                "service_name": tracing.service_name,
            },
        },
        "random_sampling": {"value": round(100.0 * tracing.sampling_ratio, 6)},
        "spawn_upstream_span": True,
    }


def request_id_extension() -> JsonDict:
    """Sampling that does not read ``x-request-id``: by default Envoy records its decision inside a
    UUID request id, so a request whose client sent an id of its own that is not a UUID (kept:
    clients correlate by it) was never traced, whatever the sampling."""
    return {
        "typed_config": {
            "@type": _UUID_CONFIG_TYPE,
            "pack_trace_reason": False,
            "use_request_id_for_trace_sampling": False,
        }
    }


def otlp_cluster(tracing: EnvoyTracing) -> JsonDict:
    """HTTP/2 to the OTLP receiver: ``STATIC`` for an IP, ``STRICT_DNS`` for a name."""
    cluster = ecl.ext_proc_cluster([(tracing.host, tracing.port)], OTLP_CLUSTER, tls=tracing.tls)
    try:
        ipaddress.ip_address(tracing.host)
    except ValueError:
        cluster["type"] = "STRICT_DNS"
    del cluster["lb_policy"]  # one receiver
    return cluster
