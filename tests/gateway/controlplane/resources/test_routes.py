from __future__ import annotations

import pytest

from kvgate.gateway.controlplane.resources import (
    BackendKind,
    ConditionStatus,
    ConditionType,
    ObjectKey,
    ResourceRef,
    ValidatedConfig,
)
from tests.gateway.controlplane.resources.manifests import GATEWAY, base, build, pod, pool_ref, route

ROUTE = ResourceRef("HTTPRoute", "default", "r")
GW = ResourceRef("Gateway", "default", "gw")


def _route_condition(
    config: ValidatedConfig, kind: ConditionType, parent: ResourceRef = GW
) -> tuple[str, str]:
    cond = config.status.find(ROUTE, kind, parent=parent)
    assert cond is not None
    return str(cond.status), cond.reason


def test_weighted_split_across_two_pools() -> None:
    rules = f"    - backendRefs: [{pool_ref('pool-a', 70)}, {pool_ref('pool-b', 30)}]"
    config = build(*base(), route("r", rules))
    (resolved,) = config.routes
    (attachment,) = resolved.attachments
    assert (attachment.gateway, attachment.listener, attachment.port) == (
        ObjectKey("default", "gw"),
        "http",
        8080,
    )
    assert attachment.hostnames == ("*",)
    (rule,) = resolved.rules
    assert [(b.key.name, b.weight, b.valid, b.kind) for b in rule.backends] == [
        ("pool-a", 70, True, BackendKind.INFERENCE_POOL),
        ("pool-b", 30, True, BackendKind.INFERENCE_POOL),
    ]
    assert rule.backends[0].pool is not None
    assert rule.backends[0].pool.addresses == ("10.0.0.1:8000", "10.0.0.2:8000")
    assert not rule.answers_500
    assert _route_condition(config, ConditionType.ACCEPTED) == ("True", "Accepted")
    assert _route_condition(config, ConditionType.RESOLVED_REFS) == ("True", "ResolvedRefs")
    assert config.routes_for(ObjectKey("default", "gw"), "http") == config.routes


def test_missing_pool_is_backend_not_found_and_other_backends_keep_serving() -> None:
    rules = (
        f"    - backendRefs: [{pool_ref('pool-a', 1)}, {pool_ref('nope', 1)}]\n"
        f"    - matches: [{{headers: [{{name: x-model-version, value: canary}}]}}]\n"
        f"      backendRefs: [{pool_ref('missing')}]"
    )
    config = build(*base(), route("r", rules))
    assert _route_condition(config, ConditionType.ACCEPTED) == ("True", "Accepted")
    status, reason = _route_condition(config, ConditionType.RESOLVED_REFS)
    assert (status, reason) == ("False", "BackendNotFound")
    cond = config.status.find(ROUTE, ConditionType.RESOLVED_REFS)
    assert cond is not None
    assert "default/nope" in cond.message
    assert "default/missing" in cond.message
    first, second = config.routes[0].rules
    assert [b.valid for b in first.backends] == [True, False]
    assert not first.answers_500  # half of the traffic still goes to pool-a; the rest gets 500
    assert second.answers_500
    assert second.backends[0].kind is BackendKind.INVALID


