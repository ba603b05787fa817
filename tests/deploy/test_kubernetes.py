"""deploy/kubernetes: well-formed manifests that agree with each other and with kvgate's own parsers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.controlplane.resources import (
    ConditionType,
    ResourceRef,
    ValidationOptions,
    parse_manifests,
    validate,
)
from gateway.picker.cli import build_parser
from gateway.picker.pools_file import PoolsFile, parse_pools
from policies.errors import ConfigError

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
    found = [doc for _, doc in _documents() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _container(deployment: Doc) -> Doc:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    result: Doc = container
    return result


def _picker_pools() -> PoolsFile:
    config_map = _one("ConfigMap", "kvgate-pools")
    return parse_pools(config_map["data"]["pools.yaml"], source="ConfigMap kvgate-pools")


def test_every_document_names_its_kind_and_object() -> None:
    kinds: set[str] = set()
    for source, doc in _documents():
        assert isinstance(doc, dict), source
        for key in ("apiVersion", "kind", "metadata"):
            assert doc.get(key), f"{source}: document without {key}"
        assert doc["metadata"].get("name"), f"{source}: {doc['kind']} without metadata.name"
        kinds.add(doc["kind"])
    assert {"ConfigMap", "Deployment", "Service", "InferencePool", "Gateway", "HTTPRoute"} <= kinds


def test_deployments_select_their_own_pods() -> None:
    for _, doc in _documents():
        if doc["kind"] != "Deployment":
            continue
        selector = doc["spec"]["selector"]["matchLabels"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), doc["metadata"]["name"]


def test_the_configmap_pools_file_loads_with_the_pickers_loader() -> None:
    pools = _picker_pools()
    assert pools.effective_default is not None, "a gateway does not name the pool: the file needs a default"
    assert all(pool.endpoints for pool in pools.pools)


def test_the_pools_loader_would_reject_a_broken_configmap() -> None:
    text = _one("ConfigMap", "kvgate-pools")["data"]["pools.yaml"]
    broken = text.replace("failureMode: FailClose", "failureMode: FailSometimes")
    assert broken != text
    with pytest.raises(ConfigError):
        parse_pools(broken)


def test_picker_deployment_runs_a_real_picker_command_line() -> None:
    deployment = _one("Deployment", "kvgate-picker")
    assert deployment["spec"]["replicas"] == 2
    container = _container(deployment)
    args = container["args"]
    assert args[0] == "picker"
    parsed = build_parser().parse_args(args[1:])  # argparse exits (SystemExit) on an unknown flag
    assert parsed.host == "0.0.0.0"
    assert parsed.redis == "redis://kvgate-redis:6379/0"
    config_map = _one("ConfigMap", "kvgate-pools")
    [mount] = container["volumeMounts"]
    [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert parsed.pools == Path(mount["mountPath"]) / "pools.yaml"
    assert "pools.yaml" in config_map["data"]

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc-ext-proc"] == parsed.grpc_port
    assert ports["http-admin"] == parsed.admin_port
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"]["path"] == path
        assert ports[container[probe]["httpGet"]["port"]] == parsed.admin_port


def test_services_reach_the_pickers_and_redis_ports() -> None:
    picker = _container(_one("Deployment", "kvgate-picker"))
    parsed = build_parser().parse_args(picker["args"][1:])
    service = _one("Service", "kvgate-picker")
    labels = _one("Deployment", "kvgate-picker")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    by_port = {p["port"]: p for p in service["spec"]["ports"]}
    assert by_port[9002]["targetPort"] == parsed.grpc_port
    assert by_port[9002]["appProtocol"] == "http2"
    assert by_port[9090]["targetPort"] == parsed.admin_port

    redis = _one("Service", "kvgate-redis")
    redis_labels = _one("Deployment", "kvgate-redis")["spec"]["template"]["metadata"]["labels"]
    assert redis["spec"]["selector"].items() <= redis_labels.items()
    assert parsed.redis == f"redis://{redis['metadata']['name']}:{redis['spec']['ports'][0]['port']}/0"


def test_inference_pool_names_the_picker_service_and_matches_the_pools_file() -> None:
    pool = _one("InferencePool", "llama")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    ref = pool["spec"]["endpointPickerRef"]
    service = _one("Service", ref["name"])
    assert ref["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    assert ref["failureMode"] == "FailClose"
    pools = _picker_pools()
    [spec] = [p for p in pools.pools if p.name == pool["metadata"]["name"]]
    assert spec.failure_mode.value == ref["failureMode"]
    target_ports = {p["number"] for p in pool["spec"]["targetPorts"]}
    assert {int(address.rpartition(":")[2]) for address in spec.endpoints} <= target_ports
    objectives = {
        doc["metadata"]["name"]: doc["spec"].get("priority", 0)
        for _, doc in _documents()
        if doc["kind"] == "InferenceObjective"
    }
    assert objectives == {o.name: o.priority for o in spec.objectives}


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
