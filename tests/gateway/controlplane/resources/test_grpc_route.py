"""GRPCRoute: its CEL rules at load, its matches as paths, its validation as the HTTPRoute it amounts
to (told apart by kind: listeners' allowed kinds, ReferenceGrants, Services in HTTP/2, its filters),
and an HTTPRoute and a GRPCRoute sharing a listener's hostnames (the older accepted)."""

from __future__ import annotations

import pytest

from kvgate.gateway.controlplane.kubernetes.status import desired_statuses
from kvgate.gateway.controlplane.resources import (
    BackendKind,
    ConditionType,
    ObjectKey,
    ResourceRef,
    ValidatedConfig,
)
from kvgate.gateway.controlplane.resources.loader import ManifestError
from kvgate.gateway.controlplane.resources.resolved import BackendProtocol
from tests.gateway.controlplane.resources.manifests import GATEWAY, base, build, load, pool_ref, route

GW = ResourceRef("Gateway", "default", "gw")


def service(name: str, port: int = 8001, app_protocol: str | None = None, namespace: str = "default") -> str:
    protocol = f", appProtocol: {app_protocol}" if app_protocol else ""
    return f"""
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {namespace}, annotations: {{kvgate.io/endpoints: "10.9.0.1:{port}"}}}}
spec:
  ports: [{{port: {port}{protocol}}}]
"""


def grpc_route(
    name: str,
    rules: str,
    *,
    hostnames: str = "[]",
    parents: str = "[{name: gw}]",
    namespace: str = "default",
    created: str | None = None,
) -> str:
    stamp = f", creationTimestamp: '{created}'" if created else ""
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: {name}, namespace: {namespace}{stamp}}}
spec:
  parentRefs: {parents}
  hostnames: {hostnames}
  rules:
{rules}
"""


def accepted(config: ValidatedConfig, kind: str, name: str) -> tuple[str, str]:
    cond = config.status.find(ResourceRef(kind, "default", name), ConditionType.ACCEPTED, parent=GW)
    assert cond is not None
    return str(cond.status), cond.reason


@pytest.mark.parametrize(
    ("match", "error"),
    [
        ("{method: {type: Exact}}", "One or both of 'service' or 'method'"),
        ("{method: {service: 'not/a.service', method: M}}", "service 'not/a.service'"),
        ("{method: {service: a.B, method: 'M/x'}}", "method 'M/x'"),
    ],
)
def test_method_matches_follow_the_crd(match: str, error: str) -> None:
    with pytest.raises(ManifestError, match=error):
        load(grpc_route("g", f"    - matches: [{match}]"))


def test_filters_once_and_rule_names_unique() -> None:
    twice = (
        "    - filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: a, value: b}]}},"
        " {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: c, value: d}]}}]"
    )
    with pytest.raises(ManifestError, match="cannot be repeated"):
        load(grpc_route("g", twice))
    with pytest.raises(ManifestError, match="unique"):
        load(grpc_route("g", "    - name: a\n    - name: a"))


def test_method_matches_become_paths() -> None:
    rules = """    - matches:
        - method: {service: pkg.Svc, method: Call}
        - method: {service: pkg.Svc}
        - method: {method: Check}
        - method: {type: RegularExpression, service: "pkg\\\\..*", method: "Get.*"}
        - headers: [{name: x-tenant, value: a}]"""
    (grpc,) = load(grpc_route("g", rules)).grpc_routes
    as_http = grpc.as_http_route()
    assert as_http.kind == "GRPCRoute"
    paths = [(m.path.type, m.path.value) for m in as_http.spec.rules[0].matches]
    assert paths == [
        ("Exact", "/pkg.Svc/Call"),
        ("PathPrefix", "/pkg.Svc"),
        ("RegularExpression", "/[^/]+/Check"),
        ("RegularExpression", "/(pkg\\..*)/(Get.*)"),
        ("PathPrefix", "/"),
    ]
    assert as_http.spec.rules[0].matches[4].headers[0].name == "x-tenant"


def test_a_grpc_route_is_accepted_and_its_services_speak_http2() -> None:
    rules = """    - name: infer
      matches: [{method: {service: inference.GRPCInferenceService}}]
      backendRefs: [{name: triton, port: 8001, weight: 3}, {name: h2c, port: 8001}]"""
    config = build(
        *base(), service("triton"), service("h2c", app_protocol="kubernetes.io/h2c"), grpc_route("g", rules)
    )
    assert accepted(config, "GRPCRoute", "g") == ("True", "Accepted")
    (resolved,) = config.routes
    assert (resolved.kind, resolved.name) == ("GRPCRoute", "GRPCRoute:default/g")
    (rule,) = resolved.rules
    assert rule.name == "infer"
    assert [(b.key.name, b.weight, b.protocol) for b in rule.backends] == [
        ("triton", 3, BackendProtocol.H2C),
        ("h2c", 1, BackendProtocol.H2C),
    ]
    cond = config.status.find(
        ResourceRef("GRPCRoute", "default", "g"), ConditionType.RESOLVED_REFS, parent=GW
    )
    assert cond is not None
    assert cond.is_true


def test_what_a_grpc_route_cannot_use() -> None:
    """An InferencePool backend (InvalidKind: its share UNAVAILABLE), a WebSocket port
    (UnsupportedProtocol), and a filter the GRPCRoute API has not (the route not Accepted)."""
    rules = f"""    - matches: [{{method: {{service: a.A}}}}]
      backendRefs: [{pool_ref("pool-a")}]
    - matches: [{{method: {{service: b.B}}}}]
      backendRefs: [{{name: ws, port: 8001}}]"""
    config = build(*base(), service("ws", app_protocol="kubernetes.io/ws"), grpc_route("g", rules))
    first, second = config.routes[0].rules
    assert first.backends[0].kind is BackendKind.INVALID
    assert first.answers_500
    assert "InferencePools are routed from HTTPRoutes" in first.backends[0].reason
    assert not second.backends[0].valid
    cond = config.status.find(
        ResourceRef("GRPCRoute", "default", "g"), ConditionType.RESOLVED_REFS, parent=GW
    )
    assert cond is not None
    assert (str(cond.status), cond.reason) == ("False", "InvalidKind")
    assert "appProtocol 'kubernetes.io/ws'" in cond.message
    rewrite = """    - filters: [{type: URLRewrite, urlRewrite: {hostname: x.example.com}}]
      backendRefs: [{name: ws, port: 8001}]"""
    config = build(*base(), service("ws"), grpc_route("g", rewrite))
    assert accepted(config, "GRPCRoute", "g") == ("False", "UnsupportedValue")


def test_listeners_allowed_kinds_and_reference_grants_name_the_grpc_route() -> None:
    http_only = GATEWAY.replace(
        "{name: http, port: 8080, protocol: HTTP}",
        "{name: http, port: 8080, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}]}}",
    )
    rules = "    - backendRefs: [{name: svc, namespace: other, port: 8001}]"
    config = build(http_only, service("svc", namespace="other"), grpc_route("g", rules))
    assert accepted(config, "GRPCRoute", "g") == ("False", "NotAllowedByListeners")
    grant = """
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: grant, namespace: other}}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: {kind}, namespace: default}}]
  to: [{{group: "", kind: Service}}]
