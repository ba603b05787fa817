"""The data-path benchmark's Envoy: one process, one listener per measured path.

- ``direct``: a plain route to a STATIC round-robin cluster of the upstream endpoints (router only,
  no ext_proc) — the baseline.
- ``kvgate``: kvgate's own filter chain (``gateway.controlplane.envoy_config``: strip system
  headers → ext_proc full duplex → router) to the pool's ORIGINAL_DST cluster, one picker process.
- ``kvgate_pair`` (when two picker addresses are given): the same, with an ext_proc cluster listing
  two picker processes (Envoy balances the gRPC streams, LEAST_REQUEST).
- ``null_extproc`` (when a null processor is given): the same filter chain with
  bench/datapath/null_picker.py as the processor — the grpc.aio + Envoy ext_proc floor.

All listeners share one Envoy worker set, so the paths are compared on the same process and build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvgate.gateway.controlplane.envoy_clusters import (
    PoolBackend,
    ext_proc_cluster,
    pool_clusters,
    socket_address,
    split_host_port,
)
from kvgate.gateway.controlplane.envoy_config import (
    ExtProcSettings,
    JsonDict,
    RouteSpec,
    bootstrap,
    http_connection_manager,
    listener,
    pool_routes,
    route_configuration,
    router_filter,
)
from kvgate.policies.types import FailureMode

DIRECT_CLUSTER = "bench_direct"
POOL = "bench"
BODY_LIMIT = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class DatapathPorts:
    admin: int
    direct: int
    kvgate: int
    kvgate_pair: int | None
    null_extproc: int | None = None


def direct_cluster(endpoints: Sequence[str]) -> JsonDict:
    lb_endpoints = [
        {"endpoint": {"address": socket_address(*split_host_port(address))}} for address in endpoints
    ]
    return {
        "name": DIRECT_CLUSTER,
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": "2s",
        "load_assignment": {"cluster_name": DIRECT_CLUSTER, "endpoints": [{"lb_endpoints": lb_endpoints}]},
    }


def direct_listener(port: int) -> JsonDict:
    route = {
        "name": "direct", "match": {"prefix": "/"}, "route": {"cluster": DIRECT_CLUSTER, "timeout": "0s"}
    }
    hcm = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager",
            "stat_prefix": "direct",
            "codec_type": "AUTO",
            "route_config": route_configuration("direct", [route]),
            "http_filters": [router_filter()],
        },
    }
    return listener("direct", "127.0.0.1", port, hcm, BODY_LIMIT)


def kvgate_listener(name: str, port: int, ext_proc_cluster_name: str) -> JsonDict:
    settings = ExtProcSettings(cluster_name=ext_proc_cluster_name, max_body_bytes=BODY_LIMIT)
    pool = PoolBackend(POOL, FailureMode.FAIL_CLOSE)
    routes = pool_routes(RouteSpec(name=name, pool=POOL), pool, settings)
    hcm = http_connection_manager(name, route_configuration(name, routes), settings)
    return listener(name, "127.0.0.1", port, hcm, BODY_LIMIT)


def datapath_bootstrap(
    ports: DatapathPorts,
    endpoints: Sequence[str],
    pickers: Sequence[tuple[str, int]],
    null_picker: tuple[str, int] | None = None,
) -> JsonDict:
    """Listeners ``direct`` and ``kvgate`` (first picker), ``kvgate_pair`` (first two pickers) and
    ``null_extproc`` (the null processor) when their ports are set."""
    if not pickers:
        raise ValueError("at least one picker address is needed")
    listeners = [direct_listener(ports.direct), kvgate_listener("kvgate", ports.kvgate, "ext_proc_one")]
    clusters = [
        direct_cluster(endpoints),
        ext_proc_cluster(pickers[:1], name="ext_proc_one"),
        *pool_clusters(PoolBackend(POOL, FailureMode.FAIL_CLOSE)),
    ]
    if ports.kvgate_pair is not None:
        if len(pickers) < 2:
            raise ValueError("the kvgate_pair listener needs two picker addresses")
        listeners.append(kvgate_listener("kvgate_pair", ports.kvgate_pair, "ext_proc_pair"))
        clusters.append(ext_proc_cluster(pickers[:2], name="ext_proc_pair"))
    if ports.null_extproc is not None:
        if null_picker is None:
            raise ValueError("the null_extproc listener needs the null processor's address")
        listeners.append(kvgate_listener("null_extproc", ports.null_extproc, "ext_proc_null"))
        clusters.append(ext_proc_cluster([null_picker], name="ext_proc_null"))
    return bootstrap(ports.admin, listeners, clusters, node_id="kvgate-bench")