def test_backend_kinds_and_services() -> None:
    service_with_annotation = """
apiVersion: v1
kind: Service
metadata:
  name: plain
  annotations: {kvgate.io/endpoints: "127.0.0.1:9001, 127.0.0.1:9000"}
spec:
  ports: [{port: 80}]
"""
    service_with_selector = """
apiVersion: v1
kind: Service
metadata: {name: selected}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"""
    rules = (
        "    - backendRefs: [{name: plain, port: 80}]\n"
        "    - backendRefs: [{name: selected, port: 80, weight: 3}]\n"
        "    - backendRefs: [{group: example.com, kind: Bucket, name: x}]\n"
        "    - backendRefs: [{name: plain}]\n"
        "    - backendRefs: [{name: selected, port: 81}]"
    )
    docs = (
        *base(),
        service_with_annotation,
        service_with_selector,
        pod("w", "web", "10.1.0.1"),
        route("r", rules),
    )
    config = build(*docs)
    plain, selected, bucket, no_port, bad_port = config.routes[0].rules
    assert plain.backends[0].kind is BackendKind.SERVICE
    assert plain.backends[0].addresses == ("127.0.0.1:9000", "127.0.0.1:9001")
    assert selected.backends[0].addresses == ("10.1.0.1:8080",)
    assert selected.backends[0].weight == 3
    assert bucket.answers_500
    assert no_port.answers_500
    assert bad_port.answers_500
    cond = config.status.find(ROUTE, ConditionType.RESOLVED_REFS)
    assert cond is not None
    assert cond.reason == "InvalidKind"  # the first problem found names the reason
    assert "needs a port" in cond.message
    assert "no port 81" in cond.message


def test_a_named_target_port_is_each_pods_container_port_of_that_name() -> None:
    # As Kubernetes resolves it: per pod (two pods, two numbers), a pod without the name is no endpoint.
    service = """
apiVersion: v1
kind: Service
metadata: {name: named}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: http}]
"""

    def pod_with_ports(name: str, ip: str, ports: str) -> str:
        return pod(name, "web", ip) + f"spec:\n  containers: [{{name: server, ports: {ports}}}]\n"

    docs = (
        *base(),
        service,
        pod_with_ports("a", "10.1.0.1", "[{name: http, containerPort: 8000}, {name: m, containerPort: 99}]"),
        pod_with_ports("b", "10.1.0.2", "[{name: http, containerPort: 8080}]"),
        pod_with_ports("c", "10.1.0.3", "[{name: grpc, containerPort: 9000}]"),
        pod_with_ports("d", "10.1.0.4", "[{name: http, containerPort: 8000, protocol: UDP}]"),
        route("r", "    - backendRefs: [{name: named, port: 80}]"),
    )
    config = build(*docs)
    backend = config.routes[0].rules[0].backends[0]
    assert backend.addresses == ("10.1.0.1:8000", "10.1.0.2:8080")
    assert not config.routes[0].rules[0].answers_500
    cond = config.status.find(ROUTE, ConditionType.RESOLVED_REFS)
    assert cond is not None
    assert cond.status == "True"


def test_cross_namespace_backend_needs_a_reference_grant() -> None:
    other_pool = base()[2].replace("{name: pool-a}", "{name: pool-a, namespace: models}")
    rules = (
        "    - backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, "
        "name: pool-a, namespace: models}]"
    )
    config = build(*base(), other_pool, route("r", rules))
    assert _route_condition(config, ConditionType.RESOLVED_REFS) == ("False", "RefNotPermitted")
    grant = """
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: allow, namespace: models}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: default}]
  to: [{group: inference.networking.k8s.io, kind: InferencePool}]
"""
    config = build(*base(), other_pool, grant, route("r", rules))
    assert _route_condition(config, ConditionType.RESOLVED_REFS) == ("True", "ResolvedRefs")
    assert config.routes[0].rules[0].backends[0].key == ObjectKey("models", "pool-a")


def test_parent_problems() -> None:
    rules = f"    - backendRefs: [{pool_ref('pool-a')}]"
    missing = ResourceRef("Gateway", "default", "ghost")
    config = build(*base(), route("r", rules, parents="[{name: ghost}]"))
    assert _route_condition(config, ConditionType.ACCEPTED, missing) == ("False", "NoMatchingParent")
    assert config.routes == ()
    config = build(*base(), route("r", rules, parents="[{name: gw, sectionName: https}]"))
    assert _route_condition(config, ConditionType.ACCEPTED) == ("False", "NoMatchingParent")
    config = build(*base(), route("r", rules, parents="[{name: gw, port: 9999}]"))
    assert _route_condition(config, ConditionType.ACCEPTED) == ("False", "NoMatchingParent")
    config = build(*base(), route("r", rules, parents="[]"))
    (entry,) = config.status.for_resource(ROUTE)
    assert entry.get(ConditionType.ACCEPTED) is not None
    assert entry.parent is None


