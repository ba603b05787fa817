from __future__ import annotations

from pathlib import Path

from kvgate.gateway.controlplane.resources import (
    ConditionStatus,
    ConditionType,
    ObjectKey,
    ResourceRef,
    ValidationOptions,
    WeightedModel,
    load_directory,
    validate,
)
from tests.gateway.controlplane.resources.manifests import (
    EPP_SERVICE,
    GATEWAY,
    base,
    build,
    load,
    pod,
    pool,
    pool_ref,
    route,
)

FIXTURES = Path(__file__).parent / "fixtures" / "quickstart"
POOL = ResourceRef("InferencePool", "default", "vllm-llama3-8b-instruct")
GW = ResourceRef("Gateway", "default", "inference-gateway")


def test_quickstart_end_to_end() -> None:
    config = validate(load_directory(FIXTURES))
    (resolved_pool,) = config.pools
    # Two pods are Running and Ready; one not Ready, one Pending, one in another namespace.
    assert resolved_pool.addresses == ("10.0.0.11:8000", "10.0.0.12:8000")
    assert resolved_pool.id == "default/vllm-llama3-8b-instruct"
    assert {e.pool for e in resolved_pool.endpoints} == {"default/vllm-llama3-8b-instruct"}
    assert resolved_pool.endpoints[0].name == "vllm-llama3-8b-instruct-7d9f8c-abcde"
    assert resolved_pool.picker.port == 9002
    assert resolved_pool.picker.addresses == ()  # no picker pods in the manifests: kvgate's own
    for kind in (ConditionType.ACCEPTED, ConditionType.RESOLVED_REFS):
        cond = config.status.find(POOL, kind, parent=GW)
        assert cond is not None
        assert cond.is_true, cond
        assert cond.observed_generation == 3
    accepted = config.status.find(GW, ConditionType.ACCEPTED)
    programmed = config.status.find(GW, ConditionType.PROGRAMMED)
    assert accepted is not None
    assert accepted.is_true
    assert programmed is not None
    assert programmed.is_true
    assert not config.status.problems
    assert config.status.to_json()[0]["conditions"][0]["observedGeneration"] == 1
    assert len(config.routes) == 1


def test_pool_endpoints_are_pods_times_target_ports() -> None:
    config = build(
        GATEWAY,
        EPP_SERVICE,
        pool("multi", ports="[{number: 8000}, {number: 8001}]"),
        pod("m-1", "multi", "10.2.0.1"),
        pod("m-2", "multi", "fd00::2"),
        pod("m-3", "multi", "10.2.0.3", ready=False),
        pod("m-4", "other", "10.2.0.4"),
        pod("m-5", "multi", "10.2.0.5", namespace="elsewhere"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: handwritten, labels: {app: multi}}\n"
        "status: {podIP: 10.2.0.6}\n",
    )
    (resolved,) = config.pools
    assert resolved.addresses == (
        "10.2.0.6:8000",
        "10.2.0.6:8001",
        "10.2.0.1:8000",
        "10.2.0.1:8001",
        "[fd00::2]:8000",
        "[fd00::2]:8001",
    )
    assert resolved.target_ports == (8000, 8001)


def test_pool_selector_expressions() -> None:
    """A pool's selector with matchExpressions (a leniency: the Inference Extension's v1 has
    matchLabels alone) selects as a Kubernetes label selector does."""
    selector = (
        "selector: {matchLabels: {app: multi}, "
        "matchExpressions: [{key: tier, operator: NotIn, values: [canary]}]}"
    )
    config = build(
        GATEWAY,
        EPP_SERVICE,
        pool("multi").replace("selector: {matchLabels: {app: multi}}", selector),
        pod("m-1", "multi", "10.2.0.1"),
        pod("m-2", "multi", "10.2.0.2").replace("labels: {app: multi}", "labels: {app: multi, tier: canary}"),
        pod("m-3", "multi", "10.2.0.3").replace("labels: {app: multi}", "labels: {app: multi, tier: main}"),
    )
    (resolved,) = config.pools
    assert resolved.addresses == ("10.2.0.1:8000", "10.2.0.3:8000")


def test_unreferenced_pool_is_pending() -> None:
    config = build(*base())
    ref = ResourceRef("InferencePool", "default", "pool-a")
    (entry,) = config.status.for_resource(ref)
    accepted = entry.get(ConditionType.ACCEPTED)
    assert accepted is not None
    assert (accepted.status, accepted.reason) == (ConditionStatus.UNKNOWN, "Pending")
    assert len(config.pools) == 2


