"""A rule's ExternalAuth filter (the Gateway API's HTTPExternalAuthFilter) as Envoy's ext_authz.

Each request a rule with ExternalAuth matches is checked by the named Service before the picker
runs on it (a refused request costs no pick), after CORS (browsers' preflights need no credentials)
and after the body-based router, which re-matches the route on the body's model: over Envoy's
ext_authz gRPC protocol (``GRPC``) or as a plain HTTP request (``HTTP``: the path prefixed with
``http.path``, the ``allowedHeaders`` besides Envoy's own set, the ``allowedResponseHeaders`` of an
allowed answer added to the request upstream). ``forwardBody.maxSize`` sends up to that many bytes
of the body.

Refused requests get the service's status (401, 403, ...) in OpenAI's JSON shape; a service that
cannot be reached answers 503, never letting a request through unchecked, as does an ExternalAuth
whose Service cannot be resolved (the rule answers 500 and the route's ResolvedRefs says why).

Each distinct configuration is one ext_authz filter on the listener, on by default and turned off
by every route of the listener that does not ask for it (:func:`with_auth_off`). Not the other way
round: Envoy instantiates a filter that is off by default only when the request's first match turns
it on, before the body-based router names the model, so a request that first matched an open rule
and was then routed on its model to a guarded one went unchecked (an end-to-end test showed it).
Read when the filter's turn comes (after the body-based router), the per-route settings are the
final route's; a route that failed to say "off" would be checked, never the reverse.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from kvgate.gateway.controlplane import envoy_config as ec
from kvgate.gateway.controlplane.resources import ResolvedRule
from kvgate.gateway.controlplane.translate.backends import ClusterSet, service_cluster

JsonDict = dict[str, Any]
_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3."
FILTER_PREFIX = "kvgate.ext_authz."
CHECK_TIMEOUT_S = 2.0


def _patterns(names: tuple[str, ...]) -> JsonDict:
    return {"patterns": [{"exact": name.lower(), "ignore_case": True} for name in names]}


def auth_filter(rule: ResolvedRule, clusters: ClusterSet) -> tuple[JsonDict, JsonDict] | None:
    """The listener's ext_authz filter for ``rule`` and the rule's routes' entry for it (checking);
    None: the rule has no usable ExternalAuth (an unusable one makes it answer 500)."""
    auth = rule.external_auth
    if auth is None or not auth.backend.valid:
        return None
    backend, config = auth.backend, auth.config
    name = f"kvgate_auth_{backend.key}_{backend.port or 0}"
    cluster = service_cluster(backend, name, http2=config.protocol == "GRPC")
    authz: JsonDict = {"@type": _TYPE + "ExtAuthz", "transport_api_version": "V3",
                       "failure_mode_allow": False, "status_on_error": {"code": "ServiceUnavailable"}}
    if config.protocol == "GRPC":
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
    filter_name = f"{FILTER_PREFIX}{digest}"
    http_filter = {"name": filter_name, "typed_config": authz}
    on = {filter_name: {"@type": _TYPE + "ExtAuthzPerRoute", "check_settings": {}}}
    return http_filter, on


def with_auth_off(route_config: JsonDict, filter_names: Sequence[str]) -> JsonDict:
    """``route_config`` with each of the listener's ext_authz filters turned off on every route
    that does not name it (they are on by default: the module docstring says why)."""
    if not filter_names:
        return route_config
    for host in route_config.get("virtual_hosts", []):
        for route in host.get("routes", []):
            per_filter = route.setdefault("typed_per_filter_config", {})
            for name in filter_names:
                per_filter.setdefault(name, {"@type": _TYPE + "ExtAuthzPerRoute", "disabled": True})
    return route_config