def test_one_parent_accepts_and_another_rejects() -> None:
    rules = f"    - backendRefs: [{pool_ref('pool-a')}]"
    config = build(*base(), route("r", rules, parents="[{name: gw}, {name: ghost}]"))
    assert _route_condition(config, ConditionType.ACCEPTED) == ("True", "Accepted")
    ghost = ResourceRef("Gateway", "default", "ghost")
    assert _route_condition(config, ConditionType.ACCEPTED, ghost) == ("False", "NoMatchingParent")
    assert len(config.routes) == 1


def test_namespaces_allowed_by_listeners() -> None:
    rules = f"    - backendRefs: [{pool_ref('pool-a')}]"
    parents = "[{name: gw, namespace: default}]"
    other = ResourceRef("HTTPRoute", "team", "r")
    config = build(*base(), route("r", rules, parents=parents, namespace="team"))
    cond = config.status.find(other, ConditionType.ACCEPTED)
    assert cond is not None
    assert (cond.status, cond.reason) == (ConditionStatus.FALSE, "NotAllowedByListeners")
    open_gateway = GATEWAY.replace(
        "protocol: HTTP}", "protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}"
    )
    config = build(open_gateway, *base()[1:], route("r", rules, parents=parents, namespace="team"))
    cond = config.status.find(other, ConditionType.ACCEPTED)
    assert cond is not None
    assert cond.is_true
    selector_gateway = GATEWAY.replace(
        "protocol: HTTP}",
        "protocol: HTTP, allowedRoutes: {namespaces: {from: Selector, "
        "selector: {matchLabels: {shared: 'yes'}}}}}",
    )
    namespace = "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {shared: 'yes'}}\n"
    config = build(
        selector_gateway, *base()[1:], namespace, route("r", rules, parents=parents, namespace="team")
    )
    cond = config.status.find(other, ConditionType.ACCEPTED)
    assert cond is not None
    assert cond.is_true


@pytest.mark.parametrize(("selector", "team_labels", "accepted"), [
    ("{matchExpressions: [{key: shared, operator: In, values: ['yes']}]}", "{shared: 'yes'}", True),
    # the expressions are the whole selector: left unread, they selected every namespace
    ("{matchExpressions: [{key: shared, operator: In, values: ['yes']}]}", "{shared: 'no'}", False),
    ("{matchExpressions: [{key: shared, operator: Exists}]}", "{}", False),
    ("{matchLabels: {env: prod}, matchExpressions: [{key: tier, operator: NotIn, values: [edge]}]}",
     "{env: prod, tier: edge}", False),
    ("{matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [team]}]}", "{}", True),
    ("{matchExpressions: [{key: shared, operator: Maybe}]}", "{shared: 'yes'}", False),  # not a selector
    ("{}", "{}", True),  # the empty selector: every namespace (Kubernetes' rule)
    (None, "{shared: 'yes'}", False),  # from: Selector without one: none
])
def test_namespace_selector_expressions(selector: str | None, team_labels: str, accepted: bool) -> None:
    rules = f"    - backendRefs: [{pool_ref('pool-a')}]"
    parents = "[{name: gw, namespace: default}]"
    field = f", selector: {selector}" if selector is not None else ""
    gateway = GATEWAY.replace(
        "protocol: HTTP}", f"protocol: HTTP, allowedRoutes: {{namespaces: {{from: Selector{field}}}}}}}"
    )
    namespace = f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: team, labels: {team_labels}}}\n"
    config = build(gateway, *base()[1:], namespace, route("r", rules, parents=parents, namespace="team"))
    cond = config.status.find(ResourceRef("HTTPRoute", "team", "r"), ConditionType.ACCEPTED)
    assert cond is not None
    assert cond.is_true is accepted, cond


