from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.gateway.controlplane.resources import (
    ManifestError,
    ObjectKey,
    load_directory,
    parse_duration,
    parse_manifests,
)
from kvgate.gateway.controlplane.resources.core import check_address, format_address
from kvgate.policies.errors import ConfigError
from kvgate.policies.types import FailureMode

FIXTURES = Path(__file__).parent / "fixtures" / "quickstart"

ROUTE_HEAD = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r}
spec:
  parentRefs: [{name: gw}]
"""


def test_quickstart_directory_parses_every_kind() -> None:
    resources = load_directory(FIXTURES)
    (gateway,) = resources.gateways
    assert gateway.spec.gateway_class_name == "kvgate"
    assert gateway.spec.listeners[0].port == 80
    assert gateway.metadata.namespace == "default"
    (route,) = resources.http_routes
    (ref,) = route.spec.rules[0].backend_refs
    assert (ref.group, ref.kind, ref.name, ref.weight) == (
        "inference.networking.k8s.io",
        "InferencePool",
        "vllm-llama3-8b-instruct",
        1,
    )
    assert route.spec.rules[0].timeouts is not None
    assert route.spec.rules[0].timeouts.request_seconds == 300.0
    (pool,) = resources.inference_pools
    assert pool.spec.endpoint_picker_ref.port_number == 9002
    assert pool.spec.endpoint_picker_ref.failure_mode is FailureMode.FAIL_CLOSE
    assert pool.observed_generation == 3
    assert [p.number for p in pool.spec.target_ports] == [8000]
    assert {o.metadata.name: o.spec.effective_priority for o in resources.objectives} == {
        "food-review": 10,
        "batch": -1,
        "default-priority": 0,
    }
    (rewrite,) = resources.rewrites
    assert rewrite.spec.rules[0].weighted_targets == (("food-review-1", 90), ("food-review-2", 10))
    assert rewrite.spec.rules[1].weighted_targets == (("meta-llama/Llama-3.1-8B-Instruct", 1),)
    assert len(resources.pods) == 5  # the kubectl List was expanded
    assert resources.pods[0].metadata.creation_timestamp == "2025-06-01T10:00:00Z"  # stays a string
    assert [svc.metadata.name for svc in resources.services] == ["vllm-llama3-8b-instruct-epp"]
    assert any("Deployment" in note for note in resources.notes)
    assert resources.sources[pool.ref] == "pool.yaml (document 0)"
    assert resources.content_hash


def test_same_content_same_hash_and_changed_content_new_hash() -> None:
    text = (FIXTURES / "gateway.yaml").read_text()
    first = parse_manifests([("a.yaml", text)])
    assert parse_manifests([("a.yaml", text)]).content_hash == first.content_hash
    assert parse_manifests([("a.yaml", text + "\n# edit\n")]).content_hash != first.content_hash


def test_syntax_error_names_file_and_line() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifests([("good.yaml", ROUTE_HEAD), ("bad.yaml", "kind: [unclosed\n")])
    (problem,) = info.value.problems
    assert problem.source == "bad.yaml"
    assert "not valid YAML" in problem.message
    assert isinstance(info.value, ConfigError)


def test_schema_error_names_file_document_and_field() -> None:
    text = ROUTE_HEAD + "  rules: [{backendRefs: [{name: svc, port: 80, weight: -1}]}]\n"
    with pytest.raises(ManifestError) as info:
        parse_manifests([("ok.yaml", "---\n"), ("routes.yaml", "---\n# empty\n---\n" + text)])
    (problem,) = info.value.problems
    assert (problem.source, problem.document) == ("routes.yaml", 1)
    assert "HTTPRoute r" in problem.message
    assert "weight" in problem.message
    assert "routes.yaml (document 1)" in str(info.value)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("  rules: [{backendRefs: [{name: svc, port: 80, wieght: 2}]}]", "wieght"),
        ("  rules: [{matches: [{path: {type: Prefix, value: /}}]}]", "type"),
        ("  rules: [{matches: [{path: {value: v1}}]}]", "must start with '/'"),
        ("  rules: [{matches: [{headers: [{name: 'bad header', value: x}]}]}]", "name"),
        ("  rules: [{timeouts: {request: 10 seconds}}]", "duration"),
        ("  rules: [{timeouts: {request: 1s, backendRequest: 2s}}]", "backendRequest"),
        (
            "  rules: [{matches: [{path: {type: Exact, value: /a}}], filters: [{type: URLRewrite, "
            "urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]}]",
            "ReplacePrefixMatch",
        ),
        ("  rules: [{filters: [{type: URLRewrite}]}]", "urlRewrite"),
        ("  rules: [{filters: [{type: RequestRedirect}]}]", "requestRedirect"),
        ("  rules: [{filters: [{type: ResponseHeaderModifier}]}]", "responseHeaderModifier"),
        ("  rules: [{filters: [{type: RequestRedirect, requestRedirect: {statusCode: 304}}]}]", "statusCode"),
        ("  rules: [{filters: [{type: RequestRedirect, requestRedirect: {scheme: ftp}}]}]", "scheme"),
        ("  rules: [{filters: [{type: RequestRedirect, requestRedirect: {port: 0}}]}]", "port"),
        # a hostname that could carry anything but a host into the Location (or the Host)
        ('  rules: [{filters: [{type: RequestRedirect, requestRedirect: {hostname: "a.com\\r\\nx: y"}}]}]',
         "hostname"),
        ('  rules: [{filters: [{type: URLRewrite, urlRewrite: {hostname: "*.example.com"}}]}]', "hostname"),
        (
            "  rules: [{matches: [{path: {type: Exact, value: /a}}], filters: [{type: RequestRedirect, "
            "requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]}]",
            "ReplacePrefixMatch",
        ),
        (
            "  rules: [{filters: [{type: RequestRedirect, requestRedirect: {hostname: a.com}}, "
            "{type: URLRewrite, urlRewrite: {hostname: b.com}}]}]",
            "not both",
        ),
        (
            "  rules: [{filters: [{type: ResponseHeaderModifier, responseHeaderModifier: {remove: [a]}}, "
            "{type: ResponseHeaderModifier, responseHeaderModifier: {remove: [b]}}]}]",
            "once per rule",
        ),
    ],
)
def test_route_schema_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ManifestError, match=fragment):
        parse_manifests([("r.yaml", ROUTE_HEAD + spec + "\n")])


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("targetPorts: [], selector: {matchLabels: {a: b}}, endpointPickerRef: {name: e}", "targetPorts"),
        (
            "targetPorts: [{number: 1}, {number: 2}, {number: 3}, {number: 4}, {number: 5}, {number: 6}, "
            "{number: 7}, {number: 8}, {number: 9}], selector: {matchLabels: {a: b}}, "
            "endpointPickerRef: {name: e}",
            "targetPorts",
        ),
        (
            "targetPorts: [{number: 1}, {number: 1}], selector: {matchLabels: {a: b}}, "
            "endpointPickerRef: {name: e}",
            "unique",
        ),
        (
            "targetPorts: [{number: 1}], selector: {matchLabels: {a: b}}, "
            "endpointPickerRef: {name: e, failureMode: Maybe}",
            "failureMode",
        ),
        (
            "targetPorts: [{number: 70000}], selector: {matchLabels: {a: b}}, endpointPickerRef: {name: e}",
            "number",
        ),
        ("targetPorts: [{number: 1}], endpointPickerRef: {name: e}", "selector"),
        ("targetPorts: [{number: 1}], selector: {matchLabels: {}}, endpointPickerRef: {name: e}", "selector"),
        (
            "targetPorts: [{number: 1}], selector: {matchExpressions: [{key: a, operator: In}]}, "
            "endpointPickerRef: {name: e}",
            "needs values",
        ),
        (
            "targetPorts: [{number: 1}], selector: {matchLabels: {a: b}}, appProtocol: grpc, "
            "endpointPickerRef: {name: e}",
            "appProtocol",
        ),
    ],
)
def test_pool_schema_errors(spec: str, fragment: str) -> None:
    head = "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: p}\n"
    text = f"{head}spec: {{{spec}}}\n"
    with pytest.raises(ManifestError, match=fragment):
        parse_manifests([("p.yaml", text)])


def test_eight_target_ports_and_port_number_alias() -> None:
    ports = ", ".join(f"{{number: {8000 + i}}}" for i in range(8))
    text = (
        "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
        "metadata: {name: p, namespace: ml}\n"
        f"spec: {{targetPorts: [{ports}], selector: {{matchLabels: {{a: b}}}}, "
        "endpointPickerRef: {name: e, portNumber: 9100, failureMode: FailOpen}}\n"
    )
    (pool,) = parse_manifests([("p.yaml", text)]).inference_pools
    assert len(pool.spec.target_ports) == 8
    assert pool.spec.endpoint_picker_ref.port_number == 9100
    assert pool.spec.endpoint_picker_ref.failure_mode is FailureMode.FAIL_OPEN
    assert pool.key == ObjectKey("ml", "p")
    assert pool.spec.app_protocol == "http"  # (the Inference Extension's default)
    h2c = text.replace("targetPorts:", "appProtocol: kubernetes.io/h2c, targetPorts:")
    assert parse_manifests([("p.yaml", h2c)]).inference_pools[0].spec.app_protocol == "kubernetes.io/h2c"


def test_rewrite_weights_all_or_none() -> None:
    text = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: rw}
spec:
  poolRef: {name: p}
  rules:
    - matches: [{model: {value: a}}]
      targets: [{modelRewrite: a1, weight: 5}, {modelRewrite: a2}]
"""
    with pytest.raises(ManifestError, match="all targets"):
        parse_manifests([("rw.yaml", text)])


