"""``kvgate picker --kubernetes``'s own checks, before it reaches a cluster, and the pool its
``--endpoint-selector`` mode stands for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.gateway.controlplane.kubernetes import client
from kvgate.gateway.controlplane.resources import ConfigSnapshot, ObjectKey, parse_manifests
from kvgate.gateway.controlplane.resources.validate import ValidationOptions, validate
from kvgate.gateway.picker.epp_flags import EppDefaults
from kvgate.gateway.picker.pools_file import FlowControlSpec, PoolSpec
from kvgate.gateway.picker_kubernetes import apply_snapshot, main, pool_namespace, selector_pool, target_ports
from kvgate.policies.errors import ConfigError


def test_an_inference_pool_group_kvgate_does_not_follow_is_refused_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    # (the Inference Extension's pre-v1 pools, inference.networking.x-k8s.io/v1alpha2: kvgate would
    # follow v1 pools and never find this one)
    code = main(["--kubernetes", "--pool-name", "llama", "--pool-group", "inference.networking.x-k8s.io",
                 "--kube-api", "http://127.0.0.1:1"])
    assert code == 2
    assert "--pool-group inference.networking.x-k8s.io" in capsys.readouterr().out


def _pod(name: str, ip: str, labels: dict[str, str]) -> tuple[str, str]:
    return (f"pod/{name}", json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "jobs", "labels": labels},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }))


def test_the_selector_stands_for_a_pool_of_the_pods_it_selects() -> None:
    manifest = selector_pool("app=sampler,role in (decode, prefill),!draining", "8100,8200,8100", "jobs",
                             "rl-router-7d9f8b6c5d-x2x9k")
    assert manifest["metadata"] == {"name": "rl-router", "namespace": "jobs"}  # the Deployment's name
    assert manifest["spec"]["targetPorts"] == [{"number": 8100}, {"number": 8200}]
    pods = [
        _pod("s-0", "10.0.0.1", {"app": "sampler", "role": "decode"}),
        _pod("s-1", "10.0.0.2", {"app": "sampler", "role": "prefill", "draining": "true"}),
        _pod("s-2", "10.0.0.3", {"app": "sampler"}),
        _pod("s-3", "10.0.0.4", {"app": "trainer", "role": "decode"}),
    ]
    resources = parse_manifests([("flags", json.dumps(manifest)), *pods])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    (pool,) = config.pools
    assert pool.addresses == ("10.0.0.1:8100", "10.0.0.1:8200")
    assert selector_pool("app=x", "8000", "jobs")["metadata"]["name"] == "endpoint-selector"  # no POD_NAME


@pytest.mark.parametrize(("selector", "ports", "fragment"), [
    ("app=x", None, "--endpoint-target-ports"),
    ("app=x", "", "--endpoint-target-ports"),
    ("app=x", "http", "not a port number"),
    ("app=x", "70000", "not a port"),
    ("app=x", ",".join(str(8000 + i) for i in range(9)), "at most 8"),
    ("app in (x", "8000", "--endpoint-selector"),
    ("", "8000", "--endpoint-selector"),
])
def test_what_the_flags_cannot_stand_for_is_refused(selector: str, ports: str | None, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        selector_pool(selector, ports, "jobs")
    assert target_ports(" 8000, 8001 ") == (8000, 8001)


def test_the_namespace_is_the_flags_else_this_pods_else_namespace(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(client, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    for name in ("POD_NAMESPACE", "NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    assert pool_namespace(None) == "default"
    monkeypatch.setenv("NAMESPACE", "from-namespace")
    assert pool_namespace(None) == "from-namespace"
    monkeypatch.setenv("POD_NAMESPACE", "from-pod")
    assert pool_namespace(None) == "from-pod"
    assert pool_namespace("flag") == "flag"


def test_a_pool_name_and_a_selector_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--pool-name", "llama", "--endpoint-selector", "app=x", "--endpoint-target-ports", "8000",
                 "--kube-api", "http://127.0.0.1:1"])
    assert code == 2
    assert "not both" in capsys.readouterr().out


class _Service:
    def __init__(self) -> None:
        self.applied: list[PoolSpec] = []

    def apply_pools(self, specs: list[PoolSpec], default: str | None) -> None:
        self.applied = list(specs)


def _snapshot(annotations: str) -> ConfigSnapshot:
    text = (f"apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
            f"metadata: {{name: llm, annotations: {annotations}}}\n"
            "spec: {selector: {matchLabels: {app: llm}}, targetPorts: [{number: 8000}], "
            "endpointPickerRef: {name: kvgate}}\n")
    resources = parse_manifests([("p.yaml", text)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    return ConfigSnapshot(1, resources.content_hash, resources, config, 0.0)


def test_the_configs_flow_control_holds_the_pool_unless_the_pool_turns_it_off() -> None:
    defaults = EppDefaults(flow_control=FlowControlSpec.model_validate({"queueTimeoutSeconds": 45}))
    service = _Service()
    assert apply_snapshot(service, _snapshot("{}"), ObjectKey("default", "llm"),  # type: ignore[arg-type]
                          defaults=defaults)
    [spec] = service.applied
    assert spec.flow_control is not None
    assert spec.flow_control.queue_timeout_s == 45
    apply_snapshot(service, _snapshot('{kvgate.io/flow-control: "false"}'),  # type: ignore[arg-type]
                   ObjectKey("default", "llm"), defaults=defaults)
    assert service.applied[0].flow_control is None
    apply_snapshot(service, _snapshot('{kvgate.io/queue-timeout: "5s"}'),  # type: ignore[arg-type]
                   ObjectKey("default", "llm"), defaults=defaults)
    assert service.applied[0].flow_control is not None
    assert service.applied[0].flow_control.queue_timeout_s == 5  # the pool's own
