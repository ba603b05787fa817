"""deploy/charts: both Helm charts render with Helm's own engine and every object they render is valid.

The renderer is Helm v4's Go SDK itself (the ``helm-python-sdk`` wheel bundles it as a shared
library: no helm binary can be installed here, and none is needed). Built-in kinds are validated
against the Kubernetes OpenAPI schemas (``kubernetes-validate``, strict: unknown fields fail) of the
oldest and newest Kubernetes the charts support; the Gateway API and Inference Extension kinds
against kvgate's own resource models; the containers' command lines with kvgate's own parsers; the
RBAC rules against what kvgate follows and writes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from kvgate.extproc.server import LIVENESS_SERVICE, READINESS_SERVICES
from kvgate.gateway.controlplane.kubernetes.lease import LEASE
from kvgate.gateway.controlplane.kubernetes.provider import (
    CONTROLLER_NAME,
    GATEWAY_CLASSES,
    KINDS,
    NAMESPACES,
    PICKER_KINDS,
)
from kvgate.gateway.controlplane.kubernetes.status import WRITTEN_KINDS
from kvgate.gateway.controlplane.resources import (
    ConditionType,
    ResourceRef,
    ValidationOptions,
    parse_manifests,
    validate,
)
from kvgate.gateway.picker.cli import build_parser as picker_parser
from kvgate.gateway.up_cli import build_parser as up_parser
from kvgate.policies.epp_config import translate_epp_config
from kvgate.policies.profile import build_profile
from tests.deploy.charts import CHARTS, NAMESPACE, Doc, container, one, render, render_error

KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")  # the charts' kubeVersion floor, and the newest schemas here
OWN_KINDS = {"GatewayClass", "Gateway", "HTTPRoute", "InferencePool", "InferenceObjective"}
POOL_VALUES: dict[str, Any] = {"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm-llama"}}}}


PICKER_CASES: dict[str, dict[str, Any]] = {
    "defaults": POOL_VALUES,
    "everything": {
        **POOL_VALUES,
        "inferenceObjectives": [{"name": "chat", "priority": 10}, {"name": "batch", "priority": -1}],
        "inferenceExtension": {
            "replicas": 3, "certSecretName": "picker-tls", "flags": {"attempt-timeout": "30"},
            "monitoring": {"prometheus": {"enabled": False}}, "image": {"hub": "registry.example/ai"},
            "tracing": {"enabled": True, "otelExporterEndpoint": "http://otel-collector.observability:4317",
                        "sampling": {"samplerArg": "0.25"}},
        },
        "redis": {"enabled": True},
        "provider": {"name": "istio"},
    },
    "triton": {"inferencePool": {**POOL_VALUES["inferencePool"], "modelServerType": "triton-tensorrt-llm"},
               "redis": {"url": "redis://redis.shared:6379/2"}},
}
CUSTOM_PROFILE: dict[str, Any] = yaml.safe_load(
    (CHARTS.parents[1] / "policies" / "profiles" / "default.yaml").read_text(encoding="utf-8")
) | {"name": "mine"}
PICKER_CASES["own profile"] = {
    "inferencePool": {**POOL_VALUES["inferencePool"], "profile": "mine"},
    "profiles": {"mine": CUSTOM_PROFILE},
}
CUSTOM_PLUGINS = """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins: [{type: queue-scorer}, {type: prefix-cache-scorer}]
schedulingProfiles:
- name: mine
  plugins: [{pluginRef: queue-scorer, weight: 1}, {pluginRef: prefix-cache-scorer, weight: 5}]
