"""HTTPRoute rules → Envoy routes, one group per match, each with its Gateway API precedence key.

A group is one Envoy route, or two for a rule with a FailOpen pool: first the route the picker's
``envoy.lb`` metadata selects (every pool through its ORIGINAL_DST cluster), then the same match
without that condition (FailOpen pools through their fallback clusters). Both carry the same
targets and weights in the same order, so Envoy's weighted pick (seeded once per request, not
re-rolled by ``clear_route_cache``: verified) lands on the same backend in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.extproc.names import DESTINATION_HEADER, LB_NAMESPACE, STREAM_HEADER
from kvgate.gateway.controlplane import envoy_config as ec
from kvgate.gateway.controlplane.resources import BackendKind, ResolvedBackend, ResolvedRoute, ResolvedRule
from kvgate.gateway.controlplane.resources.gateway_api import HTTPRouteMatch, HTTPRouteRetry
from kvgate.gateway.controlplane.resources.resolved import BackendProtocol
from kvgate.gateway.controlplane.translate.backends import (
    EXT_PROC_DISABLED,
    PER_ROUTE_TYPE,
    ClusterSet,
    Target,
    cluster_action,
    header_modifier,
    rule_targets,
)
from kvgate.gateway.controlplane.translate.cors import CORS_FILTER, cors_policy
from kvgate.gateway.controlplane.translate.external_auth import auth_filter
from kvgate.gateway.controlplane.translate.matches import (
    envoy_match,
    match_precedence,
    path_rewrite,
    redirect_action,
)
from kvgate.gateway.controlplane.translate.mirrors import mirror_policies
from kvgate.gateway.controlplane.translate.names import BBR_FILTER
from kvgate.gateway.controlplane.translate.retries import with_rule_retry
from kvgate.gateway.controlplane.translate.settings import TranslationSettings

JsonDict = dict[str, Any]
MatchKey = tuple[int, int, int, int, int, str, str, int, int]

_PICKED = {"filter": LB_NAMESPACE, "path": [{"key": DESTINATION_HEADER}], "value": {"present_match": True}}
_STREAMED = {"name": STREAM_HEADER, "string_match": {"exact": "1"}}
_NO_BACKEND_BODY = "no valid backend for this route rule"


@dataclass(frozen=True, slots=True)
class RouteGroup:
    """The Envoy routes of one HTTPRoute match, with what orders it among the others."""

    key: MatchKey
    routes: tuple[JsonDict, ...]
    header_names: frozenset[str]
    cors: bool = False
    """Its routes carry a CORS policy (the listener then runs Envoy's CORS filter)."""
    auth_filters: tuple[JsonDict, ...] = ()
    """The ext_authz filters its routes turn on (the listener carries them, off by default)."""


def _merge_headers(*parts: JsonDict) -> JsonDict:
    merged: JsonDict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, list) and key in merged:
                merged[key] = [*merged[key], *value]
            elif isinstance(value, dict) and isinstance(merged.get(key), dict):  # typed_per_filter_config
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return merged


def _timeouts(
    rule: ResolvedRule, settings: TranslationSettings, warnings: list[str], owner: str
) -> tuple[str, str | None]:
    """The route's timeout (``timeouts.request``) and its attempts' (``timeouts.backendRequest``:
    each try until the backend's whole response, Envoy's ``per_try_timeout``; None: unbounded)."""
    seconds = settings.default_route_timeout_s
    per_try: str | None = None
    if rule.timeouts is not None:
        if rule.timeouts.request_seconds is not None:
            seconds = rule.timeouts.request_seconds
        backend = rule.timeouts.backend_request_seconds
        if backend:  # (0: no timeout)
            per_try = ec.duration(backend)
    warnings.extend(f"{owner}: {name} is not supported; ignored" for name in rule.ignored)
    return ec.duration(seconds), per_try


