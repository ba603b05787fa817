"""Reference checks on a snapshot before it is published (in the spirit of go-control-plane's
``Snapshot.Consistent()``): every route configuration a listener names through RDS exists, every cluster
a route or an ext_proc filter names exists, every EDS cluster has a load assignment.

Clusters Envoy knows from its bootstrap (``static_clusters``) count as existing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2
from google.protobuf import any_pb2

from kvgate.gateway.controlplane.xds.resource_types import (
    CLUSTER,
    ENDPOINT,
    EXT_PROC,
    EXT_PROC_PER_ROUTE,
    FILTER_CONFIG,
    HCM,
    LISTENER,
    ROUTE,
)
from kvgate.gateway.controlplane.xds.snapshot import Snapshot
from kvgate.policies.errors import ConfigError


def _connection_managers(
    listener: listener_pb2.Listener,
) -> Iterator[http_connection_manager_pb2.HttpConnectionManager]:
    chains = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    for chain in chains:
        for network_filter in chain.filters:
            if network_filter.typed_config.type_url == HCM:
                hcm = http_connection_manager_pb2.HttpConnectionManager()
                network_filter.typed_config.Unpack(hcm)
                yield hcm


def _ext_proc_cluster(config: any_pb2.Any) -> str | None:
    """The Envoy-gRPC cluster an ext_proc filter config or per-route override calls, if any."""
    if config.type_url == EXT_PROC:
        processor = ext_proc_pb2.ExternalProcessor()
        config.Unpack(processor)
        grpc_service = processor.grpc_service
    elif config.type_url == EXT_PROC_PER_ROUTE:
        per_route = ext_proc_pb2.ExtProcPerRoute()
        config.Unpack(per_route)
        grpc_service = per_route.overrides.grpc_service
    elif config.type_url == FILTER_CONFIG:  # a route turning a filter on, with its config inside
        wrapper = route_components_pb2.FilterConfig()
        config.Unpack(wrapper)
        return _ext_proc_cluster(wrapper.config) if wrapper.HasField("config") else None
    else:
        return None
    return grpc_service.envoy_grpc.cluster_name or None


def _per_filter_clusters(configs: Mapping[str, any_pb2.Any]) -> Iterator[str]:
    for config in configs.values():
        cluster = _ext_proc_cluster(config)
        if cluster:
            yield cluster


def _route_clusters(route: route_components_pb2.Route) -> Iterator[str]:
    yield from _per_filter_clusters(route.typed_per_filter_config)
    if not route.HasField("route"):
        return
    action = route.route
    specifier = action.WhichOneof("cluster_specifier")
    if specifier == "cluster":
        yield action.cluster
    elif specifier == "weighted_clusters":
        for weighted in action.weighted_clusters.clusters:
            yield weighted.name
            yield from _per_filter_clusters(weighted.typed_per_filter_config)
    for mirror in action.request_mirror_policies:
        if mirror.cluster:
            yield mirror.cluster


def route_config_clusters(config: route_pb2.RouteConfiguration) -> Iterator[str]:
    """Every cluster a route configuration names (``cluster_header`` routes name none statically)."""
    for virtual_host in config.virtual_hosts:
        yield from _per_filter_clusters(virtual_host.typed_per_filter_config)
        for route in virtual_host.routes:
            yield from _route_clusters(route)


def inconsistencies(snapshot: Snapshot, static_clusters: Collection[str] = ()) -> list[str]:
    """Human-readable reasons why ``snapshot`` is not self-consistent; empty when it is."""
    problems: list[str] = []
    clusters = snapshot.messages(CLUSTER)
    routes = snapshot.messages(ROUTE)
    assignments = snapshot.messages(ENDPOINT)
    known_clusters = set(clusters) | set(static_clusters)

    def check_clusters(owner: str, names: Iterator[str]) -> None:
        for name in sorted(set(names) - known_clusters):
            problems.append(f"{owner} names cluster {name!r}, which does not exist")

    for listener_name, listener in snapshot.messages(LISTENER).items():
        assert isinstance(listener, listener_pb2.Listener)
        for hcm in _connection_managers(listener):
            owner = f"listener {listener_name!r}"
            specifier = hcm.WhichOneof("route_specifier")
            if specifier == "rds" and hcm.rds.route_config_name not in routes:
                problems.append(
                    f"{owner} names route configuration {hcm.rds.route_config_name!r}, which does not exist"
                )
            elif specifier == "route_config":
                check_clusters(owner, route_config_clusters(hcm.route_config))
            check_clusters(
                owner, (c for f in hcm.http_filters if (c := _ext_proc_cluster(f.typed_config)) is not None)
            )
    for route_name, config in routes.items():
        assert isinstance(config, route_pb2.RouteConfiguration)
        check_clusters(f"route configuration {route_name!r}", route_config_clusters(config))
    for cluster_name, cluster in clusters.items():
        assert isinstance(cluster, cluster_pb2.Cluster)
        if cluster.WhichOneof("cluster_discovery_type") == "type" and cluster.type == cluster_pb2.Cluster.EDS:
            service = cluster.eds_cluster_config.service_name or cluster_name
            if service not in assignments:
                problems.append(f"EDS cluster {cluster_name!r} has no load assignment {service!r}")
    return problems


def check_consistent(snapshot: Snapshot, static_clusters: Collection[str] = ()) -> None:
    """Raise :class:`ConfigError` listing every dangling reference in ``snapshot``."""
    problems = inconsistencies(snapshot, static_clusters)
    if problems:
        raise ConfigError(f"inconsistent xDS snapshot {snapshot.version}: " + "; ".join(problems))
