"""What kvgate's listeners allow their clients (timeouts and limits on connections and requests), and
the access log of what they sent.

Envoy's defaults suit a proxy inside a trusted network, not a gateway facing clients: no timeout on
receiving a request's headers or body (50 clients that declared a 100 KB body and stalled held their
connections for good) and no limit on connections. These follow Envoy's guidance for an edge proxy,
kept safe for LLM traffic: the request timeouts cover only receiving the request (a response may
stream for minutes; ``stream_idle_timeout`` bounds silence, not length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvgate.extproc.request_headers import ENVOY_MAX_HEADER_BYTES, ENVOY_MAX_HEADERS

JsonDict = dict[str, Any]


ACCESS_LOG_FIELDS: JsonDict = {
    "start_time": "%START_TIME%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "client": "%DOWNSTREAM_REMOTE_ADDRESS%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "protocol": "%PROTOCOL%",
    "model": "%REQ(X-GATEWAY-MODEL-NAME)%",
    "status": "%RESPONSE_CODE%",
    "details": "%RESPONSE_CODE_DETAILS%",
    "flags": "%RESPONSE_FLAGS%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "duration_ms": "%DURATION%",
    "upstream_ms": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "picked": "%REQ(X-GATEWAY-DESTINATION-ENDPOINT)%",
    "upstream": "%UPSTREAM_HOST%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    "route": "%ROUTE_NAME%",
    "user_agent": "%REQ(USER-AGENT)%",
}
"""One access-log line: who asked what, which endpoint the picker chose and which one served, how
it ended (Envoy's response flags and details name its own failures)."""


def duration(seconds: float) -> str:
    """A protobuf Duration in JSON form."""
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


@dataclass(frozen=True, slots=True)
class DownstreamSettings:
    request_headers_timeout_s: float = 10.0
    """A client must send a request's headers within this (Envoy: 408)."""
    request_timeout_s: float = 60.0
    """A client must send the whole request within this (Envoy: 408); the response is not bounded."""
    stream_idle_timeout_s: float = 300.0
    """A request on which nothing moves either way for this long is reset."""
    connection_idle_timeout_s: float = 3600.0
    """A connection with no request for this long is closed."""
    max_connections: int = 50_000
    """Open downstream connections, over all listeners (Envoy's overload manager refuses more)."""
    max_concurrent_streams: int = 100
    """HTTP/2 requests at once on one client connection (Envoy's edge guidance)."""
    access_log_path: str | None = None
    """Where Envoy writes one JSON line per request (None: no access log)."""

    def http_connection_manager_fields(self) -> JsonDict:
        """The HttpConnectionManager fields these limits set (header limits written as Envoy's
        defaults, which the picker's own header check counts on: ``extproc.request_headers``)."""
        fields: JsonDict = {
            "stream_idle_timeout": duration(self.stream_idle_timeout_s),
            "request_headers_timeout": duration(self.request_headers_timeout_s),
            "request_timeout": duration(self.request_timeout_s),
            "max_request_headers_kb": ENVOY_MAX_HEADER_BYTES // 1024,
            "common_http_protocol_options": {
                "idle_timeout": duration(self.connection_idle_timeout_s),
                "max_headers_count": ENVOY_MAX_HEADERS,
            },
            # HTTP/1.0 clients (ApacheBench, old load testers) get an answer as the model servers give
            # them one, not Envoy's 426 in plain text; a request without a Host routes as any other
            "http_protocol_options": {"accept_http_10": True, "default_host_for_http_10": "kvgate"},
            "http2_protocol_options": {
                "max_concurrent_streams": self.max_concurrent_streams,
                "initial_stream_window_size": 65536,
                "initial_connection_window_size": 1048576,
            },
            # one spelling of each path before the picker checks it (extproc.inference_paths)
            "normalize_path": True,
            "merge_slashes": True,
        }
        return fields

    def access_logs(self) -> list[JsonDict]:
        """The HCM's file access log of every request, JSON lines (none without a path)."""
        if self.access_log_path is None:
            return []
        return [{
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": self.access_log_path,
                "log_format": {"json_format": ACCESS_LOG_FIELDS},
            },
        }]

    def overload_manager(self) -> JsonDict:
        """The bootstrap's ``overload_manager``: the global downstream connection limit."""
        monitor = "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
        return {
            "resource_monitors": [{
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": f"type.googleapis.com/{monitor}",
                    "max_active_downstream_connections": self.max_connections,
                },
            }]
        }
