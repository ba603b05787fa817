"""The control loop without Envoy: manifests → picker pools + xDS snapshot; errors keep the last good."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from kvgate.gateway.controlplane.control_plane import (
    ControlPlane,
    ControlPlaneSettings,
    pool_specs,
    with_pods,
)
from kvgate.gateway.controlplane.envoy_clusters import pool_cluster_name
from kvgate.gateway.controlplane.resources import FileProvider, ValidationOptions, parse_manifests, validate
from kvgate.gateway.controlplane.status_cli import format_status
from kvgate.gateway.controlplane.translate import translate
from kvgate.gateway.controlplane.xds import ANY_NODE, SnapshotCache
from kvgate.gateway.picker.pool_runtime import PoolRuntime
from kvgate.gateway.picker.pools_file import PoolSpec
from kvgate.gateway.picker.service import PickerService, PickerSettings
from kvgate.gateway.picker.tls import self_signed
from kvgate.gateway.processes.simulator import SimFleetProcess
from kvgate.gateway.up_options import UpOptions, bundled_example
from kvgate.gateway.up_sim import find_pool, sim_pods, sim_tokenizer
from kvgate.policies.errors import ConfigError
from kvgate.policies.flow_control import FlowControlSettings

POOL = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: llama
  annotations: {{kvgate.io/profile: {profile}, kvgate.io/engine: {engine}}}
spec:
  selector: {{matchLabels: {{app: llama}}}}
  targetPorts: [{{number: 8000}}]
  endpointPickerRef: {{name: epp, failureMode: FailOpen}}
"""

REST = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: kvgate
  listeners: [{name: http, port: 8080, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: llama}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: p0, labels: {app: llama}}
status: {podIP: 10.0.0.7}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1, poolRef: {name: llama}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: canary}
spec:
  poolRef: {name: llama}
  rules:
    - matches: [{model: {value: m}}]
      targets: [{modelRewrite: m-v1, weight: 90}, {modelRewrite: m-v2, weight: 10}]
"""

EXTERNAL = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: other}
spec:
  selector: {matchLabels: {app: other}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: ext-epp}
---
apiVersion: v1
kind: Service
metadata: {name: ext-epp, annotations: {kvgate.io/endpoints: "10.1.0.1:9002"}}
spec: {ports: [{port: 9002}]}
"""

SETTINGS = ControlPlaneSettings(picker_address="127.0.0.1:9002", listen_ports=((8080, 18080),))


def write(directory: Path, profile: str = "default", engine: str = "sglang") -> None:
    (directory / "all.yaml").write_text(POOL.format(profile=profile, engine=engine) + "---" + REST)