"""
PICKER_CASES["the Inference Extension's plugins config"] = {
    "inferencePool": POOL_VALUES["inferencePool"],
    "inferenceExtension": {"pluginsConfigFile": "mine.yaml",
                           "pluginsCustomConfig": {"mine.yaml": CUSTOM_PLUGINS}},
}
STANDALONE: dict[str, Any] = {
    "inferenceExtension": {"endpointsServer": {
        "createInferencePool": False, "endpointSelector": "app=sampler,role in (prefill,decode)",
        "targetPorts": "8100,8200", "modelServerType": "sglang",
    }},
    "inferencePool": {"profile": "gie-default"},
}
"""The Inference Extension's standalone mode: no InferencePool, Envoy in the picker's Pod."""
PICKER_CASES["standalone"] = STANDALONE
PICKER_CASES["standalone, own profile"] = {
    "inferenceExtension": {"endpointsServer": {"createInferencePool": False, "endpointSelector": "app=x"}},
    "inferencePool": {"profile": "mine"}, "profiles": {"mine": CUSTOM_PROFILE},
}
PICKER_CASES["sidecar beside a pool"] = {**POOL_VALUES, "inferenceExtension": {"sidecar": {"enabled": True}}}
GATEWAY_CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "own profile": {"profiles": {"mine": CUSTOM_PROFILE}},
    "one namespace, two listeners, own redis": {
        "watchNamespace": "team-a", "workers": 2, "redis": {"enabled": False, "url": "redis://r:6379/0"},
        "gateway": {"listeners": [{"name": "http", "port": 80, "protocol": "HTTP"},
                                  {"name": "alt", "port": 8081, "protocol": "HTTP"},
                                  {"name": "alt-host", "port": 8081, "protocol": "HTTP",
                                   "hostname": "b.example"}],
                    "addresses": ["203.0.113.7"]},
        "gatewayClass": {"create": False},
    },
    "workers auto, max request body": {"workers": "auto", "flags": {"max-request-body": "32MiB"}},
    "http and https": {
        "gateway": {"listeners": [{"name": "http", "port": 80, "protocol": "HTTP"},
                                  {"name": "https", "port": 443, "protocol": "HTTPS",
                                   "tls": {"certificateRefs": [{"name": "llm-cert"}]}}]},
    },
}
ALL_RENDERS = [("kvgate-picker", name, values) for name, values in PICKER_CASES.items()] + [
    ("kvgate", name, values) for name, values in GATEWAY_CASES.items()
]


@pytest.mark.parametrize("chart", ["kvgate", "kvgate-picker"])
def test_helm_lint_finds_no_error(chart: str) -> None:
    result = helm.lint(str(CHARTS / chart), strict=False)
    assert result["errors"] == [], result


@pytest.mark.parametrize(("chart", "case", "values"), ALL_RENDERS,
                         ids=[f"{c}:{n}" for c, n, _ in ALL_RENDERS])
def test_every_rendered_object_validates(chart: str, case: str, values: dict[str, Any]) -> None:
    docs = render(chart, values)
    for doc in docs:
        kind = doc["kind"]
        if kind in OWN_KINDS:
            continue  # kvgate's own models, below
        if kind == "DestinationRule":  # Istio's CRD: no schema here; the fields its chart sets
            assert doc["apiVersion"] == "networking.istio.io/v1"
            assert doc["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)  # raises on any schema error
    text = yaml.safe_dump_all([d for d in docs if d["kind"] in OWN_KINDS])
    parse_manifests([(f"{chart}.yaml", text)])  # raises ManifestError on a field kvgate's models reject


def _route_to(pool: str, gateway: str) -> Doc:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "llm", "namespace": NAMESPACE},
        "spec": {"parentRefs": [{"name": gateway}],
                 "rules": [{"backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                             "name": pool}]}]},
    }


def _gateway() -> Doc:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "inference-gateway", "namespace": NAMESPACE},
        "spec": {"gatewayClassName": "any", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]},
    }


def _accepted(
    docs: list[Doc], options: ValidationOptions, refs: list[tuple[ResourceRef, ResourceRef | None]],
) -> None:
    config = validate(parse_manifests([("rendered.yaml", yaml.safe_dump_all(docs))]), options)
    report = config.status
    for ref, parent in refs:
        for condition in (ConditionType.ACCEPTED, ConditionType.RESOLVED_REFS):
            found = report.find(ref, condition, parent=parent)
            if found is None and condition is ConditionType.RESOLVED_REFS and ref.kind == "Gateway":
                continue
            assert found is not None, f"{ref}: no {condition}"
            assert found.is_true, f"{ref} {condition}: {found.reason}: {found.message}"
    assert not report.problems, [entry.to_json() for entry in report.problems]


def test_the_picker_charts_pool_is_accepted_behind_a_users_gateway() -> None:
    docs = render("kvgate-picker", PICKER_CASES["everything"])
    gateway = ResourceRef("Gateway", NAMESPACE, "inference-gateway")
    pool = ResourceRef("InferencePool", NAMESPACE, "llama")
    _accepted([*docs, _gateway(), _route_to("llama", "inference-gateway")], ValidationOptions(),
              [(gateway, None), (ResourceRef("HTTPRoute", NAMESPACE, "llm"), gateway), (pool, None)])
    rendered = one(docs, "InferencePool", "llama")
    assert rendered["spec"]["endpointPickerRef"] == {
        "name": "llama-epp", "port": {"number": 9002}, "failureMode": "FailClose"}
    assert rendered["metadata"]["annotations"]["kvgate.io/engine"] == "vllm"
    assert [o["spec"]["priority"] for o in docs if o["kind"] == "InferenceObjective"] == [10, -1]


def test_the_gateway_charts_gateway_is_kvgates_and_accepted() -> None:
    docs = render("kvgate", {})
    gateway_class = one(docs, "GatewayClass", "kvgate")
    assert gateway_class["spec"]["controllerName"] == CONTROLLER_NAME
    gateway = ResourceRef("Gateway", NAMESPACE, "llama")
    # A pool served by kvgate's own picker (no picker Service: require_picker_service=False).
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "p", "namespace": NAMESPACE},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": "kvgate", "port": {"number": 9002}}}}
    _accepted([*docs, pool, _route_to("p", "llama")],
              ValidationOptions(gateway_classes=frozenset({"kvgate"}), require_picker_service=False),
              [(gateway, None), (ResourceRef("HTTPRoute", NAMESPACE, "llm"), gateway)])


def _args(parser: argparse.ArgumentParser, deployment: Doc, command: str) -> argparse.Namespace:
    args = container(deployment)["args"]
    assert args[0] == command
    return parser.parse_args(args[1:])  # argparse exits (SystemExit) on a flag kvgate does not have


@pytest.mark.parametrize("case", list(PICKER_CASES))
def test_the_picker_runs_a_real_command_line_that_agrees_with_its_service_and_probes(case: str) -> None:
    values = PICKER_CASES[case]
    docs = render("kvgate-picker", values)
    deployment = one(docs, "Deployment", "llama-epp")
    parsed = _args(picker_parser(), deployment, "picker")
    assert parsed.kubernetes
    servers = values.get("inferenceExtension", {}).get("endpointsServer", {})
    if servers.get("createInferencePool", True):
        assert (parsed.pool_name, parsed.pool_namespace) == ("llama", NAMESPACE)
        assert parsed.standalone_endpoint_selector is None
    else:  # the pool the picker builds is named after its Deployment, from POD_NAME
        assert (parsed.pool_name, parsed.pool_namespace) == (None, NAMESPACE)
        assert parsed.standalone_endpoint_selector == servers["endpointSelector"]
        assert parsed.standalone_endpoint_target_ports == servers.get("targetPorts", "8000")
        assert parsed.engine == servers.get("modelServerType", "vllm")
        env = {e["name"]: e for e in container(deployment)["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert parsed.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    assert (ports["grpc-ext-proc"], ports["grpc-health"], ports["http-metrics"]) == (
        parsed.grpc_port, parsed.grpc_health_port, parsed.admin_port)
    probes = container(deployment)
    assert probes["livenessProbe"]["grpc"] == {"port": parsed.grpc_health_port, "service": LIVENESS_SERVICE}
    assert probes["readinessProbe"]["grpc"]["service"] in READINESS_SERVICES
    assert parsed.secure_serving is True
    extension = values.get("inferenceExtension", {})
    prometheus = extension.get("monitoring", {}).get("prometheus", {})
    assert parsed.metrics_endpoint_auth is prometheus.get("enabled", True)
    if extension.get("certSecretName"):
        assert parsed.cert_path is not None
        assert parsed.enable_cert_reload
        mounts = {m["mountPath"]: m["name"] for m in probes["volumeMounts"]}
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes[mounts[str(parsed.cert_path)]]["secret"]["secretName"] == extension["certSecretName"]
    tracing = extension.get("tracing", {})
    if tracing.get("enabled"):
        assert parsed.otlp_endpoint == tracing["otelExporterEndpoint"]
        assert parsed.otlp_sampling_ratio == float(tracing["sampling"]["samplerArg"])
    else:
        assert parsed.otlp_endpoint is None
    _services_reach_their_deployments(docs)
    if parsed.redis is not None:
        redis_service = [d for d in docs
                         if d["kind"] == "Service" and d["metadata"]["name"].endswith("-redis")]
        if redis_service:
            assert parsed.redis == f"redis://{redis_service[0]['metadata']['name']}:6379/0"


def _services_reach_their_deployments(docs: list[Doc]) -> None:
    """Each Service selects the Pods of exactly one Deployment, at ports those Pods name."""
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"].items()
        matched = [d for d in deployments if selector <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matched) == 1, f"Service {service['metadata']['name']} selects {len(matched)} Deployments"
        [target] = matched
        labels = target["spec"]["template"]["metadata"]["labels"]
        assert target["spec"]["selector"]["matchLabels"].items() <= labels.items()
        named = {p.get("name"): p["containerPort"]
                 for c in target["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            wanted = port["targetPort"]
            assert wanted in named or wanted in named.values(), f"{service['metadata']['name']}: {port}"


@pytest.mark.parametrize("case", list(GATEWAY_CASES))
def test_the_gateway_runs_kvgate_up_on_the_gateways_listener_ports(case: str) -> None:
    values = GATEWAY_CASES[case]
    docs = render("kvgate", values)
    deployment = one(docs, "Deployment", "llama")
    parsed = _args(up_parser(), deployment, "up")
    assert parsed.kubernetes
    assert parsed.host == "0.0.0.0"
    assert parsed.namespace == (values.get("watchNamespace") or None)
    assert parsed.lease_namespace == "$(POD_NAMESPACE)"
    env = {e["name"]: e for e in container(deployment)["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    wanted_addresses = values.get("gateway", {}).get("addresses") or [f"llama.{NAMESPACE}.svc.cluster.local"]
    assert parsed.gateway_address == wanted_addresses
    service = one(docs, "Service", "llama")
    listeners = values.get("gateway", {}).get("listeners") or [{"port": 80}]
    lowest = min(int(listener["port"]) for listener in listeners)
    by_port = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}
    ports = {int(listener["port"]) for listener in listeners}
    assert by_port == {port: parsed.port if port == lowest else port + 10000 if port < 1024 else port
                       for port in ports}
    assert parsed.privileged_port_offset == 10000  # (kvgate up binds them there)
    redis = values.get("redis", {})
    assert (parsed.redis is not None) == bool(redis.get("url") or redis.get("enabled", True))
    _services_reach_their_deployments(docs)
    assert ("GatewayClass" in {d["kind"] for d in docs}) == values.get("gatewayClass", {}).get("create", True)


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def _grants(role: Doc) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_the_picker_role_grants_exactly_what_the_picker_follows() -> None:
    docs = render("kvgate-picker", POOL_VALUES)
    wanted = {(_group(k.api_version), k.plural, verb)
              for k in PICKER_KINDS for verb in ("get", "list", "watch")}
    assert _grants(one(docs, "Role")) == wanted
    reviews = one(docs, "ClusterRole", f"llama-epp-{NAMESPACE}-auth")
    assert _grants(reviews) == {("authentication.k8s.io", "tokenreviews", "create"),
                                ("authorization.k8s.io", "subjectaccessreviews", "create")}
    without_auth = render("kvgate-picker", {**POOL_VALUES, "inferenceExtension": {
        "monitoring": {"prometheus": {"enabled": False}}}})
    assert [d["metadata"]["name"] for d in without_auth if d["kind"] == "ClusterRole"] == []


def test_the_standalone_mode_renders_no_inference_api_and_envoy_in_the_pod() -> None:
    """No InferencePool, no InferenceObjective, RBAC for Pods alone (the Inference Extension's CRDs
    need not be installed); Envoy in the picker's Pod with the generated sidecar configuration
    (deploy/envoy/generate.py, checked by real Envoy in test_envoy_files), the Service's port 8081
    its listener; the pool's profile and engine reach the picker as flags."""
    docs = render("kvgate-picker", STANDALONE)
    assert not [d for d in docs if d["kind"] in ("InferencePool", "InferenceObjective")]
    assert _grants(one(docs, "Role")) == {("", "pods", verb) for verb in ("get", "list", "watch")}
    deployment = one(docs, "Deployment", "llama-epp")
    parsed = _args(picker_parser(), deployment, "picker")
    assert (parsed.profile, parsed.engine) == ("gie-default", "sglang")
    envoy = container(deployment, "envoy")
    assert envoy["command"] == ["envoy"]
    assert envoy["args"][:2] == ["-c", "/etc/envoy/envoy.yaml"]
    [mount] = envoy["volumeMounts"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    config_map = one(docs, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
    sidecar_file = CHARTS / "kvgate-picker" / "files" / "envoy-sidecar.yaml"
    assert config_map["data"]["envoy.yaml"].strip() == sidecar_file.read_text(encoding="utf-8").strip()
    assert mount["mountPath"] == "/etc/envoy"
    boot = yaml.safe_load(config_map["data"]["envoy.yaml"])
    [listener] = boot["static_resources"]["listeners"]
    port = listener["address"]["socket_address"]["port_value"]
    assert {"name": "http", "containerPort": port} in envoy["ports"]
    service = one(docs, "Service", "llama-epp")
    assert {"name": "http", "protocol": "TCP", "port": port, "targetPort": port} in service["spec"]["ports"]
    assert envoy["readinessProbe"]["tcpSocket"]["port"] == port
    own = render("kvgate-picker", PICKER_CASES["standalone, own profile"])
    parsed = _args(picker_parser(), one(own, "Deployment", "llama-epp"), "picker")
    assert parsed.profile == "/etc/kvgate/profiles/mine.yaml"
    beside = render("kvgate-picker", PICKER_CASES["sidecar beside a pool"])
    assert one(beside, "InferencePool", "llama")
    assert container(one(beside, "Deployment", "llama-epp"), "envoy")


@pytest.mark.parametrize("watch_namespace", ["", "team-a"])
def test_the_gateway_roles_grant_exactly_what_kvgate_up_follows_and_writes(watch_namespace: str) -> None:
    docs = render("kvgate", {"watchNamespace": watch_namespace})
    read = ("get", "list", "watch")
    followed = KINDS if watch_namespace else (*KINDS, NAMESPACES)
    wanted = {(_group(k.api_version), k.plural, verb) for k in followed for verb in read}
    wanted |= {(_group(k.api_version), f"{k.plural}/status", "patch") for k in WRITTEN_KINDS.values()
               if k.namespaced}
    kind, name = ("Role", "llama") if watch_namespace else ("ClusterRole", f"llama-{NAMESPACE}")
    main = one(docs, kind, name)
    assert _grants(main) == wanted
    if watch_namespace:
        assert main["metadata"]["namespace"] == watch_namespace
    classes = one(docs, "ClusterRole", f"llama-{NAMESPACE}-gatewayclasses")
    group = _group(GATEWAY_CLASSES.api_version)
    assert _grants(classes) == {(group, GATEWAY_CLASSES.plural, v) for v in read} | {
        (group, f"{GATEWAY_CLASSES.plural}/status", "patch")}
    lease = one(docs, "Role", "llama-leader-election")
    assert lease["metadata"]["namespace"] == NAMESPACE
    assert _grants(lease) == {(_group(LEASE.api_version), LEASE.plural, v)
                              for v in ("get", "create", "update")}
    for binding in (d for d in docs if d["kind"].endswith("Binding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama", "namespace": NAMESPACE}]
        roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].endswith("Role")}
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles


