"""BackendTLSPolicy resolved: which backends are reached over TLS and how, the policy's conditions
per ancestor Gateway, precedence, and what a policy that cannot be applied does (its backends
answer 500, never plain text). No sockets: Envoy's side is the ``backend_tls`` golden case (ACKed
by real Envoy) and tests/e2e/test_up_backend_tls.py."""

from __future__ import annotations

import pytest

from kvgate.gateway.controlplane.kubernetes.status import desired_statuses
from kvgate.gateway.controlplane.resources import (
    BackendKind,
    ManifestError,
    ObjectKey,
    ResolvedBackend,
    ResourceRef,
    ValidatedConfig,
    validate,
)
from kvgate.gateway.controlplane.resources.backend_tls import BackendTls
from kvgate.gateway.controlplane.resources.validate import ValidationOptions
from kvgate.gateway.picker.tls import self_signed
from tests.gateway.controlplane.resources.manifests import base, load, pool_ref, route

CA_PEM = self_signed(("ca.example",)).cert_pem.decode()
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


def config_map(name: str, pem: str | None = CA_PEM) -> str:
    lines = "".join(f"      {line}\n" for line in (pem or "").splitlines())
    data = "{}" if pem is None else "\n    ca.crt: |\n" + lines
    return f"""
apiVersion: v1
kind: ConfigMap
metadata: {{name: {name}}}
data: {data}
"""


def service(name: str, port: int = 8443, port_name: str = "https") -> str:
    return f"""
apiVersion: v1
kind: Service
metadata: {{name: {name}, annotations: {{kvgate.io/endpoints: "10.9.0.1:{port}"}}}}
spec:
  ports: [{{name: {port_name}, port: {port}}}]
"""


def policy(name: str, target: str, validation: str, *, created: str | None = None,
           kind: str = "Service", group: str = '""', section: str | None = None) -> str:
    stamp = f", creationTimestamp: '{created}'" if created else ""
    section_part = f", sectionName: {section}" if section else ""
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: {name}{stamp}}}
spec:
  targetRefs: [{{group: {group}, kind: {kind}, name: {target}{section_part}}}]
  validation: {validation}
"""


CA_VALIDATION = ("{caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}], "
                 "hostname: api.internal.example}")
ROUTE_TO_API = route("r", "    - backendRefs: [{name: api, port: 8443}]")


def build(*documents: str, system_ca: str | None = SYSTEM_CA) -> ValidatedConfig:
    return validate(load(*base(), *documents), ValidationOptions(system_ca_file=system_ca))


def backend(config: ValidatedConfig, rule: int = 0, index: int = 0) -> ResolvedBackend:
    return config.routes[0].rules[rule].backends[index]


def conditions(config: ValidatedConfig, name: str) -> list[tuple[str | None, str, str, str]]:
    """(parent Gateway, type, status, reason) of the policy's entries."""
    return [(entry.parent.name if entry.parent else None, c.type, str(c.status), c.reason)
            for entry in config.status.entries
            if entry.resource == ResourceRef("BackendTLSPolicy", "default", name)
            for c in entry.conditions]


def test_a_service_governed_by_a_policy_is_reached_over_verified_tls() -> None:
    config = build(service("api"), config_map("ca"), policy("api-tls", "api", CA_VALIDATION), ROUTE_TO_API)
    found = backend(config)
    assert found.kind is BackendKind.SERVICE
    assert found.valid
    assert found.tls == BackendTls(ObjectKey("default", "api-tls"), "api.internal.example", CA_PEM, None)
    assert found.tls.verified_names == (("Hostname", "api.internal.example"),)
    assert conditions(config, "api-tls") == [
        ("gw", "Accepted", "True", "Accepted"), ("gw", "ResolvedRefs", "True", "ResolvedRefs")]


def test_subject_alt_names_replace_the_hostname_and_system_trusts_the_machines_bundle() -> None:
    validation = ("{wellKnownCACertificates: System, hostname: api.example, subjectAltNames: "
                  "[{type: Hostname, hostname: '*.example'}, {type: URI, uri: 'spiffe://td/ns/a/sa/b'}]}")
    config = build(service("api"), policy("p", "api", validation), ROUTE_TO_API)
    tls = backend(config).tls
    assert tls is not None
    assert tls.ca_pem is None
    assert tls.ca_file == SYSTEM_CA
    assert tls.verified_names == (("Hostname", "*.example"), ("URI", "spiffe://td/ns/a/sa/b"))
    # no bundle on the machine: the policy is not Accepted and its Service answers 500
    config = build(service("api"), policy("p", "api", validation), ROUTE_TO_API, system_ca=None)
    assert not backend(config).valid
    assert "no system CA certificates" in backend(config).reason
    assert ("gw", "Accepted", "False", "Invalid") in conditions(config, "p")