"""
    for kind, resolved in (("HTTPRoute", False), ("GRPCRoute", True)):
        config = build(
            GATEWAY, service("svc", namespace="other"), grant.format(kind=kind), grpc_route("g", rules)
        )
        cond = config.status.find(
            ResourceRef("GRPCRoute", "default", "g"), ConditionType.RESOLVED_REFS, parent=GW
        )
        assert cond is not None
        assert cond.is_true is resolved, kind


def test_an_http_route_and_a_grpc_route_sharing_hostnames_the_older_is_accepted() -> None:
    http = route("h", f"    - backendRefs: [{pool_ref('pool-a')}]", extra="  hostnames: [api.example.com]\n")
    http_dated = http.replace(
        "metadata: {name: h, namespace: default}",
        "metadata: {name: h, namespace: default, creationTimestamp: '2026-01-02T00:00:00Z'}",
    )
    grpc_rules = "    - backendRefs: [{name: svc, port: 8001}]"
    older_grpc = grpc_route("g", grpc_rules, hostnames="['*.example.com']", created="2026-01-01T00:00:00Z")
    config = build(*base(), service("svc"), http_dated, older_grpc)
    assert accepted(config, "GRPCRoute", "g") == ("True", "Accepted")
    assert accepted(config, "HTTPRoute", "h") == ("False", "Conflicted")
    assert [r.kind for r in config.routes] == ["GRPCRoute"]
    assert config.routes_for(ObjectKey("default", "gw"), "http")[0].kind == "GRPCRoute"
    newer_grpc = grpc_route("g", grpc_rules, hostnames="['*.example.com']", created="2026-01-03T00:00:00Z")
    config = build(*base(), service("svc"), http_dated, newer_grpc)
    assert accepted(config, "HTTPRoute", "h") == ("True", "Accepted")
    status, reason = accepted(config, "GRPCRoute", "g")
    assert (status, reason) == ("False", "Conflicted")
    apart = grpc_route("g", grpc_rules, hostnames="[grpc.example.org]", created="2026-01-01T00:00:00Z")
    config = build(*base(), service("svc"), http_dated, apart)
    assert accepted(config, "HTTPRoute", "h") == accepted(config, "GRPCRoute", "g") == ("True", "Accepted")


def test_the_status_written_to_the_cluster() -> None:
    """The GRPCRoute's parents (kvgate's controllerName) and each listener's supportedKinds and
    attachedRoutes counting it."""
    rules = "    - backendRefs: [{name: svc, port: 8001}]"
    config = build(*base(), service("svc"), grpc_route("g", rules))
    written = desired_statuses(config.status)
    (parent,) = written[ResourceRef("GRPCRoute", "default", "g")]["parents"]
    assert parent["controllerName"] == "kvgate.io/gateway-controller"
    assert parent["parentRef"]["name"] == "gw"
    assert [c["type"] for c in parent["conditions"]] == ["Accepted", "ResolvedRefs"]
    (listener,) = written[GW]["listeners"]
    assert [kind["kind"] for kind in listener["supportedKinds"]] == ["HTTPRoute", "GRPCRoute"]
    assert listener["attachedRoutes"] == 1


def test_supported_kinds_follow_the_listeners_allowed_kinds() -> None:
    """A listener naming HTTPRoute alone takes HTTPRoutes alone; one naming a kind kvgate does not
    serve besides says so (ResolvedRefs False, InvalidRouteKinds) and takes the others."""
    listeners = """    - {name: http, port: 8080, protocol: HTTP, allowedRoutes: {kinds: [{kind: HTTPRoute}]}}
    - {name: mixed, port: 8081, protocol: HTTP, allowedRoutes: {kinds: [{kind: GRPCRoute}, {kind: TCPRoute}]}}
    - {name: any, port: 8082, protocol: HTTP}"""
    gateway = GATEWAY.replace("    - {name: http, port: 8080, protocol: HTTP}", listeners)
    config = build(gateway)
    written = desired_statuses(config.status)[GW]["listeners"]
    kinds = {listener["name"]: [k["kind"] for k in listener["supportedKinds"]] for listener in written}
    assert kinds == {"http": ["HTTPRoute"], "mixed": ["GRPCRoute"], "any": ["HTTPRoute", "GRPCRoute"]}
    refs = {listener["name"]: next(c for c in listener["conditions"] if c["type"] == "ResolvedRefs")
            for listener in written}
    assert (refs["mixed"]["status"], refs["mixed"]["reason"]) == ("False", "InvalidRouteKinds")
    assert "TCPRoute" in refs["mixed"]["message"]
    assert refs["http"]["status"] == refs["any"]["status"] == "True"


def test_attached_routes_are_counted_per_listener() -> None:
    """Two listeners: an older HTTPRoute on one of them (sectionName) keeps it; a GRPCRoute on both
    loses that one to it, stays accepted by the other, and counts there alone."""
    listeners = """    - {name: http, port: 8080, protocol: HTTP}
    - {name: other, port: 8081, protocol: HTTP}"""
    gateway = GATEWAY.replace("    - {name: http, port: 8080, protocol: HTTP}", listeners)
    backend = f"    - backendRefs: [{pool_ref('pool-a')}]"
    on_other = route("h", backend, parents="[{name: gw, sectionName: other}]").replace(
        "metadata: {name: h, namespace: default}",
        "metadata: {name: h, namespace: default, creationTimestamp: '2025-01-01T00:00:00Z'}")
    rules = "    - backendRefs: [{name: svc, port: 8001}]"
    everywhere = grpc_route("g", rules, created="2026-01-01T00:00:00Z")
    config = build(gateway, *base()[1:], service("svc"), on_other, everywhere)
    assert accepted(config, "HTTPRoute", "h") == accepted(config, "GRPCRoute", "g") == ("True", "Accepted")
    (grpc,) = [r for r in config.routes if r.kind == "GRPCRoute"]
    assert [a.listener for a in grpc.attachments] == ["http"]
    counted = {listener["name"]: listener["attachedRoutes"]
               for listener in desired_statuses(config.status)[GW]["listeners"]}
    assert counted == {"http": 1, "other": 1}