def test_invalid_picker_reference() -> None:
    rules = f"    - backendRefs: [{pool_ref('broken')}]"
    config = build(*base(), pool("broken", epp="no-such-epp"), route("r", rules))
    ref = ResourceRef("InferencePool", "default", "broken")
    cond = config.status.find(ref, ConditionType.RESOLVED_REFS)
    assert cond is not None
    assert (cond.status, cond.reason) == (ConditionStatus.FALSE, "InvalidExtensionRef")
    assert "no-such-epp" in cond.message
    assert config.pool(ObjectKey("default", "broken")) is None
    (rule,) = config.routes[0].rules
    assert rule.answers_500
    assert "InvalidExtensionRef" not in rule.backends[0].reason
    assert "no-such-epp" in rule.backends[0].reason
    # The reference itself resolved, so the route's own ResolvedRefs stays True.
    route_cond = config.status.find(ResourceRef("HTTPRoute", "default", "r"), ConditionType.RESOLVED_REFS)
    assert route_cond is not None
    assert route_cond.is_true
    # Without requiring a Service, a missing one means kvgate's in-process picker.
    lenient = validate(
        load(*base(), pool("broken", epp="no-such-epp")), ValidationOptions(require_picker_service=False)
    )
    found = lenient.pool(ObjectKey("default", "broken"))
    assert found is not None
    assert found.picker.addresses == ()


def test_picker_service_with_wrong_port_or_kind() -> None:
    wrong_port = pool("p").replace("number: 9002", "number: 9999")
    config = build(GATEWAY, EPP_SERVICE, wrong_port)
    cond = config.status.find(ResourceRef("InferencePool", "default", "p"), ConditionType.RESOLVED_REFS)
    assert cond is not None
    assert cond.reason == "InvalidExtensionRef"
    assert "9999" in cond.message
    wrong_kind = pool("p").replace("{name: epp,", "{kind: Deployment, name: epp,")
    config = build(GATEWAY, EPP_SERVICE, wrong_kind)
    cond = config.status.find(ResourceRef("InferencePool", "default", "p"), ConditionType.RESOLVED_REFS)
    assert cond is not None
    assert cond.reason == "InvalidExtensionRef"
    assert "Deployment" in cond.message


def test_external_picker_addresses_from_annotation() -> None:
    epp = EPP_SERVICE.replace(
        "metadata: {name: epp}", "metadata: {name: epp, annotations: {kvgate.io/endpoints: '127.0.0.1:9002'}}"
    )
    config = build(GATEWAY, epp, pool("p"))
    (resolved,) = config.pools
    assert resolved.picker.addresses == ("127.0.0.1:9002",)
    assert resolved.picker.failure_mode == "FailOpen"


def test_pool_rejected_by_every_route_is_http_route_not_accepted() -> None:
    rules = f"    - backendRefs: [{pool_ref('pool-a')}]"
    config = build(*base(), route("r", rules, parents="[{name: gw, sectionName: nope}]"))
    cond = config.status.find(ResourceRef("InferencePool", "default", "pool-a"), ConditionType.ACCEPTED)
    assert cond is not None
    assert (cond.status, cond.reason) == (ConditionStatus.FALSE, "HTTPRouteNotAccepted")


def test_gateway_and_listener_conditions() -> None:
    gateway = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: kvgate
  listeners:
    - {name: http, port: 8080, protocol: HTTP}
    - {name: dup, port: 8080, protocol: HTTP}
    - {name: tls, port: 8443, protocol: TLS}
    - {name: api, port: 8080, protocol: HTTP, hostname: api.example.com}