def test_hostnames_intersect_with_the_listener() -> None:
    gateway = GATEWAY.replace("protocol: HTTP}", "protocol: HTTP, hostname: '*.example.com'}")
    rules = f"    - backendRefs: [{pool_ref('pool-a')}]"
    ok = route("r", rules, extra="  hostnames: [api.example.com, other.org, '*.example.com']\n")
    config = build(gateway, *base()[1:], ok)
    assert config.routes[0].attachments[0].hostnames == ("api.example.com", "*.example.com")
    bad = route("r", rules, extra="  hostnames: [other.org]\n")
    config = build(gateway, *base()[1:], bad)
    assert _route_condition(config, ConditionType.ACCEPTED) == ("False", "NoMatchingListenerHostname")


def test_unsupported_filters_and_bad_regex_reject_the_route() -> None:
    extension = (
        "    - filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Thing, name: x}}]\n"
        f"      backendRefs: [{pool_ref('pool-a')}]"
    )
    config = build(*base(), route("r", extension))
    assert _route_condition(config, ConditionType.ACCEPTED) == ("False", "UnsupportedValue")
    assert config.routes == ()
    redirect = "{type: RequestRedirect, requestRedirect: {hostname: a.com}}"  # names no backend
    on_backend = f"    - backendRefs: [{{name: svc, port: 80, filters: [{redirect}]}}]"
    config = build(*base(), route("r", on_backend))
    assert _route_condition(config, ConditionType.ACCEPTED) == ("False", "UnsupportedValue")
    config = build(*base(), route("r", f"    - filters: [{redirect}]"))  # on the rule: no backend needed
    assert _route_condition(config, ConditionType.ACCEPTED) == ("True", "Accepted")
    assert config.routes[0].rules[0].redirect is not None
    assert not config.routes[0].rules[0].answers_500
    regex = (
        "    - matches: [{path: {type: RegularExpression, value: '/v1/(chat'}}]\n"
        f"      backendRefs: [{pool_ref('pool-a')}]"
    )
    config = build(*base(), route("r", regex))
    assert _route_condition(config, ConditionType.ACCEPTED) == ("False", "UnsupportedValue")
    for python_only in (r"/v1/(?!embeddings)", r"(a)\1"):  # valid for Python's re, not for RE2
        header = f"{{type: RegularExpression, name: x-a, value: '{python_only}'}}"
        regex = (
            f"    - matches: [{{headers: [{header}]}}]\n"
            f"      backendRefs: [{pool_ref('pool-a')}]"
        )
        config = build(*base(), route("r", regex))
        assert _route_condition(config, ConditionType.ACCEPTED) == ("False", "UnsupportedValue"), python_only
        assert config.routes == ()


def test_request_mirrors_resolve_their_backends_and_shares() -> None:
    service = """
apiVersion: v1
kind: Service
metadata:
  name: shadow
  annotations: {kvgate.io/endpoints: "10.2.0.1:8000"}
spec:
  ports: [{port: 8000}]
"""
    rules = (
        "    - filters:\n"
        "        - type: RequestMirror\n"
        "          requestMirror: {backendRef: {name: shadow, port: 8000}, percent: 25}\n"
        "        - type: RequestMirror\n"
        f"          requestMirror: {{backendRef: {pool_ref('pool-a')},\n"
        "                          fraction: {numerator: 1, denominator: 3}}\n"
        "        - {type: RequestMirror, requestMirror: {backendRef: {name: gone, port: 80}}}\n"
        f"      backendRefs: [{pool_ref('pool-a')}]"
    )
    config = build(*base(), service, route("r", rules))
    assert _route_condition(config, ConditionType.ACCEPTED) == ("True", "Accepted")
    rule = config.routes[0].rules[0]
    assert not rule.answers_500  # a mirror's backend never stops the rule serving
    shadow, pool, gone = rule.mirrors
    assert (shadow.backend.valid, shadow.millionths) == (True, 250_000)
    assert shadow.backend.addresses == ("10.2.0.1:8000",)
    assert (pool.backend.valid, pool.millionths) == (True, 333_333)
    assert (gone.backend.valid, gone.millionths) == (False, 1_000_000)
    assert _route_condition(config, ConditionType.RESOLVED_REFS) == ("False", "BackendNotFound")