@pytest.mark.parametrize(("map_doc", "reason", "text"), [
    ("", "InvalidCACertificateRef", "ConfigMap default/ca not found"),
    (config_map("ca", None), "InvalidCACertificateRef", "has no ca.crt"),
    (config_map("ca", "not a certificate"), "InvalidCACertificateRef", "is not PEM certificates"),
])
def test_a_ca_reference_that_cannot_be_used_fails_the_connections_with_500(
        map_doc: str, reason: str, text: str) -> None:
    config = build(service("api"), *([map_doc] if map_doc else []), policy("p", "api", CA_VALIDATION),
                   ROUTE_TO_API)
    found = backend(config)
    assert found.kind is BackendKind.SERVICE
    assert not found.valid
    assert text in found.reason
    assert config.routes[0].rules[0].answers_500
    assert conditions(config, "p") == [("gw", "Accepted", "False", "NoValidCACertificate"),
                                       ("gw", "ResolvedRefs", "False", reason)]
    # (the route's own references resolve: its ResolvedRefs stays True)
    route_entry = next(e for e in config.status.entries if e.resource.kind == "HTTPRoute")
    refs = route_entry.get("ResolvedRefs")
    assert refs is not None
    assert refs.is_true


def test_a_reference_of_another_kind_is_invalid_kind() -> None:
    validation = "{caCertificateRefs: [{group: '', kind: Secret, name: ca}], hostname: a.example}"
    config = build(service("api"), policy("p", "api", validation), ROUTE_TO_API)
    assert not backend(config).valid
    assert ("gw", "ResolvedRefs", "False", "InvalidKind") in conditions(config, "p")


def test_the_older_policy_wins_and_the_other_is_conflicted() -> None:
    older = policy("z-older", "api", CA_VALIDATION, created="2026-01-01T00:00:00Z")
    newer = policy("a-newer", "api", "{wellKnownCACertificates: System, hostname: other.example}",
                   created="2026-02-01T00:00:00Z")
    config = build(service("api"), config_map("ca"), newer, older, ROUTE_TO_API)
    tls = backend(config).tls
    assert tls is not None
    assert tls.hostname == "api.internal.example"
    assert ("gw", "Accepted", "False", "Conflicted") in conditions(config, "a-newer")
    assert ("gw", "Accepted", "True", "Accepted") in conditions(config, "z-older")
    # same age: the first by name
    same = build(service("api"), config_map("ca"), policy("b", "api", CA_VALIDATION),
                 policy("a", "api", "{wellKnownCACertificates: System, hostname: a.example}"), ROUTE_TO_API)
    chosen = backend(same).tls
    assert chosen is not None
    assert chosen.hostname == "a.example"


def test_a_policy_on_a_port_wins_over_one_on_the_whole_service_and_other_ports_stay_plain() -> None:
    two_ports = """
apiVersion: v1
kind: Service
metadata: {name: api, annotations: {kvgate.io/endpoints: "10.9.0.1:8443"}}
spec:
  ports: [{name: https, port: 8443}, {name: http, port: 8080}]
"""
    rules = "    - backendRefs: [{name: api, port: 8443}]\n    - backendRefs: [{name: api, port: 8080}]"
    whole = policy("whole", "api", "{wellKnownCACertificates: System, hostname: whole.example}",
                   created="2026-01-01T00:00:00Z")
    on_port = policy("port", "api", CA_VALIDATION, section="https", created="2026-03-01T00:00:00Z")
    config = build(two_ports, config_map("ca"), whole, on_port, route("r", rules))
    assert backend(config, 0).tls.hostname == "api.internal.example"  # type: ignore[union-attr]
    assert backend(config, 1).tls.hostname == "whole.example"  # type: ignore[union-attr]
    alone = build(two_ports, config_map("ca"), on_port, route("r", rules))
    assert backend(alone, 0).tls is not None
    assert backend(alone, 1).tls is None
    unknown = build(two_ports, config_map("ca"), policy("p", "api", CA_VALIDATION, section="grpc"),
                    route("r", rules))
    assert ("gw", "Accepted", "False", "TargetNotFound") in conditions(unknown, "p")