def test_pool_specs_carry_endpoints_objectives_rewrites_and_annotations() -> None:
    resources = parse_manifests([("x.yaml", POOL.format(profile="gie-default", engine="sglang") + "---"
                                  + REST + "---" + EXTERNAL)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    specs, warnings = pool_specs(resources, config, SETTINGS)
    assert warnings == []
    [spec] = specs  # the pool with an external picker is not served by kvgate's own
    assert spec.name == "default/llama"
    assert spec.endpoints == ("10.0.0.7:8000",)
    assert spec.failure_mode.value == "FailOpen"
    assert (spec.profile, spec.engine) == ("gie-default", "sglang")
    assert spec.objective_priority("batch") == -1
    targets = spec.rewrite_targets("m")
    assert targets is not None
    assert [(t.model, t.weight) for t in targets] == [("m-v1", 90), ("m-v2", 10)]
    assert spec.rewrite_targets("other") is None


def test_unknown_engine_annotation_falls_back_with_a_warning() -> None:
    resources = parse_manifests([("x.yaml", POOL.format(profile="default", engine="tgi") + "---" + REST)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(resources, config, SETTINGS)
    assert spec.engine == "vllm"
    assert "tgi" in warnings[0]


@pytest.mark.parametrize(("value", "port", "warned"), [("9100", 9100, False), ("http", None, True),
                                                      ("70000", None, True)])
def test_a_jetstream_pool_with_its_metrics_port(value: str, port: int | None, warned: bool) -> None:
    annotated = POOL.replace("annotations: {{", f"annotations: {{{{kvgate.io/metrics-port: '{value}', ")
    resources = parse_manifests([("x.yaml", annotated.format(profile="default", engine="jetstream")
                                  + "---" + REST)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(resources, config, SETTINGS)
    assert (spec.engine, spec.metrics_port) == ("jetstream", port)
    assert any("kvgate.io/metrics-port" in w for w in warnings) is warned


def test_rate_limit_annotations_become_tenant_limits_and_bad_values_are_warned_about() -> None:
    limited = POOL.replace(
        "annotations: {{", "annotations: {{kvgate.io/requests-per-minute: '60', "
        "kvgate.io/tokens-per-minute: 'lots', kvgate.io/fairness-header: X-Team, "
    ).format(profile="default", engine="vllm")
    resources = parse_manifests([("x.yaml", limited + "---" + REST)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(resources, config, SETTINGS)
    assert spec.rate_limits is not None
    assert (spec.rate_limits.requests_per_minute, spec.rate_limits.tokens_per_minute) == (60, None)
    assert spec.rate_limits.header == "x-team"
    [warning] = warnings
    assert "kvgate.io/tokens-per-minute" in warning
    plain = parse_manifests([("x.yaml", POOL.format(profile="default", engine="vllm") + "---" + REST)])
    [spec], _ = pool_specs(plain, validate(plain, ValidationOptions(require_picker_service=False)), SETTINGS)
    assert spec.rate_limits is None


async def test_weighted_rewrite_draws_in_proportion() -> None:
    resources = parse_manifests([("x.yaml", POOL.format(profile="default", engine="vllm") + "---" + REST)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], _ = pool_specs(resources, config, SETTINGS)
    service = PickerService(PickerSettings(grpc_address="127.0.0.1:0", admin_port=0))
    runtime = PoolRuntime(spec, None, service.scraper, service.replica_models.names, rng=random.Random(7))  # type: ignore[arg-type]
    drawn = Counter(runtime.rewrite_model("m", {}) for _ in range(5000))
    assert set(drawn) == {"m-v1", "m-v2"}
    assert 0.08 < drawn["m-v2"] / 5000 < 0.12
    assert runtime.rewrite_model("x", {}) == "x"


async def test_apply_publishes_and_a_bad_change_keeps_the_last_good(tmp_path: Path) -> None:
    write(tmp_path)
    provider = FileProvider(tmp_path, options=SETTINGS.validation)
    picker = PickerService(PickerSettings(grpc_address="127.0.0.1:0", admin_port=0))
    cache = SnapshotCache()
    control = ControlPlane(provider, picker, cache, SETTINGS)
    assert control.apply(provider.load())
    first = cache.snapshot_for(ANY_NODE)
    assert first is not None
    assert list(picker.table.pools) == ["default/llama"]
    assert picker.table.resolve(None).name == "default/llama"  # the only pool is the default

    write(tmp_path, profile="no-such-profile")
    assert not control.apply(provider.load())
    assert control.last_error is not None
    assert "no-such-profile" in control.last_error
    assert cache.snapshot_for(ANY_NODE) is first
    assert picker.table.pools["default/llama"].spec.profile == "default"
    status = control.status()
    assert status["apply_error"] == control.last_error
    assert status["applied"]["pools"] == ["default/llama"]
    text = format_status(status)
    for word in ("APPLY ERROR", "InferencePool", "ResolvedRefs"):
        assert word in text

    write(tmp_path, engine="vllm")
    assert control.apply(provider.load())
    assert control.last_error is None
    assert picker.table.pools["default/llama"].spec.engine == "vllm"


def test_sim_pods_join_the_chosen_pool() -> None:
    resources = parse_manifests([("x.yaml", POOL.format(profile="default", engine="vllm") + "---" + REST)])
    pool = find_pool(resources, "llama")
    pods = sim_pods(pool, ["127.0.1.1", "127.0.1.2"])
    merged = parse_manifests([("x.yaml", POOL.format(profile="default", engine="vllm"))])
    config = validate(with_pods(merged, pods), ValidationOptions(require_picker_service=False))
    assert config.pools[0].addresses == ("127.0.1.1:8000", "127.0.1.2:8000")
    expressions = ("matchExpressions: [{key: tier, operator: In, values: [gpu, tpu]}, "
                   "{key: gen, operator: Exists}]")
    text = POOL.format(profile="default", engine="vllm")
    text = text.replace("matchLabels:", f"{expressions}, matchLabels:")
    assert expressions in text
    selective = find_pool(parse_manifests([("x.yaml", text + "---" + REST)]), "llama")
    pods = sim_pods(selective, ["127.0.1.1"])
    config = validate(with_pods(parse_manifests([("x.yaml", text)]), pods),
                      ValidationOptions(require_picker_service=False))
    assert config.pools[0].addresses == ("127.0.1.1:8000",)
    with pytest.raises(ConfigError):
        find_pool(resources, "nope")
    two = parse_manifests([("x.yaml", POOL.format(profile="a", engine="b") + "---" + EXTERNAL)])
    with pytest.raises(ConfigError):
        find_pool(two, None)


def test_the_bundled_example_is_valid() -> None:
    provider = FileProvider(bundled_example(), options=SETTINGS.validation)
    snapshot = provider.load()
    assert not snapshot.config.status.problems or all(
        entry.resource.kind == "InferencePool" for entry in snapshot.config.status.problems
    )
    assert [pool.id for pool in snapshot.config.pools] == ["default/llama"]
    assert len(snapshot.config.objectives) == 2


def test_a_pools_annotations_forward_unknown_names_and_opt_paths_in_and_it_knows_its_routes_models() -> None:
    routed = REST.replace(
        "rules: [{backendRefs:",
        "rules: [{matches: [{headers: [{name: X-Gateway-Model-Name, value: routed-model}]}], backendRefs:",
    )
    pool = POOL.format(profile="default", engine="vllm").replace(
        "kvgate.io/engine: vllm}",
        "kvgate.io/engine: vllm, kvgate.io/model-check: 'false', "
        "kvgate.io/extra-paths: '/v1/load_lora_adapter/, no-slash'}",
    )
    resources = parse_manifests([("x.yaml", pool + "---" + routed)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(resources, config, SETTINGS)
    assert spec.route_models == ("routed-model",)
    assert not spec.check_models
    assert spec.extra_paths == ("/v1/load_lora_adapter",)
    assert len(warnings) == 1
    assert "kvgate.io/extra-paths" in warnings[0]
    assert {"routed-model", "m", "m-v1", "m-v2"} <= spec.declared_models()


def test_pod_roles_and_the_pd_execution_annotation_reach_the_pool_spec() -> None:
    pool = POOL.format(profile="pd", engine="vllm").replace(
        "kvgate.io/engine: vllm}", "kvgate.io/engine: vllm, kvgate.io/pd-execution: sidecar}")
    resources = parse_manifests([("x.yaml", pool + "---" + REST)])
    pods = sim_pods(find_pool(resources, "llama"), ["127.0.1.1", "127.0.1.2", "127.0.1.3"],
                    ["prefill", "decode", "both"])
    assert pods[0].metadata.labels["llm-d.ai/role"] == "prefill"
    assert "llm-d.ai/role" not in pods[2].metadata.labels
    merged = with_pods(resources, pods)
    config = validate(merged, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(merged, config, SETTINGS)
    assert warnings == []
    assert dict(spec.roles) == {"127.0.1.1:8000": "prefill", "127.0.1.2:8000": "decode"}
    assert spec.pd_execution == "sidecar"
    roles = {e.address: e.role.value for e in spec.endpoint_objects()}
    assert [roles[f"127.0.1.{i}:8000"] for i in (1, 2, 3)] == ["prefill", "decode", "both"]
    typo = parse_manifests([("x.yaml", pool.replace("execution: sidecar", "execution: gpu") + "---" + REST)])
    typo_config = validate(typo, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(typo, typo_config, SETTINGS)
    assert spec.pd_execution == "picker"
    assert any("pd-execution" in w for w in warnings)


@pytest.mark.parametrize(("annotation", "field"), [
    ("kvgate.io/media-uuids", "media_uuids"), ("kvgate.io/model-rewrite-header", "model_rewrite_header")])
def test_the_switch_annotations_reach_the_pool_spec(annotation: str, field: str) -> None:
    pool = POOL.format(profile="default", engine="vllm")
    cases = (("'true'", True, False), ("'false'", False, False), ("'yes'", False, True), (None, False, False))
    for value, expected, warned in cases:
        text = pool if value is None else pool.replace(
            "kvgate.io/engine: vllm}", f"kvgate.io/engine: vllm, {annotation}: {value}}}")
        resources = parse_manifests([("x.yaml", text + "---" + REST)])
        config = validate(resources, ValidationOptions(require_picker_service=False))
        [spec], warnings = pool_specs(resources, config, SETTINGS)
        assert getattr(spec, field) is expected, value
        assert any(annotation in w for w in warnings) is warned


def test_the_bundled_disaggregated_example_is_valid_and_kvgate_up_picks_it() -> None:
    options = UpOptions(sim_prefill=2, sim_decode=3, sim=1)
    assert options.config_directory == bundled_example("pd")
    assert options.sim_roles == ("prefill", "prefill", "decode", "decode", "decode", "both")
    assert options.sim_replicas == 6
    assert UpOptions().config_directory == bundled_example()
    assert UpOptions().sim_roles == ("both",) * 4
    snapshot = FileProvider(bundled_example("pd"), options=SETTINGS.validation).load()
    assert [pool.id for pool in snapshot.config.pools] == ["default/llama"]
    fleet = SimFleetProcess(roles=options.sim_roles, port=8000, hosts_from="127.0.1.1", time_scale=1.0,
                            model=None)
    assert fleet.command[3:9] == ["--prefill", "2", "--decode", "3", "--replicas", "1"]


def test_kv_events_and_tokenizer_annotations_reach_the_pool_spec_and_the_simulated_fleet() -> None:
    annotated = POOL.replace(
        "annotations: {{", "annotations: {{kvgate.io/kv-events-port: '5557', "
        "kvgate.io/tokenizer: /models/llama/tokenizer.json, "
    ).format(profile="default", engine="vllm")
    resources = parse_manifests([("x.yaml", annotated + "---" + REST)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(resources, config, SETTINGS)
    assert warnings == []
    assert spec.kv_events is not None
    assert (spec.kv_events.port, spec.kv_events.tokenizer) == (5557, "/models/llama/tokenizer.json")
    pool = find_pool(resources, "llama")
    assert sim_tokenizer(pool, None) == "/models/llama/tokenizer.json"
    assert sim_tokenizer(pool, "/other.json") == "/other.json"  # --sim-tokenizer wins
    alone = POOL.replace("annotations: {{", "annotations: {{kvgate.io/tokenizer: /t.json, ").format(
        profile="default", engine="vllm")
    resources = parse_manifests([("x.yaml", alone + "---" + REST)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(resources, config, SETTINGS)
    assert spec.kv_events is None
    assert "without kvgate.io/kv-events-port" in warnings[0]


def annotated_spec(annotations: str) -> tuple[PoolSpec, list[str]]:
    text = POOL.replace("annotations: {{", "annotations: {{" + annotations).format(profile="default",
                                                                                   engine="vllm")
    resources = parse_manifests([("x.yaml", text + "---" + REST)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], warnings = pool_specs(resources, config, SETTINGS)
    return spec, warnings


def test_flow_control_annotations_reach_the_pool_spec_and_bad_values_are_warned_about() -> None:
    spec, warnings = annotated_spec("kvgate.io/flow-control: 'true', ")
    assert warnings == []
    assert spec.flow_control is not None
    assert spec.flow_control.settings() == FlowControlSettings()  # the defaults
    spec, warnings = annotated_spec("kvgate.io/queue-timeout: 1m30s, kvgate.io/max-queue-length: '50', "
                                    "kvgate.io/max-inflight-per-endpoint: '8', ")
    assert warnings == []
    assert spec.flow_control is not None
    settings = spec.flow_control.settings()
    assert (settings.queue_timeout_s, settings.max_queue_length, settings.max_inflight_per_endpoint) == (
        90.0, 50, 8)
    spec, warnings = annotated_spec("kvgate.io/queue-timeout: soon, kvgate.io/max-queue-length: '0', ")
    assert spec.flow_control is not None
    assert spec.flow_control.settings() == FlowControlSettings()
    assert len(warnings) == 2
    assert "kvgate.io/queue-timeout" in warnings[0]
    spec, warnings = annotated_spec("kvgate.io/flow-control: 'false', kvgate.io/queue-timeout: 10s, ")
    assert spec.flow_control is None
    assert warnings == []
    spec, warnings = annotated_spec("kvgate.io/flow-control: maybe, ")
    assert spec.flow_control is None
    assert "kvgate.io/flow-control" in warnings[0]
    assert annotated_spec("")[0].flow_control is None


def test_the_queue_order_annotation() -> None:
    """``kvgate.io/queue-order`` orders each tenant's held requests; it does not turn flow control
    on by itself, and a value it does not know is warned about (the default kept)."""
    spec, warnings = annotated_spec("kvgate.io/flow-control: 'true', kvgate.io/queue-order: slo-deadline, ")
    assert warnings == []
    assert spec.flow_control is not None
    assert spec.flow_control.settings().order == "slo-deadline"
    assert annotated_spec("kvgate.io/queue-order: slo-deadline, ")[0].flow_control is None
    spec, warnings = annotated_spec("kvgate.io/flow-control: 'true', kvgate.io/queue-order: edf, ")
    assert spec.flow_control is not None
    assert spec.flow_control.settings().order == "fcfs"
    assert len(warnings) == 1
    assert "kvgate.io/queue-order" in warnings[0]


SPOT = """
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: {name}, annotations: {{{annotations}}}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  targetPorts: [{{number: 8000}}]
  endpointPickerRef: {{name: epp}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}-0, labels: {{app: {name}}}}}
status: {{podIP: {ip}}}
"""


def spill_config(llama: str, spot: str) -> tuple[list[PoolSpec], list[str], dict[str, tuple[str, ...]]]:
    text = POOL.replace("annotations: {{", "annotations: {{" + llama).format(profile="default", engine="vllm")
    text += "---" + REST + SPOT.format(name="spot", annotations=spot, ip="10.0.0.8")
    resources = parse_manifests([("x.yaml", text)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    specs, _ = pool_specs(resources, config, SETTINGS)
    return list(specs), list(config.notes), {p.id: p.spill_addresses for p in config.pools}


def test_a_pools_spill_target_reaches_its_spec_and_its_cluster_reaches_the_targets_endpoints() -> None:
    specs, notes, spill_addresses = spill_config("kvgate.io/spill-to: spot, ", "")
    llama = next(s for s in specs if s.name == "default/llama")
    assert llama.spill_to == "default/spot"
    assert spill_addresses["default/llama"] == ("10.0.0.8:8000",)
    assert notes == []
    text = POOL.replace("annotations: {{", "annotations: {{kvgate.io/spill-to: spot, ").format(
        profile="default", engine="vllm")
    text += "---" + REST + SPOT.format(name="spot", annotations="", ip="10.0.0.8")
    resources = parse_manifests([("x.yaml", text)])
    envoy = translate(validate(resources, ValidationOptions(require_picker_service=False)),
                      SETTINGS.translation())
    [cluster] = [c for c in envoy.clusters if c["name"] == pool_cluster_name("default/llama")]
    hosts = [e["endpoint"]["address"]["socket_address"]["address"]
             for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert hosts == ["10.0.0.7", "10.0.0.8"]


def test_a_spill_target_that_is_missing_or_leads_back_is_left_out_with_a_note() -> None:
    specs, notes, _ = spill_config("kvgate.io/spill-to: nowhere, ", "")
    assert all(s.spill_to is None for s in specs)
    assert "names no other resolved InferencePool" in notes[0]
    specs, notes, _ = spill_config("kvgate.io/spill-to: spot, ", "kvgate.io/spill-to: llama")
    assert all(s.spill_to is None for s in specs)
    assert len(notes) == 2
    assert "leads back" in notes[0]
    # a pool whose model servers are reached with other TLS settings: one Envoy cluster cannot
    specs, notes, _ = spill_config("kvgate.io/spill-to: spot, ", '"kvgate.io/model-server-tls": "true"')
    assert all(s.spill_to is None for s in specs)
    assert "other TLS settings" in notes[0]


async def test_what_is_wrong_with_an_applied_configuration_is_logged_once_and_its_end_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.gateway.controlplane.control_plane")
    (tmp_path / "all.yaml").write_text(POOL.format(profile="default", engine="vllm") + "---"
                                       + REST.replace("name: llama}]}]", "name: missing}]}]"))
    provider = FileProvider(tmp_path, options=SETTINGS.validation)
    picker = PickerService(PickerSettings(grpc_address="127.0.0.1:0", admin_port=0))
    control = ControlPlane(provider, picker, SnapshotCache(), SETTINGS)
    assert control.apply(provider.load())
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("HTTPRoute default/r (Gateway default/gw): ResolvedRefs False (BackendNotFound): "
               "InferencePool default/missing not found" in line for line in said), said
    caplog.clear()
    assert control.apply(provider.load())  # the same problems again: said once
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    write(tmp_path, engine="vllm")  # the route names the pool that exists
    assert control.apply(provider.load())
    resolved = "configuration: resolved: HTTPRoute default/r"
    assert any(r.getMessage().startswith(resolved) and r.levelno == logging.WARNING for r in caplog.records)


def test_status_lists_each_listener_certificate_with_the_days_left() -> None:
    now = time.time()
    day = 86400
    gw = "default/gw"
    text = format_status({"certificates": [
        {"gateway": gw, "listener": "https", "secret": "default/cert", "not_after": now + 30.4 * day},
        {"gateway": gw, "listener": "old", "secret": "default/old", "not_after": now - 2.2 * day},
    ]})
    assert "default/gw https  default/cert  30 days" in text
    assert "EXPIRED 2 days ago" in text


@pytest.mark.parametrize(("sans", "checked"), [
    ("", True), (", subjectAltNames: [{type: URI, uri: 'spiffe://a/b'}]", False)])
def test_a_pools_backend_tls_policy_reaches_its_spec_over_the_annotations(sans: str, checked: bool) -> None:
    pem = self_signed(("vllm.example",)).cert_pem.decode()
    ca = "".join(f"    {line}\n" for line in pem.splitlines())
    text = POOL.replace("annotations: {{", 'annotations: {{"kvgate.io/model-server-tls": "true", ').format(
        profile="default", engine="vllm")
    policy = f"""
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: llama-tls}}
spec:
  targetRefs: [{{group: inference.networking.k8s.io, kind: InferencePool, name: llama}}]
  validation: {{caCertificateRefs: [{{group: '', kind: ConfigMap, name: ca}}], hostname: vllm.example{sans}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: ca}}
data:
  ca.crt: |
{ca}"""
    resources = parse_manifests([("x.yaml", text + "---" + REST + "---" + policy)])
    config = validate(resources, ValidationOptions(require_picker_service=False))
    [spec], _ = pool_specs(resources, config, SETTINGS)
    tls = spec.model_server_tls
    assert tls is not None
    assert (tls.ca_certificates, tls.hostname, tls.check_hostname) == (pem, "vllm.example", checked)
