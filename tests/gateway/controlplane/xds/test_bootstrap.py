from __future__ import annotations

import pytest
from envoy.config.bootstrap.v3 import bootstrap_pb2
from google.protobuf import json_format

from kvgate.gateway.controlplane.xds import XDS_CLUSTER, bootstrap_for_ads
from tests.gateway.controlplane.xds.envoy_dicts import static_cluster


def test_bootstrap_points_lds_and_cds_at_ads_over_http2() -> None:
    config = bootstrap_for_ads("node-1", "127.0.0.1:18000", 19000, static_clusters=[static_cluster("picker")])
    bootstrap = json_format.ParseDict(config, bootstrap_pb2.Bootstrap())
    assert bootstrap.node.id == "node-1"
    assert bootstrap.admin.address.socket_address.port_value == 19000
    ads = bootstrap.dynamic_resources.ads_config
    assert ads.api_type == ads.GRPC
    assert ads.transport_api_version == 2  # V3
    assert ads.grpc_services[0].envoy_grpc.cluster_name == XDS_CLUSTER
    assert bootstrap.dynamic_resources.cds_config.HasField("ads")
    assert bootstrap.dynamic_resources.lds_config.HasField("ads")
    xds, picker = bootstrap.static_resources.clusters
    assert (xds.name, picker.name) == (XDS_CLUSTER, "picker")
    address = xds.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (address.address, address.port_value) == ("127.0.0.1", 18000)
    assert "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" in xds.typed_extension_protocol_options


def test_address_may_be_a_tuple_and_must_have_a_port() -> None:
    config = bootstrap_for_ads("n", ("::1", 5), 1)
    endpoint = config["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]
    assert endpoint["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] == {
        "address": "::1",
        "port_value": 5,
    }
    assert bootstrap_for_ads("n", "[::1]:7", 1)["static_resources"]["clusters"][0]["load_assignment"][
        "endpoints"
    ][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["address"] == "::1"
    with pytest.raises(ValueError, match="host:port"):
        bootstrap_for_ads("n", "localhost", 1)