def test_a_pool_governed_by_a_policy_has_it_and_a_broken_one_leaves_the_pool_unusable() -> None:
    as_pool = {"kind": "InferencePool", "group": "inference.networking.k8s.io"}
    rules = f"    - backendRefs: [{pool_ref('pool-a')}]"
    config = build(config_map("ca"), policy("p", "pool-a", CA_VALIDATION, **as_pool), route("r", rules))
    found = config.pool(backend(config).key)
    assert found is not None
    assert found.backend_tls is not None
    assert found.backend_tls.hostname == "api.internal.example"
    assert conditions(config, "p")[0] == ("gw", "Accepted", "True", "Accepted")
    broken = build(policy("p", "pool-a", CA_VALIDATION, **as_pool), route("r", rules))
    assert not backend(broken).valid
    assert broken.pool(backend(broken).key) is None
    pool_entry = next(e for e in broken.status.entries if e.resource.kind == "InferencePool"
                      and e.resource.name == "pool-a")
    refs = pool_entry.get("ResolvedRefs")
    assert refs is not None
    assert not refs.is_true
    assert "BackendTLSPolicy default/p" in refs.message


def test_targets_that_do_not_exist_or_are_not_supported_are_reported() -> None:
    config = build(policy("missing", "nope", CA_VALIDATION), config_map("ca"),
                   policy("gw-target", "gw", CA_VALIDATION, kind="Gateway",
                          group="gateway.networking.k8s.io"))
    assert conditions(config, "missing")[0] == (None, "Accepted", "False", "TargetNotFound")
    assert conditions(config, "gw-target")[0] == (None, "Accepted", "False", "Invalid")


@pytest.mark.parametrize(("validation", "message"), [
    ("{hostname: a.example}", "must specify either CACertificateRefs or WellKnownCACertificates"),
    ("{wellKnownCACertificates: System, caCertificateRefs: [{group: '', kind: ConfigMap, name: ca}], "
     "hostname: a.example}", "must not contain both"),
    ("{wellKnownCACertificates: System, hostname: '*.example'}", "hostname"),
    ("{wellKnownCACertificates: System, hostname: a.example, subjectAltNames: [{type: URI, hostname: a}]}",
     "must contain URI"),
])
def test_what_the_crd_refuses_is_refused_at_load(validation: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        load(policy("p", "api", validation))


def test_options_kvgate_does_not_use_are_named_in_the_condition() -> None:
    text = policy("p", "api", CA_VALIDATION) + "  options: {example.com/min-tls: '1.3'}\n"
    config = build(service("api"), config_map("ca"), text, ROUTE_TO_API)
    entry = next(e for e in config.status.entries if e.resource.kind == "BackendTLSPolicy")
    accepted = entry.get("Accepted")
    assert accepted is not None
    assert accepted.is_true
    assert "example.com/min-tls" in accepted.message


def test_the_earlier_api_version_loads_too() -> None:
    text = policy("p", "api", CA_VALIDATION).replace("networking.k8s.io/v1", "networking.k8s.io/v1alpha3")
    assert len(load(text).backend_tls_policies) == 1


def test_status_written_to_the_cluster_names_each_ancestor_gateway() -> None:
    config = build(service("api"), config_map("ca"), policy("api-tls", "api", CA_VALIDATION), ROUTE_TO_API)
    written = desired_statuses(config.status)[ResourceRef("BackendTLSPolicy", "default", "api-tls")]
    (ancestor,) = written["ancestors"]
    assert ancestor["ancestorRef"] == {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                       "namespace": "default", "name": "gw"}
    assert ancestor["controllerName"] == "kvgate.io/gateway-controller"
    assert [c["type"] for c in ancestor["conditions"]] == ["Accepted", "ResolvedRefs"]


def test_a_policy_on_another_pickers_service_verifies_it_and_reports_to_the_pools_gateways() -> None:
    epp = """
apiVersion: v1
kind: Service
metadata: {name: other-epp, annotations: {kvgate.io/endpoints: "10.8.0.1:9002"}}
spec:
  ports: [{name: grpc, port: 9002}]
"""
    external_pool = """
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: external}
spec:
  selector: {matchLabels: {app: external}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: other-epp, port: {number: 9002}}
"""
    route_to_pool = route("r", f"    - backendRefs: [{pool_ref('external')}]")
    config = build(epp, external_pool, config_map("ca"), policy("epp-tls", "other-epp", CA_VALIDATION),
                   route_to_pool)
    found = config.pool(ObjectKey("default", "external"))
    assert found is not None
    assert found.picker.tls is not None
    assert found.picker.tls.hostname == "api.internal.example"
    assert conditions(config, "epp-tls")[0] == ("gw", "Accepted", "True", "Accepted")
    broken = build(epp, external_pool, policy("epp-tls", "other-epp", CA_VALIDATION), route_to_pool)
    assert broken.pool(ObjectKey("default", "external")) is None  # (never reached on less)
