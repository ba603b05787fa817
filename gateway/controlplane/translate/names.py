"""Stable names of the Envoy resources kvgate generates, and kvgate's own header/metadata names."""

from __future__ import annotations

from kvgate.gateway.controlplane.envoy_clusters import pool_cluster_name, pool_fallback_cluster_name
from kvgate.gateway.controlplane.resources import ObjectKey

BBR_FILTER = "kvgate.bbr"
"""The body-based-router ext_proc filter (before the endpoint-picker one, ``envoy.filters.http.ext_proc``)."""
ROLE_METADATA_KEY = "x-kvgate-role"
"""gRPC initial metadata on the body-based router's ext_proc stream; its value is :data:`BBR_ROLE`."""
BBR_ROLE = "bbr"

INVALID_BACKEND_CLUSTER = "kvgate_invalid_backend"
"""A cluster with no endpoints: the share of a split that goes to an invalid backendRef."""
INVALID_BACKEND_HEADER = "x-kvgate-invalid-backend"
"""Added by the invalid split entry; the local-reply mapper turns its 503 into a 500."""

__all__ = [
    "BBR_FILTER",
    "BBR_ROLE",
    "INVALID_BACKEND_CLUSTER",
    "INVALID_BACKEND_HEADER",
    "ROLE_METADATA_KEY",
    "listener_name",
    "picker_cluster_name",
    "pool_cluster_name",
    "pool_fallback_cluster_name",
    "route_config_name",
    "service_cluster_name",
]


def listener_name(port: int) -> str:
    return f"kvgate_http_{port}"


def route_config_name(port: int) -> str:
    return f"kvgate_http_{port}"


def service_cluster_name(key: ObjectKey, port: int | None) -> str:
    return f"kvgate_svc_{key}_{port or 0}"


def picker_cluster_name(namespace: str, service: str, port: int) -> str:
    """The ext_proc cluster of an external endpoint picker (a pool whose picker Service has addresses)."""
    return f"kvgate_epp_{namespace}/{service}_{port}"


def mirror_cluster_name(pool_id: str) -> str:
    """The cluster a RequestMirror to an InferencePool sends its copies through (round robin over the
    pool's serving replicas: no picker is asked for a copy)."""
    return f"kvgate_mirror_{pool_id}"
