"""deploy/kubernetes: well-formed manifests that agree with each other and with kvgate's own parsers."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from kvgate.gateway.controlplane.kubernetes.provider import PICKER_KINDS
from kvgate.gateway.controlplane.resources import (
    ConditionType,
    ResourceRef,
    ValidationOptions,
    parse_manifests,
    validate,
)
from kvgate.gateway.picker.cli import build_parser
from tests.deploy.charts import container as container_of
from tests.deploy.charts import one

REPO = Path(__file__).resolve().parents[2]
KUBE_DIR = REPO / "deploy" / "kubernetes"

Doc = dict[str, Any]


def _files() -> list[Path]:
    files = sorted(KUBE_DIR.glob("*.yaml"))
    assert files, f"no manifests under {KUBE_DIR}"
    return files


def _documents() -> Iterator[tuple[str, Doc]]:
    for path in _files():
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                yield path.name, doc


def _one(kind: str, name: str) -> Doc:
    return one([doc for _, doc in _documents()], kind, name)


def test_every_document_names_its_kind_and_object() -> None:
    kinds: set[str] = set()
    for source, doc in _documents():
        assert isinstance(doc, dict), source
        for key in ("apiVersion", "kind", "metadata"):
            assert doc.get(key), f"{source}: document without {key}"
        assert doc["metadata"].get("name"), f"{source}: {doc['kind']} without metadata.name"
        kinds.add(doc["kind"])
    assert {"Deployment", "Service", "InferencePool", "Gateway", "HTTPRoute", "Role"} <= kinds


def test_deployments_select_their_own_pods() -> None:
    for _, doc in _documents():
        if doc["kind"] != "Deployment":
            continue
        selector = doc["spec"]["selector"]["matchLabels"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), doc["metadata"]["name"]


def _picker_args() -> argparse.Namespace:
    container = container_of(_one("Deployment", "kvgate-picker"))
    args = container["args"]
    assert args[0] == "picker"
    return build_parser().parse_args(args[1:])  # argparse exits (SystemExit) on an unknown flag


def test_picker_deployment_runs_a_real_picker_command_line() -> None:
    deployment = _one("Deployment", "kvgate-picker")
    assert deployment["spec"]["replicas"] == 2
    container = container_of(deployment)
    parsed = _picker_args()
    assert parsed.kubernetes
    assert parsed.host == "0.0.0.0"
    assert parsed.redis == "redis://kvgate-redis:6379/0"
    assert parsed.pool_namespace == "$(POD_NAMESPACE)"
    [env] = container["env"]
    assert (env["name"], env["valueFrom"]["fieldRef"]["fieldPath"]) == ("POD_NAMESPACE", "metadata.namespace")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "kvgate-picker"

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc-ext-proc"] == parsed.grpc_port
    assert ports["grpc-health"] == parsed.grpc_health_port
    assert ports["http-admin"] == parsed.admin_port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert ports[container["readinessProbe"]["httpGet"]["port"]] == parsed.admin_port
    assert container["livenessProbe"]["grpc"]["port"] == parsed.grpc_health_port


def test_the_role_grants_exactly_what_the_picker_follows_and_only_reads() -> None:
    wanted = {(_group(kind.api_version), kind.plural) for kind in PICKER_KINDS}
    role = _one("Role", "kvgate-picker")
    granted = set()
    for rule in role["rules"]:
        assert sorted(rule["verbs"]) == ["get", "list", "watch"]
        granted |= {(group, resource) for group in rule["apiGroups"] for resource in rule["resources"]}
    assert granted == wanted
    binding = _one("RoleBinding", "kvgate-picker")
    assert binding["roleRef"]["name"] == "kvgate-picker"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kvgate-picker"}]
    reviews = _one("ClusterRole", "kvgate-picker-auth")
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in reviews["rules"]} == {
        ("authentication.k8s.io", "tokenreviews", ("create",)),
        ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
    }


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def test_services_reach_the_pickers_and_redis_ports() -> None:
    parsed = _picker_args()
    service = _one("Service", "kvgate-picker")
    labels = _one("Deployment", "kvgate-picker")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    by_port = {p["port"]: p for p in service["spec"]["ports"]}
    assert by_port[9002]["targetPort"] == parsed.grpc_port
    assert by_port[9002]["appProtocol"] == "http2"
    assert by_port[9090]["targetPort"] == parsed.admin_port
    assert by_port[9003]["targetPort"] == parsed.grpc_health_port

    redis = _one("Service", "kvgate-redis")
    redis_labels = _one("Deployment", "kvgate-redis")["spec"]["template"]["metadata"]["labels"]
    assert redis["spec"]["selector"].items() <= redis_labels.items()
    assert parsed.redis == f"redis://{redis['metadata']['name']}:{redis['spec']['ports'][0]['port']}/0"


def test_the_picker_follows_the_inference_pool_that_names_it() -> None:
    pool = _one("InferencePool", _picker_args().pool_name)
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    ref = pool["spec"]["endpointPickerRef"]
    service = _one("Service", ref["name"])
    assert ref["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    assert ref["failureMode"] == "FailClose"


def test_kvgates_resource_validation_accepts_the_gateway_api_manifests() -> None:
    resources = parse_manifests((p.name, p.read_text(encoding="utf-8")) for p in _files())
    config = validate(resources, ValidationOptions())  # the picker Service is required, and present
    report = config.status
    namespace = "default"  # the manifests leave the namespace to `kubectl apply -n`
    gateway = ResourceRef("Gateway", namespace, "inference-gateway")
    pool = ResourceRef("InferencePool", namespace, "llama")
    route = ResourceRef("HTTPRoute", namespace, "llm")
    for ref, kind, parent in (
        (gateway, ConditionType.ACCEPTED, None),
        (route, ConditionType.ACCEPTED, gateway),
        (route, ConditionType.RESOLVED_REFS, gateway),
        (pool, ConditionType.ACCEPTED, None),
        (pool, ConditionType.RESOLVED_REFS, None),
    ):
        found = report.find(ref, kind, parent=parent)
        assert found is not None, f"{ref}: no {kind} condition"
        assert found.is_true, f"{ref} {kind}: {found.reason}: {found.message}"
    assert not report.problems, [entry.to_json() for entry in report.problems]
    [resolved] = config.pools
    assert resolved.picker is not None
    assert resolved.picker.service == "kvgate-picker"
    assert resolved.picker.port == 9002
