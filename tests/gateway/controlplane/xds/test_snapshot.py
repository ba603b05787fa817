from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2

from kvgate.gateway.controlplane.xds import (
    CLUSTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    Snapshot,
    check_consistent,
    inconsistencies,
)
from kvgate.policies.errors import ConfigError
from tests.gateway.controlplane.xds.envoy_dicts import (
    EXT_PROC_PER_ROUTE_TYPE,
    ORIGINAL_DST_TYPE,
    assignment,
    eds_cluster,
    grpc_cluster,
    listener,
    original_dst_cluster,
    route_config,
    static_cluster,
)


def good_snapshot(body: str = "hello") -> Snapshot:
    return Snapshot.from_dicts(
        listeners=[listener("http", 8080, "main", ext_proc_cluster="picker")],
        routes=[route_config("main", body=body, cluster="pool", weighted={"pool": 70, "eds": 30})],
        clusters=[original_dst_cluster("pool"), grpc_cluster("picker", 9002), eds_cluster("eds")],
        endpoints=[assignment("eds", "127.0.0.1", 8000)],
    )


def test_version_is_a_content_hash() -> None:
    first, again, other = good_snapshot(), good_snapshot(), good_snapshot(body="changed")
    assert first.version == again.version
    assert first.version != other.version
    assert other.version_of(ROUTE) != first.version_of(ROUTE)
    assert other.version_of(LISTENER) == first.version_of(LISTENER)
    assert other.version_of(CLUSTER) == first.version_of(CLUSTER)


def test_resources_are_typed_and_packed_by_name() -> None:
    snapshot = good_snapshot()
    assert set(snapshot.messages(CLUSTER)) == {"pool", "picker", "eds"}
    assert isinstance(snapshot.messages(CLUSTER)["pool"], cluster_pb2.Cluster)
    assert [a.type_url for a in snapshot.packed(CLUSTER, ["eds", "missing"])] == [CLUSTER]
    assert len(snapshot.packed(CLUSTER)) == 3
    assert snapshot.packed("type.googleapis.com/unknown") == []
    assert snapshot.version_of("type.googleapis.com/unknown") is None


def test_empty_types_are_served_as_empty() -> None:
    snapshot = Snapshot.from_dicts()
    assert snapshot.packed(LISTENER) == []
    assert snapshot.version_of(LISTENER) is not None


def test_typed_configs_resolve_from_json() -> None:
    http = listener("http", 8080, "main", ext_proc_cluster="picker")
    http["listener_filters"] = [
        {"name": "envoy.filters.listener.original_dst", "typed_config": {"@type": ORIGINAL_DST_TYPE}}
    ]
    routes = route_config("main", cluster="pool")
    per_route = {
        "@type": EXT_PROC_PER_ROUTE_TYPE,
        "overrides": {"grpc_service": {"envoy_grpc": {"cluster_name": "picker"}}},
    }
    routes["virtual_hosts"][0]["routes"][0]["typed_per_filter_config"] = {
        "envoy.filters.http.ext_proc": per_route
    }
    snapshot = Snapshot.from_dicts(
        listeners=[http], routes=[routes], clusters=[original_dst_cluster("pool"), grpc_cluster("picker", 1)]
    )
    check_consistent(snapshot)
    parsed = snapshot.messages(LISTENER)["http"]
    assert isinstance(parsed, listener_pb2.Listener)
    assert parsed.listener_filters[0].typed_config.type_url == ORIGINAL_DST_TYPE
    config = snapshot.messages(ROUTE)["main"]
    assert isinstance(config, route_pb2.RouteConfiguration)
    override = config.virtual_hosts[0].routes[0].typed_per_filter_config
    unpacked = ext_proc_pb2.ExtProcPerRoute()
    assert override["envoy.filters.http.ext_proc"].Unpack(unpacked)
    assert unpacked.overrides.grpc_service.envoy_grpc.cluster_name == "picker"


