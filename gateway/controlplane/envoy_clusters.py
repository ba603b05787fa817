"""Envoy clusters as plain dicts (proto-JSON shape): the picker's gRPC cluster and each pool's
clusters (pure builders, no IO; envoy_config.py builds the filters, routes, listeners and the
bootstrap around them). The behaviour they rely on, measured on Envoy 1.40: docs/envoy-extproc.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.extproc.names import DESTINATION_HEADER, LB_NAMESPACE
from kvgate.gateway.controlplane.downstream import duration
from kvgate.policies.types import FailureMode

JsonDict = dict[str, Any]

EXT_PROC_CLUSTER = "kvgate_ext_proc"
_TYPE = "type.googleapis.com/"
_HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_LOOSE_LIMIT = 1_000_000  # circuit-breaker ceiling: Envoy's default 1,024 throttles benchmarks


@dataclass(frozen=True, slots=True)
class PoolBackend:
    """An InferencePool as the data plane sees it."""

    name: str
    failure_mode: FailureMode = FailureMode.FAIL_CLOSE
    endpoints: tuple[str, ...] = ()
    """``ip:port`` of the replicas; used only by a FailOpen pool's fallback cluster."""
    announced: bool = True
    """False: its routes name no pool to the picker, which serves them from its default pool (a
    picker of one pool whose name the configuration cannot know: ``kvgate picker
    --endpoint-selector`` names it after its Deployment)."""


def socket_address(host: str, port: int) -> JsonDict:
    return {"socket_address": {"address": host, "port_value": port}}


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _circuit_breakers() -> JsonDict:
    limit = {
        "max_connections": _LOOSE_LIMIT,
        "max_pending_requests": _LOOSE_LIMIT,
        "max_requests": _LOOSE_LIMIT,
        "max_retries": 3,
    }
    return {"thresholds": [limit]}


def _load_assignment(name: str, addresses: Sequence[tuple[str, int]]) -> JsonDict:
    lb_endpoints = [{"endpoint": {"address": socket_address(host, port)}} for host, port in addresses]
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": lb_endpoints}]}


def upstream_tls() -> JsonDict:
    """TLS to an upstream whose certificate is not verified (a self-signed picker), HTTP/2 by ALPN."""
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"alpn_protocols": ["h2"]},
        },
    }


def model_server_tls(ca_file: str | None) -> JsonDict:
    """TLS to a pool's model servers (HTTP/1.1, as vLLM serves it): verified against ``ca_file``
    (the chain: pods are reached by IP, their certificates seldom name it), else not verified."""
    context: JsonDict = {"alpn_protocols": ["http/1.1"]}
    if ca_file is not None:
        context["validation_context"] = {"trusted_ca": {"filename": ca_file}}
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": context,
        },
    }


def verified_tls(sni: str, ca_pem: str | None, ca_file: str | None, names: Sequence[tuple[str, str]],
                 alpn: Sequence[str] = ("http/1.1",)) -> JsonDict:
    """TLS to an upstream as a BackendTLSPolicy asks: SNI ``sni``, the chain verified against
    ``ca_pem``, else the certificates in ``ca_file`` (the system's: Envoy's ``system_root_certs``
    is not implemented), and the certificate naming one of ``names``
    (``("Hostname", name)``: a DNS subject alternative name, wildcard certificates matched as
    Envoy matches them; ``("URI", uri)``: a URI one, e.g. a SPIFFE ID)."""
    source = {"inline_string": ca_pem} if ca_pem is not None else {"filename": ca_file}
    matchers = [{"san_type": "DNS" if kind == "Hostname" else "URI", "matcher": {"exact": value}}
                for kind, value in names]
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": sni,
            "common_tls_context": {
                "alpn_protocols": list(alpn),
                "validation_context": {"trusted_ca": source, "match_typed_subject_alt_names": matchers},
            },
        },
    }