def test_an_external_auth_that_cannot_be_resolved_lets_nothing_through() -> None:
    auth = ("    - filters:\n"
            "        - type: ExternalAuth\n"
            "          externalAuth: {protocol: HTTP, backendRef: {name: gone, port: 80}}\n"
            f"      backendRefs: [{pool_ref('pool-a')}]")
    config = build(*base(), route("r", auth))
    rule = config.routes[0].rules[0]
    assert rule.external_auth is not None
    assert not rule.external_auth.backend.valid
    assert rule.answers_500  # the rule answers 500: never served unchecked
    assert _route_condition(config, ConditionType.RESOLVED_REFS) == ("False", "BackendNotFound")
    on_pool = ("    - filters:\n"
               "        - type: ExternalAuth\n"
               f"          externalAuth: {{protocol: GRPC, backendRef: {pool_ref('pool-a')}}}\n"
               f"      backendRefs: [{pool_ref('pool-a')}]")
    config = build(*base(), route("r", on_pool))
    assert config.routes[0].rules[0].answers_500
    assert _route_condition(config, ConditionType.RESOLVED_REFS) == ("False", "InvalidKind")


def test_matches_filters_and_timeouts_reach_the_resolved_rule() -> None:
    rules = f"""    - matches:
        - path: {{type: Exact, value: /v1/chat/completions}}
          method: POST
          headers:
            - {{name: X-Gateway-Model-Name, value: llama}}
            - {{type: RegularExpression, name: x-tier, value: 'gold|silver'}}
          queryParams: [{{name: debug, value: "1"}}]
      filters:
        - type: RequestHeaderModifier
          requestHeaderModifier:
            set: [{{name: x-pool, value: a}}]
            add: [{{name: x-added, value: v}}]
            remove: [x-drop]
        - type: URLRewrite
          urlRewrite:
            hostname: backend.local
            path: {{type: ReplaceFullPath, replaceFullPath: /v1/completions}}
      timeouts: {{request: 30s, backendRequest: 10s}}
      backendRefs: [{pool_ref("pool-a")}]
    - backendRefs: [{pool_ref("pool-b")}]"""
    config = build(*base(), route("r", rules))
    first, second = config.routes[0].rules
    (match,) = first.matches
    assert (match.path.type, match.path.value, match.method) == ("Exact", "/v1/chat/completions", "POST")
    assert [(h.type, h.name, h.value) for h in match.headers] == [
        ("Exact", "X-Gateway-Model-Name", "llama"),
        ("RegularExpression", "x-tier", "gold|silver"),
    ]
    assert match.query_params[0].value == "1"
    modifier = first.filters[0].request_header_modifier
    assert modifier is not None
    assert modifier.remove == ("x-drop",)
    rewrite = first.filters[1].url_rewrite
    assert rewrite is not None
    assert rewrite.path is not None
    assert rewrite.path.replace_full_path == "/v1/completions"
    assert first.timeouts is not None
    assert first.timeouts.backend_request_seconds == 10.0
    assert (second.matches[0].path.type, second.matches[0].path.value) == ("PathPrefix", "/")
    assert second.backends[0].key.name == "pool-b"


def test_several_routes_on_one_listener() -> None:
    one = route("r", f"    - backendRefs: [{pool_ref('pool-a')}]")
    two = route("r2", f"    - backendRefs: [{pool_ref('pool-b')}]")
    config = build(*base(), one, two)
    assert [r.key.name for r in config.routes_for(ObjectKey("default", "gw"), "http")] == ["r", "r2"]