@pytest.mark.parametrize(
    ("clusters", "message"),
    [
        ([{"name": "c", "type": "NOT_A_TYPE"}], "invalid Cluster 'c'"),
        ([{"name": "c", "no_such_field": 1}], "invalid Cluster 'c'"),
        ([{"name": "c", "typed_extension_protocol_options": {"x": {"@type": "type.googleapis.com/nope"}}}],
         "invalid Cluster 'c'"),
        ([static_cluster("c"), static_cluster("c")], "duplicate Cluster resource 'c'"),
        ([{"type": "STATIC"}], "has no name"),
    ],
)
def test_bad_resources_are_config_errors(clusters: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Snapshot.from_dicts(clusters=clusters)


def test_unknown_type_urls_are_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown xDS type"):
        Snapshot.from_dicts(others={"type.googleapis.com/envoy.Nope": [{"name": "x"}]})


def test_a_consistent_snapshot_has_no_problems() -> None:
    assert inconsistencies(good_snapshot()) == []


def test_inconsistencies_name_every_dangling_reference() -> None:
    snapshot = Snapshot.from_dicts(
        listeners=[listener("http", 8080, "missing-routes", ext_proc_cluster="missing-picker")],
        routes=[route_config("main", cluster="missing-pool", weighted={"pool": 1, "missing-split": 1})],
        clusters=[static_cluster("pool"), eds_cluster("eds-without-assignment")],
    )
    problems = inconsistencies(snapshot)
    assert problems == [
        "listener 'http' names route configuration 'missing-routes', which does not exist",
        "listener 'http' names cluster 'missing-picker', which does not exist",
        "route configuration 'main' names cluster 'missing-pool', which does not exist",
        "route configuration 'main' names cluster 'missing-split', which does not exist",
        "EDS cluster 'eds-without-assignment' has no load assignment 'eds-without-assignment'",
    ]
    with pytest.raises(ConfigError, match="inconsistent xDS snapshot"):
        check_consistent(snapshot)


def test_static_clusters_satisfy_references() -> None:
    snapshot = Snapshot.from_dicts(
        listeners=[listener("http", 8080, "main", ext_proc_cluster="bootstrap-picker")],
        routes=[route_config("main")],
    )
    assert inconsistencies(snapshot) == [
        "listener 'http' names cluster 'bootstrap-picker', which does not exist"
    ]
    assert inconsistencies(snapshot, static_clusters={"bootstrap-picker"}) == []


def test_eds_service_name_is_the_assignment_name() -> None:
    cluster = eds_cluster("c")
    cluster["eds_cluster_config"]["service_name"] = "svc"
    assert inconsistencies(Snapshot.from_dicts(clusters=[cluster], endpoints=[assignment("c", "h", 1)])) == [
        "EDS cluster 'c' has no load assignment 'svc'"
    ]
    named_right = Snapshot.from_dicts(clusters=[cluster], endpoints=[assignment("svc", "h", 1)])
    assert inconsistencies(named_right) == []


def test_from_messages_checks_message_types() -> None:
    with pytest.raises(ConfigError, match="Cluster resources must be Cluster"):
        Snapshot.from_messages(clusters=[listener_pb2.Listener(name="x")])
    snapshot = Snapshot.from_messages(clusters=[cluster_pb2.Cluster(name="x")])
    assert list(snapshot.messages(CLUSTER)) == ["x"]
    assert snapshot.messages(ENDPOINT) == {}


def test_named_versions_cover_only_the_named_resources() -> None:
    one = Snapshot.from_dicts(endpoints=[assignment("a", "h", 1), assignment("b", "h", 2)])
    other = Snapshot.from_dicts(endpoints=[assignment("a", "h", 1), assignment("b", "h", 3)])
    assert one.version_of(ENDPOINT, ["a"]) == other.version_of(ENDPOINT, ["a", "missing"])
    assert one.version_of(ENDPOINT, ["b"]) != other.version_of(ENDPOINT, ["b"])
    assert one.version_of(ENDPOINT) != other.version_of(ENDPOINT)
