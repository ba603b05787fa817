"""Envoy's bootstrap for a kvgate-managed Envoy: everything dynamic comes over ADS from kvgate.

The bootstrap holds the node identity, the admin listener, ``dynamic_resources`` pointing LDS and CDS at
ADS, and one static cluster, ``xds_cluster`` (HTTP/2 to the ADS server). Resources served over ADS refer
to RDS and EDS through :func:`ads_config_source`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

XDS_CLUSTER: Final = "xds_cluster"
HTTP_PROTOCOL_OPTIONS: Final = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def ads_config_source() -> dict[str, Any]:
    """The ``ConfigSource`` for a resource delivered over ADS (``rds.config_source``, ``eds_config``…)."""
    return {"ads": {}, "resource_api_version": "V3"}


def http2_protocol_options() -> dict[str, Any]:
    """``typed_extension_protocol_options`` making a cluster speak HTTP/2 (gRPC) to its upstream."""
    return {
        HTTP_PROTOCOL_OPTIONS: {
            "@type": f"type.googleapis.com/{HTTP_PROTOCOL_OPTIONS}",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }


def _parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(address, tuple):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"xDS address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def bootstrap_for_ads(
    node_id: str,
    xds_address: str | tuple[str, int],
    admin_port: int,
    *,
    node_cluster: str = "kvgate",
    admin_host: str = "127.0.0.1",
    connect_timeout_s: float = 1.0,
    static_clusters: Iterable[Mapping[str, Any]] = (),
    overload_manager: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Envoy's bootstrap (as a JSON/YAML-ready dict) taking listeners and clusters from kvgate's ADS.

    ``xds_address``: ``"host:port"`` or ``(host, port)`` of the ADS server. ``static_clusters``: extra
    clusters Envoy should have from the start (Envoy JSON dicts); name them to the snapshot cache
    (``SnapshotCache(static_clusters=...)``) when snapshots refer to them. ``overload_manager``: its
    configuration, e.g. a limit on downstream connections (``gateway.controlplane.downstream``).
    """
    host, port = _parse_address(xds_address)
    xds_cluster: dict[str, Any] = {
        "name": XDS_CLUSTER,
        "type": "STATIC",
        "connect_timeout": f"{connect_timeout_s:g}s",
        "typed_extension_protocol_options": http2_protocol_options(),
        "load_assignment": {
            "cluster_name": XDS_CLUSTER,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
                    ]
                }
            ],
        },
    }
    bootstrap: dict[str, Any] = {
        "node": {"id": node_id, "cluster": node_cluster},
        "admin": {"address": {"socket_address": {"address": admin_host, "port_value": admin_port}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
            },
            "cds_config": ads_config_source(),
            "lds_config": ads_config_source(),
        },
        "static_resources": {"clusters": [xds_cluster, *(dict(c) for c in static_clusters)]},
    }
    if overload_manager is not None:
        bootstrap["overload_manager"] = dict(overload_manager)
    return bootstrap