@pytest.mark.parametrize(("chart", "values", "message"), [
    ("kvgate-picker", {}, "inferencePool.modelServers.matchLabels is required"),
    ("kvgate-picker", {"inferencePool": {**POOL_VALUES["inferencePool"], "modelServerType": "tgi"}},
     'inferencePool.modelServerType "tgi"'),
    ("kvgate-picker", {**POOL_VALUES, "provider": {"name": "gke"}}, 'provider.name "gke"'),
    ("kvgate-picker", {**POOL_VALUES, "inferenceExtension": {
        "tracing": {"enabled": True, "sampling": {"sampler": "always_on"}}}},
     "parentbased_traceidratio only"),
    ("kvgate-picker", {"inferenceExtension": {"endpointsServer": {"createInferencePool": False}}},
     "endpointSelector is required"),
    ("kvgate-picker", {**STANDALONE, "inferenceObjectives": [{"name": "chat", "priority": 1}]},
     "inferenceObjectives need an InferencePool"),
    ("kvgate-picker", {**POOL_VALUES, "inferenceExtension": {"sidecar": {"enabled": True},
                                                             "extProcPort": 9100}},
     "keep inferenceExtension.extProcPort 9002"),
    ("kvgate", {"workers": 4, "redis": {"enabled": False}}, "workers > 1 share state through Redis"),
    ("kvgate", {"gateway": {"listeners": []}}, "gateway.listeners: name at least one listener"),
])
def test_bad_values_fail_the_render_with_a_message_that_says_what_to_set(
    chart: str, values: dict[str, Any], message: str,
) -> None:
    assert message in render_error(chart, values)


