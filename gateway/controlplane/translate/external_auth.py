"""A rule's ExternalAuth filter (the Gateway API's HTTPExternalAuthFilter) as Envoy's ext_authz.

Each request a rule with ExternalAuth matches is checked by the named Service before anything else
runs on it (after CORS, so browsers' preflights need no credentials; before the body-based router
and the picker, so a refused request costs no pick): over Envoy's ext_authz gRPC protocol
(``GRPC``) or as a plain HTTP request (``HTTP``: the path prefixed with ``http.path``, the
``allowedHeaders`` besides Envoy's own set, the ``allowedResponseHeaders`` of an allowed answer
added to the request upstream). ``forwardBody.maxSize`` sends up to that many bytes of the body.

Refused requests get the service's status (401, 403, ...) in OpenAI's JSON shape; a service that
cannot be reached answers 503, never letting a request through unchecked, as does an ExternalAuth
whose Service cannot be resolved (the rule answers 500 and the route's ResolvedRefs says why).

Each distinct configuration is one ext_authz filter on the listener, off unless a route turns it on.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvgate.gateway.controlplane import envoy_config as ec
from kvgate.gateway.controlplane.resources import ResolvedRule
from kvgate.gateway.controlplane.translate.backends import ClusterSet, static_cluster

JsonDict = dict[str, Any]
_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3."
CHECK_TIMEOUT_S = 2.0
_HTTP2 = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    }
}


def _patterns(names: tuple[str, ...]) -> JsonDict:
    return {"patterns": [{"exact": name.lower(), "ignore_case": True} for name in names]}


def auth_filter(rule: ResolvedRule, clusters: ClusterSet) -> tuple[JsonDict, JsonDict] | None:
    """The listener's ext_authz filter for ``rule`` (off by default) and the route's entry turning
    it on; None: the rule has no usable ExternalAuth (an unusable one makes it answer 500)."""
    auth = rule.external_auth
    if auth is None or not auth.backend.valid:
        return None
    backend, config = auth.backend, auth.config
    name = f"kvgate_auth_{backend.key}_{backend.port or 0}"
    cluster = static_cluster(name, backend.addresses)
    authz: JsonDict = {"@type": _TYPE + "ExtAuthz", "transport_api_version": "V3",
                       "failure_mode_allow": False, "status_on_error": {"code": "ServiceUnavailable"}}
    if config.protocol == "GRPC":
        cluster["typed_extension_protocol_options"] = _HTTP2
        timeout = ec.duration(CHECK_TIMEOUT_S)
        authz["grpc_service"] = {"envoy_grpc": {"cluster_name": name}, "timeout": timeout}
        if config.grpc is not None and config.grpc.allowed_headers:
            authz["allowed_headers"] = _patterns(config.grpc.allowed_headers)
    else:
        http = config.http
        service: JsonDict = {
            "server_uri": {"uri": f"http://{name}", "cluster": name, "timeout": ec.duration(CHECK_TIMEOUT_S)},
            "path_prefix": (http.path or "").rstrip("/") if http is not None else "",
        }
        if http is not None and http.allowed_headers:
            service["authorization_request"] = {"allowed_headers": _patterns(http.allowed_headers)}
        if http is not None and http.allowed_response_headers:
            allowed = _patterns(http.allowed_response_headers)
            service["authorization_response"] = {"allowed_upstream_headers": allowed}
        authz["http_service"] = service
    if config.forward_body is not None and config.forward_body.max_size > 0:
        authz["with_request_body"] = {"max_request_bytes": config.forward_body.max_size,
                                      "allow_partial_message": True}
    clusters.add(cluster)
    digest = hashlib.sha256(json.dumps(authz, sort_keys=True).encode()).hexdigest()[:12]
    filter_name = f"kvgate.ext_authz.{digest}"
    http_filter = {"name": filter_name, "disabled": True, "typed_config": authz}
    enabled = {filter_name: {"@type": ec.FILTER_CONFIG_TYPE,
                             "config": {"@type": _TYPE + "ExtAuthzPerRoute", "check_settings": {}}}}
    return http_filter, enabled
