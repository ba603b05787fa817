"""Envoy JSON-style resources for the xDS tests (kvgate's real translator lives elsewhere)."""

from __future__ import annotations

from typing import Any

from kvgate.gateway.controlplane.xds import ads_config_source, http2_protocol_options

TYPE = "type.googleapis.com/"
HCM_TYPE = TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER_TYPE = TYPE + "envoy.extensions.filters.http.router.v3.Router"
EXT_PROC_TYPE = TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
EXT_PROC_PER_ROUTE_TYPE = TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
ORIGINAL_DST_TYPE = TYPE + "envoy.extensions.filters.listener.original_dst.v3.OriginalDst"


def socket_address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def listener(
    name: str, port: int, route_name: str, *, ext_proc_cluster: str | None = None
) -> dict[str, Any]:
    http_filters: list[dict[str, Any]] = []
    if ext_proc_cluster is not None:
        http_filters.append(
            {
                "name": "envoy.filters.http.ext_proc",
                "typed_config": {
                    "@type": EXT_PROC_TYPE,
                    "grpc_service": {"envoy_grpc": {"cluster_name": ext_proc_cluster}},
                    "failure_mode_allow": True,
                },
            }
        )
    http_filters.append({"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER_TYPE}})
    return {
        "name": name,
        "address": socket_address("127.0.0.1", port),
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": HCM_TYPE,
                            "stat_prefix": name,
                            "rds": {"route_config_name": route_name, "config_source": ads_config_source()},
                            "http_filters": http_filters,
                        },
                    }
                ]
            }
        ],
    }


def route_config(
    name: str,
    *,
    body: str = "hello",
    cluster: str | None = None,
    weighted: dict[str, int] | None = None,
    path_regex: str | None = None,
) -> dict[str, Any]:
    """A route configuration: ``/up`` goes to ``cluster`` (or the ``weighted`` clusters), anything else
    gets a direct response with ``body``. ``path_regex`` adds a regex route (an invalid one makes Envoy
    reject the configuration although it parses as a proto)."""
    routes: list[dict[str, Any]] = []
    if path_regex is not None:
        routes.append(
            {
                "match": {"safe_regex": {"regex": path_regex}},
                "direct_response": {"status": 200, "body": {"inline_string": "regex"}},
            }
        )
    if cluster is not None:
        routes.append({"match": {"prefix": "/up"}, "route": {"cluster": cluster}})
    if weighted is not None:
        routes.append(
            {
                "match": {"prefix": "/split"},
                "route": {
                    "weighted_clusters": {
                        "clusters": [{"name": n, "weight": w} for n, w in weighted.items()]
                    }
                },
            }
        )
    routes.append(
        {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": body}}}
    )
    return {"name": name, "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]}


def static_cluster(name: str, host: str = "127.0.0.1", port: int = 9) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket_address(host, port)}}]}],
        },
    }


def grpc_cluster(name: str, port: int) -> dict[str, Any]:
    cluster = static_cluster(name, port=port)
    cluster["typed_extension_protocol_options"] = http2_protocol_options()
    return cluster


def eds_cluster(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "EDS",
        "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": ads_config_source()},
    }


def assignment(cluster_name: str, host: str, port: int) -> dict[str, Any]:
    return {
        "cluster_name": cluster_name,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket_address(host, port)}}]}],
    }


def original_dst_cluster(name: str, header: str = "x-gateway-destination-endpoint") -> dict[str, Any]:
    return {
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "1s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": header},
    }