@pytest.mark.parametrize("chart", ["kvgate", "kvgate-picker"])
def test_own_profiles_are_mounted_where_the_annotation_points_and_load(chart: str) -> None:
    values = (PICKER_CASES if chart == "kvgate-picker" else GATEWAY_CASES)["own profile"]
    docs = render(chart, values)
    config_map = one(docs, "ConfigMap")
    deployment = one(docs, "Deployment", "llama-epp" if chart == "kvgate-picker" else "llama")
    mounts = {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    wanted = config_map["metadata"]["name"]
    [name] = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == wanted]
    directory = Path(mounts[name])
    for file_name, text in config_map["data"].items():
        profile = build_profile(yaml.safe_load(text))  # kvgate's own loader: the profile builds
        assert profile.name == "mine"
        path = directory / file_name
        if chart == "kvgate-picker":
            annotation = one(docs, "InferencePool")["metadata"]["annotations"]["kvgate.io/profile"]
            assert annotation == str(path)


def test_the_inference_extensions_plugins_config_reaches_the_picker_and_translates() -> None:
    """``pluginsCustomConfig`` / ``pluginsConfigFile`` (the Inference Extension chart's names): the
    file is mounted where ``--config-file`` points, the pool names no profile (the config decides),
    and kvgate translates it into a profile with its weights."""
    docs = render("kvgate-picker", PICKER_CASES["the Inference Extension's plugins config"])
    deployment = one(docs, "Deployment", "llama-epp")
    parsed = _args(picker_parser(), deployment, "picker")
    config_map = one(docs, "ConfigMap")
    mounts = {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    wanted = config_map["metadata"]["name"]
    [name] = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == wanted]
    assert Path(mounts[name]) / "mine.yaml" == parsed.config_file
    assert "kvgate.io/profile" not in one(docs, "InferencePool")["metadata"]["annotations"]
    translation = translate_epp_config(config_map["data"]["mine.yaml"])
    assert translation.profile is not None
    built = build_profile(translation.profile)
    weights = [(s.plugin_type, s.weight) for s in built.scorers]
    assert weights == [("queue-scorer", 1.0), ("prefix-cache-scorer", 5.0)]