"""
    config = build(gateway)
    gw = ResourceRef("Gateway", "default", "gw")
    by_section = {entry.section: entry for entry in config.status.for_resource(gw)}
    top = by_section[None].get(ConditionType.ACCEPTED)
    assert top is not None
    assert (top.status, top.reason) == (ConditionStatus.TRUE, "ListenersNotValid")
    dup_accepted = by_section["dup"].get(ConditionType.ACCEPTED)
    dup_conflicted = by_section["dup"].get(ConditionType.CONFLICTED)
    assert dup_accepted is not None
    assert dup_accepted.reason == "HostnameConflict"
    assert dup_conflicted is not None
    assert dup_conflicted.is_true
    tls = by_section["tls"].get(ConditionType.ACCEPTED)
    assert tls is not None
    assert (tls.status, tls.reason) == (ConditionStatus.FALSE, "UnsupportedProtocol")
    assert by_section["api"].healthy
    refs = by_section["http"].get(ConditionType.RESOLVED_REFS)  # on every listener, as the API lists them
    assert refs is not None
    assert refs.is_true
    (resolved,) = config.gateways
    assert [listener.name for listener in resolved.listeners] == ["http", "api"]

    config = build(GATEWAY.replace("protocol: HTTP}", "protocol: TCP}"))
    top = config.status.find(gw, ConditionType.ACCEPTED)
    assert top is not None
    assert (top.status, top.reason) == (ConditionStatus.FALSE, "ListenersNotValid")
    assert config.gateways == ()

    config = validate(load(GATEWAY), ValidationOptions(gateway_classes=frozenset({"other"})))
    top = config.status.find(gw, ConditionType.ACCEPTED)
    assert top is not None
    assert (top.status, top.reason) == (ConditionStatus.FALSE, "Invalid")


def test_objectives() -> None:
    config = validate(load_directory(FIXTURES))
    priorities = {o.key.name: (o.priority, o.sheddable) for o in config.objectives}
    assert priorities == {"batch": (-1, True), "default-priority": (0, False), "food-review": (10, False)}
    dangling = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: lost}
spec: {priority: 1, poolRef: {name: nowhere}}
"""
    config = build(*base(), dangling)
    assert config.objective(ObjectKey("default", "lost")) is None
    cond = config.status.find(ResourceRef("InferenceObjective", "default", "lost"), ConditionType.ACCEPTED)
    assert cond is not None
    assert (cond.status, cond.reason) == (ConditionStatus.FALSE, "PoolNotFound")


def _rewrite(name: str, rules: str, *, created: str | None = None, pool_name: str = "pool-a") -> str:
    stamp = f", creationTimestamp: '{created}'" if created else ""
    return f"""
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {{name: {name}{stamp}}}
spec:
  poolRef: {{group: inference.networking.k8s.io, name: {pool_name}}}
  rules:
{rules}
"""


def test_rewrites_weighted_targets_and_precedence() -> None:
    config = validate(load_directory(FIXTURES))
    table = config.rewrites[ObjectKey("default", "vllm-llama3-8b-instruct")]
    assert table.lookup("food-review") == (
        WeightedModel("food-review-1", 90),
        WeightedModel("food-review-2", 10),
    )
    assert table.lookup("anything") == (WeightedModel("meta-llama/Llama-3.1-8B-Instruct", 1),)

    generic_first = _rewrite(
        "generic", "    - targets: [{modelRewrite: base}]", created="2025-01-01T00:00:00Z"
    )
    newer = _rewrite(
        "newer",
        "    - matches: [{model: {value: m}}]\n      targets: [{modelRewrite: m-new}]",
        created="2025-03-01T00:00:00Z",
    )
    older = _rewrite(
        "older",
        "    - matches: [{model: {value: m}}, {model: {value: n}}]\n"
        "      targets: [{modelRewrite: m-v1}, {modelRewrite: m-v2}]",
        created="2025-02-01T00:00:00Z",
    )
    lost = _rewrite("lost", "    - targets: [{modelRewrite: x}]", pool_name="nowhere")
    config = build(*base(), generic_first, newer, older, lost)
    table = config.rewrites[ObjectKey("default", "pool-a")]
    # Exact matches beat the (older) generic rule; among exact ones the oldest resource wins.
    assert table.lookup("m") == (WeightedModel("m-v1", 1), WeightedModel("m-v2", 1))
    assert table.lookup("n") == (WeightedModel("m-v1", 1), WeightedModel("m-v2", 1))
    assert table.lookup("z") == (WeightedModel("base", 1),)
    shadowed = config.status.find(
        ResourceRef("InferenceModelRewrite", "default", "newer"), ConditionType.ACCEPTED
    )
    assert shadowed is not None
    assert shadowed.reason == "ModelNameInUse"
    missing = config.status.find(
        ResourceRef("InferenceModelRewrite", "default", "lost"), ConditionType.ACCEPTED
    )
    assert missing is not None
    assert missing.reason == "PoolNotFound"
    assert ObjectKey("default", "nowhere") not in config.rewrites
    assert ObjectKey("default", "pool-b") not in config.rewrites
