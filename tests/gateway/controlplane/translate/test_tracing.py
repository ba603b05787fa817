"""Envoy's tracing in the translation (``gateway.controlplane.translate.tracing``): the connection
manager's OpenTelemetry tracer, sampling apart from ``x-request-id``, the OTLP cluster."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvgate.gateway.controlplane.translate.tracing import OTLP_CLUSTER, EnvoyTracing
from kvgate.gateway.controlplane.xds import Snapshot
from tests.gateway.controlplane.translate.golden import SETTINGS, translate_case


def _hcm(listener: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return config


def test_tracing_adds_the_tracer_and_its_cluster_and_parses_as_envoy_protos() -> None:
    settings = dataclasses.replace(SETTINGS, tracing=EnvoyTracing("127.0.0.1", 4317, 0.25))
    resources = translate_case("single_pool", settings)
    hcm = _hcm(resources.listeners[0])
    assert hcm["tracing"]["random_sampling"] == {"value": 25.0}
    exporter = hcm["tracing"]["provider"]["typed_config"]["grpc_service"]
    assert exporter["envoy_grpc"]["cluster_name"] == OTLP_CLUSTER
    assert hcm["tracing"]["spawn_upstream_span"] is True
    assert hcm["request_id_extension"]["typed_config"]["use_request_id_for_trace_sampling"] is False
    (cluster,) = [c for c in resources.clusters if c["name"] == OTLP_CLUSTER]
    assert cluster["type"] == "STATIC"
    Snapshot.from_dicts(listeners=resources.listeners, routes=resources.routes, clusters=resources.clusters)


def test_a_receiver_by_name_is_resolved_by_dns_and_off_means_nothing_added() -> None:
    named = dataclasses.replace(SETTINGS, tracing=EnvoyTracing("otel-collector.observability", 4317))
    (cluster,) = [c for c in translate_case("single_pool", named).clusters if c["name"] == OTLP_CLUSTER]
    assert cluster["type"] == "STRICT_DNS"
    plain = translate_case("single_pool", SETTINGS)
    assert "tracing" not in _hcm(plain.listeners[0])
    assert not [c for c in plain.clusters if c["name"] == OTLP_CLUSTER]
