"""docs/operations.md's HTTPRoute example (ExternalAuth, CORS, RequestMirror, sessionPersistence,
retry on one rule) loads as written, is Accepted with every reference resolved, and translates
without a warning (each feature's Envoy configuration is ACKed by real Envoy in the golden cases)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kvgate.gateway.controlplane.translate import TranslationSettings, translate
from kvgate.gateway.picker.tls import self_signed
from tests.gateway.controlplane.resources.manifests import EPP_SERVICE, GATEWAY, build, pod, pool

DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def example_rules() -> str:
    section = DOC.read_text(encoding="utf-8").split("## Who may call", 1)[1]
    block: str = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)[0]
    return block


def test_the_documented_rule_is_accepted_and_envoy_takes_it() -> None:
    rules = yaml.safe_load(example_rules())["rules"]
    route = yaml.safe_dump({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "documented", "namespace": "default"},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": rules},
    })
    api_keys = ("apiVersion: v1\nkind: Service\nmetadata:\n  name: api-keys\n  namespace: default\n"
                "  annotations: {kvgate.io/endpoints: \"10.9.0.1:8080\"}\nspec:\n  ports: [{port: 8080}]\n")
    config = build(GATEWAY, EPP_SERVICE, pool("llama"), pool("llama-next"), pod("l-1", "llama", "10.0.0.1"),
                   pod("n-1", "llama-next", "10.0.0.2"), api_keys, route)
    assert config.status.problem_lines() == ()
    assert [route.key.name for route in config.routes] == ["documented"]
    resources = translate(config, TranslationSettings(picker_addresses=("127.0.0.1:9002",)))
    assert not resources.warnings, resources.warnings


def test_the_documented_backend_tls_policy_is_accepted_and_applied() -> None:
    section = DOC.read_text(encoding="utf-8").split("The Gateway API's way", 1)[1]
    block: str = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)[0]
    ca = self_signed(("vllm.models.svc",)).cert_pem.decode()
    documents = list(yaml.safe_load_all(block))
    documents[0]["data"]["ca.crt"] = ca  # (the placeholder: a certificate of one's own)
    config = build(GATEWAY, EPP_SERVICE, pool("llama"), pod("l-1", "llama", "10.0.0.1"),
                   *(yaml.safe_dump(doc) for doc in documents),
                   "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r}\n"
                   "spec: {parentRefs: [{name: gw}], rules: [{backendRefs: [{group: "
                   "inference.networking.k8s.io, kind: InferencePool, name: llama}]}]}\n")
    assert config.status.problem_lines() == ()
    found = config.pool(config.routes[0].rules[0].backends[0].key)
    assert found is not None
    assert found.backend_tls is not None
    assert found.backend_tls.hostname == "vllm.models.svc"