def ext_proc_cluster(
    addresses: Sequence[tuple[str, int]],
    name: str = EXT_PROC_CLUSTER,
    connect_timeout_s: float = 1.0,
    *,
    tls: bool = False,
) -> JsonDict:
    """The picker's gRPC cluster (HTTP/2); several addresses = several picker processes."""
    if not addresses:
        raise ValueError("the ext_proc cluster needs at least one picker address")
    cluster = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": duration(connect_timeout_s),
        "lb_policy": "LEAST_REQUEST",
        "circuit_breakers": _circuit_breakers(),
        "typed_extension_protocol_options": {
            _HTTP_OPTIONS_KEY: {
                "@type": _TYPE + _HTTP_OPTIONS_KEY,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": _load_assignment(name, addresses),
    }
    if tls:
        cluster["transport_socket"] = upstream_tls()
    return cluster


def pool_cluster_name(pool: str) -> str:
    return f"kvgate_pool_{pool}"


def pool_fallback_cluster_name(pool: str) -> str:
    return f"kvgate_pool_{pool}_fallback"


def pool_cluster(pool: str, connect_timeout_s: float = 2.0) -> JsonDict:
    """The ORIGINAL_DST cluster of a pool: connects to the address in the destination header."""
    return {
        "name": pool_cluster_name(pool),
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": duration(connect_timeout_s),
        "circuit_breakers": _circuit_breakers(),
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
    }


_OVERRIDE_HOST_TYPE = _TYPE + "envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"
_ROUND_ROBIN_TYPE = _TYPE + "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"


def pool_override_cluster(pool: str, endpoints: Sequence[str], connect_timeout_s: float = 2.0) -> JsonDict:
    """A pool's replicas behind Envoy's ``override_host`` policy: each attempt goes to the next host
    of the picker's ``envoy.lb`` list (the pick, then its fallbacks), so a retry never repeats a
    host the picker ranked (measured on Envoy 1.40: a dead first host, one retry, served by the
    second); round robin over the replicas when the list names no host the cluster knows. The
    metadata cannot be set by a client (the header can, and is stripped anyway)."""
    name = pool_cluster_name(pool)
    override = {
        "@type": _OVERRIDE_HOST_TYPE,
        "override_host_sources": [{"metadata": {"key": LB_NAMESPACE, "path": [{"key": DESTINATION_HEADER}]}}],
        "fallback_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin", "typed_config": {"@type": _ROUND_ROBIN_TYPE},
        }}]},
    }
    breakers = _circuit_breakers()
    breakers["thresholds"][0]["max_retries"] = _LOOSE_LIMIT  # retries are bounded per route instead
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": duration(connect_timeout_s),
        "circuit_breakers": breakers,
        "load_assignment": _load_assignment(name, [split_host_port(a) for a in endpoints]),
        # Envoy's own ejection, beside the picker's (policies.outliers): a request the picker sent
        # to a replica that has just started failing skips it for the next on the list.
        "outlier_detection": {
            "consecutive_5xx": 5,
            "interval": duration(1.0),
            "base_ejection_time": duration(5.0),
            "max_ejection_time": duration(60.0),
            "max_ejection_percent": 50,
        },
        "load_balancing_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.override_host", "typed_config": override,
        }}]},
    }


def pool_fallback_cluster(pool: PoolBackend, connect_timeout_s: float = 2.0) -> JsonDict:
    """Round robin over a FailOpen pool's replicas, used when the picker cannot be asked."""
    if not pool.endpoints:
        raise ValueError(f"FailOpen pool {pool.name!r} needs endpoints for its fallback cluster")
    name = pool_fallback_cluster_name(pool.name)
    return {
        "name": name,
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": duration(connect_timeout_s),
        "circuit_breakers": _circuit_breakers(),
        "load_assignment": _load_assignment(name, [split_host_port(a) for a in pool.endpoints]),
    }


def pool_clusters(pool: PoolBackend) -> list[JsonDict]:
    """All clusters of one pool: the ORIGINAL_DST one, plus the fallback one for FailOpen."""
    clusters = [pool_cluster(pool.name)]
    if pool.failure_mode is FailureMode.FAIL_OPEN:
        clusters.append(pool_fallback_cluster(pool))
    return clusters


