"""Golden-style tests of the Envoy config builders, and Envoy's own validation of the bootstrap."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvgate.gateway.controlplane.envoy_clusters import (
    PoolBackend,
    ext_proc_cluster,
    pool_cluster,
    pool_clusters,
)
from kvgate.gateway.controlplane.envoy_config import (
    EXT_PROC_FILTER,
    OUTCOME_CLUSTER,
    ExtProcSettings,
    GatewayConfig,
    RouteSpec,
    duration,
    ext_proc_filter,
    ext_proc_per_route,
    pool_routes,
    processing_mode,
    static_bootstrap,
)
from kvgate.gateway.processes.envoy_process import find_envoy_binary
from kvgate.policies.types import FailureMode

SETTINGS = ExtProcSettings()
CLOSED = PoolBackend("llama")
OPEN = PoolBackend("qwen", FailureMode.FAIL_OPEN, ("127.0.0.1:8001", "127.0.0.1:8002"))
PER_ROUTE_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"


def test_duration_formats_protobuf_json() -> None:
    assert [duration(0), duration(30), duration(0.25), duration(1.5)] == ["0s", "30s", "0.25s", "1.5s"]


def test_gie_processing_mode() -> None:
    assert processing_mode("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED") == {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SEND",
    }
    buffered = processing_mode("BUFFERED", "FULL_DUPLEX_STREAMED")
    assert buffered["request_trailer_mode"] == "SKIP"
    assert buffered["response_trailer_mode"] == "SEND"


def test_pool_cluster_follows_destination_header() -> None:
    assert pool_cluster("llama") == {
        "name": "kvgate_pool_llama",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "circuit_breakers": {
            "thresholds": [
                {
                    "max_connections": 1_000_000,
                    "max_pending_requests": 1_000_000,
                    "max_requests": 1_000_000,
                    "max_retries": 3,
                }
            ]
        },
        "original_dst_lb_config": {
            "use_http_header": True,
            "http_header_name": "x-gateway-destination-endpoint",
        },
    }


def test_ext_proc_cluster_is_http2_with_every_picker() -> None:
    cluster = ext_proc_cluster([("127.0.0.1", 9002), ("127.0.0.1", 9003)])
    key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    options = cluster["typed_extension_protocol_options"][key]
    assert options["explicit_http_config"] == {"http2_protocol_options": {}}
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [9002, 9003]
    with pytest.raises(ValueError, match="picker address"):
        ext_proc_cluster([])


def test_ext_proc_filter_fails_closed_and_exchanges_lb_metadata() -> None:
    config = ext_proc_filter(SETTINGS)["typed_config"]
    assert config["failure_mode_allow"] is False
    assert config["grpc_service"]["envoy_grpc"] == {"cluster_name": "kvgate_ext_proc"}
    assert config["message_timeout"] == "30s"
    assert config["metadata_options"] == {
        "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint", "envoy.lb"]},
        "receiving_namespaces": {"untyped": ["envoy.lb"]},
    }
    assert config["response_attributes"] == ["upstream.address"]


def test_per_route_names_the_pool() -> None:
    assert ext_proc_per_route(CLOSED, SETTINGS) == {
        "@type": PER_ROUTE_TYPE,
        "overrides": {"grpc_initial_metadata": [{"key": "x-kvgate-pool", "value": "llama"}]},
    }


def test_fail_open_pool_buffers_request_bodies_and_allows_failure() -> None:
    overrides = ext_proc_per_route(OPEN, SETTINGS)["overrides"]
    assert overrides["failure_mode_allow"] is True
    assert overrides["processing_mode"]["request_body_mode"] == "BUFFERED"
    assert overrides["processing_mode"]["response_body_mode"] == "FULL_DUPLEX_STREAMED"


def test_fail_close_pool_has_one_route_to_its_original_dst_cluster() -> None:
    (route,) = pool_routes(RouteSpec("chat", "llama", "/v1/", (("x-tier", "gold"),)), CLOSED, SETTINGS)
    assert route["name"] == "chat"
    assert route["match"] == {
        "prefix": "/v1/",
        "headers": [{"name": "x-tier", "string_match": {"exact": "gold"}}],
    }
    assert route["route"] == {"cluster": "kvgate_pool_llama", "timeout": "0s",
                              "upgrade_configs": [{"upgrade_type": "websocket"}]}  # (realtime sessions)
    enabled = route["typed_per_filter_config"][EXT_PROC_FILTER]  # turns the filter on (off by default)
    assert enabled["@type"].endswith("envoy.config.route.v3.FilterConfig")
    metadata = enabled["config"]["overrides"]["grpc_initial_metadata"]
    assert metadata == [{"key": "x-kvgate-pool", "value": "llama"}]


def test_fail_open_pool_routes_picked_requests_first_then_falls_back() -> None:
    picked, fallback = pool_routes(RouteSpec("r", "qwen"), OPEN, SETTINGS)
    assert picked["match"]["dynamic_metadata"] == [
        {
            "filter": "envoy.lb",
            "path": [{"key": "x-gateway-destination-endpoint"}],
            "value": {"present_match": True},
        }
    ]
    assert picked["route"]["cluster"] == "kvgate_pool_qwen"
    assert fallback["match"] == {"prefix": "/"}
    assert fallback["route"]["cluster"] == "kvgate_pool_qwen_fallback"
    assert [c["name"] for c in pool_clusters(OPEN)] == ["kvgate_pool_qwen", "kvgate_pool_qwen_fallback"]


def test_route_for_another_pool_is_rejected() -> None:
    with pytest.raises(ValueError, match="not 'llama'"):
        pool_routes(RouteSpec("r", "qwen"), CLOSED, SETTINGS)


def test_fail_open_pool_without_endpoints_is_rejected() -> None:
    with pytest.raises(ValueError, match="needs endpoints"):
        pool_clusters(PoolBackend("empty", FailureMode.FAIL_OPEN))


def _config(**changes: Any) -> GatewayConfig:
    base: dict[str, Any] = {
        "listen_port": 18080,
        "admin_port": 18081,
        "picker_addresses": (("127.0.0.1", 9002),),
        "pools": (CLOSED, OPEN),
        "routes": (RouteSpec("to-llama", "llama", "/llama"), RouteSpec("to-qwen", "qwen")),
    }
    return GatewayConfig(**{**base, **changes})


def test_static_bootstrap_combines_everything() -> None:
    boot = static_bootstrap(_config(subset_hint=("127.0.0.1:8001",)))
    assert boot["admin"] == {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 18081}}}
    resources = boot["static_resources"]
    assert [c["name"] for c in resources["clusters"]] == [
        "kvgate_ext_proc", "kvgate_pool_llama", "kvgate_pool_qwen", "kvgate_pool_qwen_fallback",
    ]
    (listener,) = resources["listeners"]
    assert listener["per_connection_buffer_limit_bytes"] == SETTINGS.max_body_bytes
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert [f["name"] for f in hcm["http_filters"]] == [
        "kvgate.strip_system_headers", "kvgate.subset_hint", EXT_PROC_FILTER, "envoy.filters.http.router",
    ]
    removed = [m["remove"] for m in hcm["http_filters"][0]["typed_config"]["mutations"]["request_mutations"]]
    assert "x-gateway-destination-endpoint" in removed
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert [r["name"] for r in routes] == ["to-llama", "to-qwen", "to-qwen_fallback"]


def test_static_bootstrap_defaults_to_one_route_to_the_first_pool() -> None:
    boot = static_bootstrap(_config(routes=()))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert [(r["match"], r["route"]["cluster"]) for r in routes] == [({"prefix": "/"}, "kvgate_pool_llama")]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pools": ()}, "at least one pool"),
        ({"pools": (CLOSED, CLOSED)}, "unique"),
        ({"routes": (RouteSpec("r", "nope"),)}, "unknown pool"),
    ],
)
def test_static_bootstrap_rejects_bad_input(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        static_bootstrap(_config(**changes))


def _hcm(boot: dict[str, Any]) -> dict[str, Any]:
    [listener] = boot["static_resources"]["listeners"]
    config: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return config


REPORTS = {"settings": ExtProcSettings(outcome_reports=True), "outcome_addresses": (("127.0.0.1", 9004),)}


def test_outcome_reports_log_only_marked_requests_to_the_pickers_outcome_ports() -> None:
    assert "access_log" not in _hcm(static_bootstrap(_config()))
    boot = static_bootstrap(_config(**REPORTS))
    hcm = _hcm(boot)
    [log] = hcm["access_log"]
    assert log["filter"] == {"header_filter": {"header": {"name": "x-kvgate-outcome", "present_match": True}}}
    common = log["typed_config"]["common_config"]
    assert common["grpc_service"] == {"envoy_grpc": {"cluster_name": OUTCOME_CLUSTER}}
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    [outcome_port] = clusters[OUTCOME_CLUSTER]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert outcome_port["endpoint"]["address"]["socket_address"]["port_value"] == 9004  # not ext_proc
    with pytest.raises(ValueError, match="outcome addresses"):
        static_bootstrap(_config(settings=ExtProcSettings(outcome_reports=True)))
    assert log["typed_config"]["additional_request_headers_to_log"] == [
        "x-kvgate-outcome", "x-gateway-destination-endpoint"]
    # a client cannot forge a report: the header is stripped before anything reads it
    strip = hcm["http_filters"][0]["typed_config"]["mutations"]["request_mutations"]
    assert {"remove": "x-kvgate-outcome"} in strip


@pytest.mark.e2e  # runs the Envoy binary (--mode validate)
@pytest.mark.parametrize("reports", [False, True], ids=["plain", "outcome-reports"])
def test_real_envoy_accepts_the_bootstrap(tmp_path: Path, reports: bool) -> None:
    path = tmp_path / "bootstrap.json"
    changes: dict[str, Any] = REPORTS if reports else {}
    path.write_text(json.dumps(static_bootstrap(_config(subset_hint=("127.0.0.1:8001",), **changes))))
    result = subprocess.run(
        [str(find_envoy_binary()), "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "OK" in result.stdout + result.stderr