def _rule_fields(
    rule: ResolvedRule, match: HTTPRouteMatch, warnings: list[str], owner: str
) -> tuple[JsonDict, JsonDict]:
    """(route-action fields, route-level fields) of the rule's own filters under ``match``."""
    action: JsonDict = {}
    route_fields: JsonDict = {}
    for flt in rule.filters:
        if flt.request_header_modifier is not None:
            route_fields.update(header_modifier(flt.request_header_modifier, warnings, owner))
        if flt.response_header_modifier is not None:
            route_fields.update(header_modifier(flt.response_header_modifier, warnings, owner, response=True))
        if flt.cors is not None:
            route_fields["typed_per_filter_config"] = {CORS_FILTER: cors_policy(flt.cors)}
        if flt.url_rewrite is not None:
            if flt.url_rewrite.hostname is not None:
                action["host_rewrite_literal"] = flt.url_rewrite.hostname
            if flt.url_rewrite.path is not None:
                action.update(path_rewrite(match, flt.url_rewrite.path))
    return action, route_fields


def _envoy_routes(
    name: str,
    match: JsonDict,
    targets: tuple[Target, ...],
    rule_action: JsonDict,
    rule_route: JsonDict,
    timeout: str,
    retries: int,
    stream_idle_s: float = 0.0,
    per_try: str | None = None,
    rule_retry: HTTPRouteRetry | None = None,
) -> tuple[JsonDict, ...]:
    """The rule's route (a FailOpen pool: the picked one, then the fallback). With retries to the
    picker's fallbacks, a copy for streamed requests (the picker's ``x-kvgate-stream: 1``) comes
    first, whose attempts also end when the replica stays silent for ``stream_idle_s``. The rule's
    own ``retry`` adjusts either (``translate.retries``)."""
    follows = retries > 0 and any(target.retries for target in targets)
    if rule_retry is not None and rule_retry.attempts == 0:
        follows = False  # the rule asks for none

    def build(
        route_name: str, route_match: JsonDict, picked: bool, retry: JsonDict | None = None
    ) -> JsonDict:
        action, route_fields = cluster_action(targets, picked)
        route: JsonDict = {"name": route_name, "match": route_match}
        route["route"] = {**action, **rule_action, "timeout": timeout}
        policy = retry if retry is not None and picked else None
        if per_try is not None:  # (without retries: the single try's bound)
            policy = {**(policy or {}), "per_try_timeout": per_try}
        if policy is not None:
            route["route"]["retry_policy"] = policy
        route.update(_merge_headers(rule_route, route_fields))
        return route

    fail_open = not all(target.cluster == target.fallback_cluster for target in targets)
    picked_match = {**match, "dynamic_metadata": [_PICKED]} if fail_open else match
    routes: list[JsonDict] = []
    if follows and stream_idle_s > 0:
        stream_match = {**picked_match, "headers": [*picked_match.get("headers", []), _STREAMED]}
        stream_retry = with_rule_retry(ec.stream_retry_policy(retries, stream_idle_s), rule_retry)
        routes.append(build(f"{name}/stream", stream_match, True, stream_retry))
    retry = with_rule_retry(ec.pool_retry_policy(retries) if follows else None, rule_retry)
    routes.append(build(name, picked_match, True, retry))
    if fail_open:
        routes.append(build(f"{name}/fallback", match, False))
    return tuple(routes)


_OFF: JsonDict = {"@type": PER_ROUTE_TYPE, "disabled": True}

