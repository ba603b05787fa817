"""HTTPS listeners: the certificate a listener's ``tls.certificateRefs`` names, read and checked before
Envoy sees it (a certificate Envoy cannot load would make it reject every listener's update)."""

from __future__ import annotations

import base64

import pytest

from kvgate.gateway.controlplane.resources import ResourceRef, validate
from kvgate.gateway.controlplane.resources.conditions import ConditionStatus, ConditionType
from kvgate.gateway.picker.tls import KeyPair, self_signed
from tests.gateway.controlplane.resources.manifests import build, load

GW = ResourceRef("Gateway", "default", "gw")


def gateway(*listeners: str) -> str:
    head = ("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw}\n"
            "spec:\n  gatewayClassName: kvgate\n  listeners:\n")
    return head + "".join(f"    - {ls}\n" for ls in listeners)


def https(name: str = "https", port: int = 8443, secret: str = "cert", extra: str = "") -> str:
    return (f"{{name: {name}, port: {port}, protocol: HTTPS{extra}, "
            f"tls: {{certificateRefs: [{{name: {secret}}}]}}}}")


def secret(
    pair: KeyPair, name: str = "cert", namespace: str = "default", *, string_data: bool = False
) -> str:
    if string_data:
        def block(pem: bytes) -> str:
            return "|\n" + "".join(f"    {line}\n" for line in pem.decode().splitlines())
        data = f"stringData:\n  tls.crt: {block(pair.cert_pem)}  tls.key: {block(pair.key_pem)}"
    else:
        pems = (("crt", pair.cert_pem), ("key", pair.key_pem))
        encoded = {k: base64.b64encode(v).decode() for k, v in pems}
        data = f"data:\n  tls.crt: {encoded['crt']}\n  tls.key: {encoded['key']}\n"
    return (f"apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\n"
            f"type: kubernetes.io/tls\n{data}")


def listener_conditions(config: object, section: str) -> dict[str, tuple[ConditionStatus, str]]:
    entries = {entry.section: entry for entry in config.status.for_resource(GW)}  # type: ignore[attr-defined]
    return {c.type: (c.status, c.reason) for c in entries[section].conditions}


@pytest.mark.parametrize("string_data", [False, True])
def test_an_https_listener_serves_the_certificate_of_its_secret(string_data: bool) -> None:
    pair = self_signed(("llm.example.com",))
    config = build(gateway(https(extra=", hostname: llm.example.com")), secret(pair, string_data=string_data))
    (resolved,) = config.gateways
    (listener,) = resolved.listeners
    assert listener.certificate is not None
    assert listener.certificate.certificate_chain == pair.cert_pem.decode()
    assert listener.certificate.private_key == pair.key_pem.decode()
    assert "PRIVATE" not in repr(listener.certificate)  # never in a log line
    conditions = listener_conditions(config, "https")
    assert conditions[ConditionType.RESOLVED_REFS] == (ConditionStatus.TRUE, "ResolvedRefs")
    assert conditions[ConditionType.PROGRAMMED] == (ConditionStatus.TRUE, "Programmed")


def test_a_certificate_that_cannot_be_served_costs_its_listener_alone() -> None:
    pair, other = self_signed(), self_signed()
    mismatched = KeyPair(key_pem=other.key_pem, cert_pem=pair.cert_pem)
    garbage = KeyPair(key_pem=pair.key_pem, cert_pem=b"not a certificate")
    config = build(
        gateway("{name: http, port: 8080, protocol: HTTP}", https("missing", 8443, "nope"),
                https("mismatched", 8444, "mismatched"), https("garbage", 8445, "garbage"),
                "{name: bare, port: 8446, protocol: HTTPS}"),
        secret(mismatched, "mismatched"), secret(garbage, "garbage"),
    )
    (resolved,) = config.gateways
    assert [listener.name for listener in resolved.listeners] == ["http"]
    for section, words in (("missing", "not found"), ("mismatched", "not the certificate's key"),
                           ("garbage", "not a PEM certificate"), ("bare", "needs tls.certificateRefs")):
        conditions = listener_conditions(config, section)
        assert conditions[ConditionType.ACCEPTED] == (ConditionStatus.TRUE, "Accepted"), section
        assert conditions[ConditionType.RESOLVED_REFS] == (ConditionStatus.FALSE, "InvalidCertificateRef")
        assert conditions[ConditionType.PROGRAMMED][0] is ConditionStatus.FALSE
        message = next(e for e in config.status.for_resource(GW) if e.section == section).get(
            ConditionType.RESOLVED_REFS)
        assert message is not None
        assert words in message.message
        assert "PRIVATE KEY" not in message.message


def test_a_secret_in_another_namespace_needs_a_reference_grant() -> None:
    pair = self_signed()
    listener = ("{name: https, port: 8443, protocol: HTTPS, "
                "tls: {certificateRefs: [{name: cert, namespace: certs}]}}")
    config = build(gateway(listener), secret(pair, namespace="certs"))
    assert config.gateways == ()
    assert listener_conditions(config, "https")[ConditionType.RESOLVED_REFS] == (
        ConditionStatus.FALSE, "RefNotPermitted")
    grant = """apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: gateways, namespace: certs}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: default}]
  to: [{group: "", kind: Secret}]
"""
    config = build(gateway(listener), secret(pair, namespace="certs"), grant)
    (resolved,) = config.gateways
    assert resolved.listeners[0].certificate is not None


def test_http_and_https_cannot_share_a_port_and_https_terminates() -> None:
    pair = self_signed()
    config = build(gateway("{name: http, port: 8443, protocol: HTTP}", https()), secret(pair))
    conditions = listener_conditions(config, "https")
    assert conditions[ConditionType.CONFLICTED] == (ConditionStatus.TRUE, "ProtocolConflict")
    passthrough = ("{name: https, port: 8443, protocol: HTTPS, "
                   "tls: {mode: Passthrough, certificateRefs: [{name: cert}]}}")
    config = build(gateway(passthrough), secret(pair))
    assert listener_conditions(config, "https")[ConditionType.ACCEPTED] == (
        ConditionStatus.FALSE, "UnsupportedValue")


def test_a_listener_whose_secret_breaks_goes_on_serving_its_last_good_certificate() -> None:
    pair = self_signed()
    good = build(gateway(https()), secret(pair))
    broken_pair = KeyPair(key_pem=self_signed().key_pem, cert_pem=pair.cert_pem)
    resources = load(gateway(https()), secret(broken_pair))
    config = validate(resources, last_good=good.certificates())
    (resolved,) = config.gateways
    assert resolved.listeners[0].certificate == good.gateways[0].listeners[0].certificate
    conditions = listener_conditions(config, "https")
    assert conditions[ConditionType.PROGRAMMED] == (ConditionStatus.TRUE, "Programmed")
    assert conditions[ConditionType.RESOLVED_REFS] == (ConditionStatus.FALSE, "InvalidCertificateRef")
    message = next(e for e in config.status.for_resource(GW) if e.section == "https").get(
        ConditionType.RESOLVED_REFS)
    assert message is not None
    assert "serving the last good certificate (from Secret default/cert)" in message.message
    assert validate(resources).gateways == ()  # without one (a fresh start): not served