def test_duplicates_across_files_are_refused() -> None:
    text = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nstatus: {podIP: 10.0.0.1}\n"
    with pytest.raises(ManifestError, match=r"also defined in a\.yaml \(document 0\)"):
        parse_manifests([("a.yaml", text), ("b.yaml", text)])


def test_nested_lists_and_missing_kind() -> None:
    nested = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "PodList",
                "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}],
            }
        ],
    }
    import json

    resources = parse_manifests([("l.yaml", json.dumps(nested))])
    assert [pod.metadata.name for pod in resources.pods] == ["p"]
    with pytest.raises(ManifestError, match="apiVersion and kind"):
        parse_manifests([("x.yaml", "metadata: {name: x}\n")])
    with pytest.raises(ManifestError, match="mapping"):
        parse_manifests([("x.yaml", "- a\n- b\n")])


def test_unknown_api_version_of_a_known_kind_is_ignored_with_a_note() -> None:
    text = "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferencePool\nmetadata: {name: old}\n"
    resources = parse_manifests([("old.yaml", text)])
    assert resources.inference_pools == ()
    assert "InferencePool" in resources.notes[0]


def test_directory_walk_is_recursive_and_skips_hidden_and_other_files(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    pod = "apiVersion: v1\nkind: Pod\nmetadata: {{name: {}}}\n"
    (tmp_path / "sub" / "deeper" / "a.yml").write_text(pod.format("a"))
    (tmp_path / "b.yaml").write_text(pod.format("b"))
    (tmp_path / ".hidden.yaml").write_text("broken: [")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "c.yaml").write_text("broken: [")
    (tmp_path / "README.md").write_text("not yaml: [")
    resources = load_directory(tmp_path)
    assert sorted(pod.metadata.name for pod in resources.pods) == ["a", "b"]
    assert resources.sources[resources.pods[0].ref].startswith("b.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_directory(tmp_path / "missing")


def test_durations_and_addresses() -> None:
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("0s") == 0.0
    with pytest.raises(ValueError, match="duration"):
        parse_duration("1.5s")
    assert format_address("fd00::1", 8000) == "[fd00::1]:8000"
    assert check_address("[fd00::1]:8000") == "[fd00::1]:8000"
    with pytest.raises(ValueError, match="IP address"):
        check_address("localhost:80")


def test_llm_ds_group_objectives_and_rewrites_load_and_win_over_the_inference_extensions() -> None:
    def objective(group: str, name: str, priority: int) -> str:
        return (f"apiVersion: {group}/v1alpha2\nkind: InferenceObjective\nmetadata: {{name: {name}}}\n"
                f"spec: {{priority: {priority}, poolRef: {{name: p}}}}\n---\n")

    rewrite = ("apiVersion: llm-d.ai/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: r}\n"
               "spec: {poolRef: {name: p}, rules: [{matches: [{model: {value: a}}], "
               "targets: [{modelRewrite: b}]}]}\n")
    text = (objective("inference.networking.x-k8s.io", "x", 5) + objective("llm-d.ai", "x", 7)
            + objective("llm-d.ai", "y", -1) + rewrite)
    resources = parse_manifests([("o.yaml", text)])
    assert sorted((o.metadata.name, o.spec.priority) for o in resources.objectives) == [("x", 7), ("y", -1)]
    assert [r.metadata.name for r in resources.rewrites] == ["r"]
    assert any("llm-d.ai's is used" in note for note in resources.notes)
    # whichever comes first
    reverse = objective("llm-d.ai", "x", 7) + objective("inference.networking.x-k8s.io", "x", 5)
    assert [o.spec.priority for o in parse_manifests([("o.yaml", reverse)]).objectives] == [7]
    with pytest.raises(ManifestError, match="also defined"):  # twice in one group: kubectl's refusal
        parse_manifests([("o.yaml", objective("llm-d.ai", "x", 7) + objective("llm-d.ai", "x", 8))])