_GRPC_UNAVAILABLE: JsonDict = {
    "direct_response": {"status": 200},
    "response_headers_to_add": [
        {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
        for key, value in (("content-type", "application/grpc"), ("grpc-status", "14"),
                           ("grpc-message", "no valid backend for this route rule"))
    ],
}
"""A GRPCRoute rule without a valid backend: every call UNAVAILABLE (a trailers-only gRPC reply),
as the Gateway API asks, where an HTTPRoute's answers 500."""


def _websocket(backend: ResolvedBackend) -> bool:
    """Whether the backend's routes let WebSocket upgrades through: a Service port that speaks it
    (``appProtocol``), or a pool of kvgate's own picker, which admits realtime sessions alone
    (``extproc.upgrades``; another picker's would be handed a body that never ends)."""
    if backend.protocol is BackendProtocol.WEBSOCKET:
        return True
    pool = backend.pool
    return backend.kind is BackendKind.INFERENCE_POOL and pool is not None and not pool.picker.addresses


def route_groups(
    route: ResolvedRoute,
    settings: TranslationSettings,
    clusters: ClusterSet,
    warnings: list[str],
) -> list[RouteGroup]:
    """Every match of every rule of ``route`` as a :class:`RouteGroup` (without hostname precedence)."""
    groups: list[RouteGroup] = []
    age = route.creation_timestamp or "~"  # no timestamp: after every dated route
    grpc = route.kind == "GRPCRoute"
    for rule in route.rules:
        owner = f"{route.kind} {route.key} rule {rule.index}"
        targets: tuple[Target, ...] = ()
        if rule.redirect is None and not rule.answers_500:
            targets = rule_targets(rule, settings, clusters, warnings, owner, grpc=grpc)
        timeout, per_try = _timeouts(rule, settings, warnings, owner)
        mirrors = mirror_policies(rule, clusters) if rule.redirect is None and not rule.answers_500 else []
        auth = auth_filter(rule, clusters) if rule.redirect is None and not rule.answers_500 else None
        if rule.external_auth is not None and rule.redirect is not None:
            warnings.append(f"{owner}: ExternalAuth beside RequestRedirect: a redirect is answered to anyone")
        if rule.mirrors and rule.redirect is not None:
            warnings.append(f"{owner}: RequestMirror beside RequestRedirect: a redirect sends nothing "
                            "to copy; ignored")
        for index, match in enumerate(rule.matches):
            name = f"{route.name}/rule{rule.index}/match{index}"
            envoy = envoy_match(match)
            routes: Sequence[JsonDict]
            if rule.redirect is not None:
                routes = ({"name": name, "match": envoy, "redirect": redirect_action(match, rule.redirect),
                           **_merge_headers(_rule_fields(rule, match, warnings, owner)[1]),
                           "typed_per_filter_config": dict(EXT_PROC_DISABLED)},)
            elif rule.answers_500 and grpc:
                routes = ({"name": name, "match": envoy, **_GRPC_UNAVAILABLE,
                           "typed_per_filter_config": dict(EXT_PROC_DISABLED)},)
            elif rule.answers_500:
                routes = (
                    {
                        "name": name,
                        "match": envoy,
                        "direct_response": {"status": 500, "body": {"inline_string": _NO_BACKEND_BODY}},
                        "typed_per_filter_config": dict(EXT_PROC_DISABLED),
                    },
                )
            else:
                rule_action, rule_route = _rule_fields(rule, match, warnings, owner)
                if any(_websocket(b) for b in rule.valid_backends):
                    rule_action["upgrade_configs"] = [{"upgrade_type": "websocket"}]  # (this route only)
                if mirrors:
                    rule_action["request_mirror_policies"] = mirrors
                if auth is not None:
                    rule_route = _merge_headers(rule_route, {"typed_per_filter_config": auth[1]})
                routes = _envoy_routes(
                    name, envoy, targets, rule_action, rule_route, timeout, settings.pool_retries,
                    settings.stream_idle_retry_s, per_try, rule.retry,
                )
            if grpc:  # (a call's body is a stream of messages: the body-based router must not hold it)
                routes = tuple({**r, "typed_per_filter_config": {**r.get("typed_per_filter_config", {}),
                                                                  BBR_FILTER: _OFF}} for r in routes)
            key = (*match_precedence(match), age, route.name, rule.index, index)
            names = frozenset(header.name.lower() for header in match.headers)
            cors = any(flt.cors is not None for flt in rule.filters)
            groups.append(RouteGroup(key, tuple(routes), names, cors, (auth[0],) if auth is not None else ()))
    return groups
