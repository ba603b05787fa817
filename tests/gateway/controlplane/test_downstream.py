"""The clients' timeouts and limits kvgate writes into Envoy's configuration."""

from __future__ import annotations

from kvgate.extproc.request_headers import ENVOY_MAX_HEADERS
from kvgate.gateway.controlplane.downstream import DownstreamSettings


def test_the_request_is_bounded_while_it_is_received_and_the_header_limits_are_the_pickers() -> None:
    limits = DownstreamSettings(request_timeout_s=7.5, request_headers_timeout_s=2)
    fields = limits.http_connection_manager_fields()
    assert (fields["request_timeout"], fields["request_headers_timeout"]) == ("7.5s", "2s")
    assert fields["common_http_protocol_options"]["max_headers_count"] == ENVOY_MAX_HEADERS
    assert fields["normalize_path"] is True


def test_the_connection_limit_is_an_overload_manager_monitor() -> None:
    [monitor] = DownstreamSettings(max_connections=123).overload_manager()["resource_monitors"]
    assert monitor["name"] == "envoy.resource_monitors.global_downstream_max_connections"
    assert monitor["typed_config"]["max_active_downstream_connections"] == 123
