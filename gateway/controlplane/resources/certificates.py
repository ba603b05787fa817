"""An HTTPS listener's certificate: its ``tls.certificateRefs`` resolved to a Secret, read and checked.

Checked here rather than left to Envoy: a certificate Envoy cannot load makes it reject the whole
listener update (every listener keeps its old configuration, and nothing new is served), so a bad
Secret must cost its own listener only. kvgate reads PEM certificate chains and unencrypted PEM
private keys (RSA, EC, Ed25519), and the key must be the first certificate's. The first reference is
used (the Gateway API's Core support is one reference; more are implementation-specific).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgate.gateway.controlplane.resources.conditions import Reason
from kvgate.gateway.controlplane.resources.core import TLS_CERT_KEY, TLS_PRIVATE_KEY, Secret
from kvgate.gateway.controlplane.resources.gateway_api import CORE_GROUP, GATEWAY_GROUP, Gateway, Listener
from kvgate.gateway.controlplane.resources.loader import ResourceSet
from kvgate.gateway.controlplane.resources.meta import ObjectKey

TLS_SECRET_TYPE = "kubernetes.io/tls"
"""The Secrets a certificateRef may name (the Gateway API's Core support; in a cluster kvgate
follows those alone)."""


@dataclass(frozen=True, slots=True)
class ListenerCertificate:
    """A certificate chain and its private key, PEM, from ``secret``."""

    secret: ObjectKey
    certificate_chain: str
    private_key: str

    def __repr__(self) -> str:  # never the key in a log line or a traceback
        return f"ListenerCertificate({self.secret})"


def not_after(certificate: ListenerCertificate) -> float:
    """When the chain's first certificate expires (Unix seconds)."""
    from cryptography import x509  # (imported on first use: most gateways serve HTTP alone)

    first = x509.load_pem_x509_certificates(certificate.certificate_chain.encode())[0]
    return first.not_valid_after_utc.timestamp()


@dataclass(frozen=True, slots=True)
class CertificateProblem:
    """Why a listener has no certificate: the ResolvedRefs reason and a message (never key material)."""

    reason: Reason
    message: str


def listener_certificate(
    resources: ResourceSet, gateway: Gateway, listener: Listener
) -> ListenerCertificate | CertificateProblem:
    """The certificate an HTTPS ``listener`` of ``gateway`` serves, or why it has none."""
    tls = listener.tls
    if tls is None or not tls.certificate_refs:
        return _invalid("an HTTPS listener needs tls.certificateRefs")
    ref = tls.certificate_refs[0]
    namespace = ref.namespace or gateway.metadata.namespace
    key = ObjectKey(namespace, ref.name)
    if ref.group != CORE_GROUP or ref.kind != "Secret":
        return _invalid(f"certificateRef {ref.group or 'core'}/{ref.kind}: only Secrets")
    if namespace != gateway.metadata.namespace and not _granted(resources, gateway, key):
        return CertificateProblem(Reason.REF_NOT_PERMITTED, f"Secret {key}: no ReferenceGrant allows it")
    secret = next((s for s in resources.secrets if s.key == key), None)
    if secret is None:
        return _invalid(f"Secret {key} not found (kvgate reads Secrets of type {TLS_SECRET_TYPE})")
    if secret.type != TLS_SECRET_TYPE:
        return _invalid(f"Secret {key} is of type {secret.type}, not {TLS_SECRET_TYPE}")
    return _read(secret)


def _granted(resources: ResourceSet, gateway: Gateway, secret: ObjectKey) -> bool:
    for grant in resources.reference_grants:
        if grant.metadata.namespace != secret.namespace:
            continue
        from_ok = any(f.group == GATEWAY_GROUP and f.kind == "Gateway"
                      and f.namespace == gateway.metadata.namespace for f in grant.spec.from_)
        to_ok = any(t.group == CORE_GROUP and t.kind == "Secret" and t.name in (None, secret.name)
                    for t in grant.spec.to)
        if from_ok and to_ok:
            return True
    return False


def _read(secret: Secret) -> ListenerCertificate | CertificateProblem:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    chain, private_key = secret.value(TLS_CERT_KEY), secret.value(TLS_PRIVATE_KEY)
    if chain is None or private_key is None:
        return _invalid(
            f"Secret {secret.key} needs {TLS_CERT_KEY} and {TLS_PRIVATE_KEY} (base64 in data, or stringData)"
        )
    try:
        certificates = x509.load_pem_x509_certificates(chain.encode())
    except ValueError:
        return _invalid(f"Secret {secret.key}: {TLS_CERT_KEY} is not a PEM certificate chain")
    try:
        loaded = serialization.load_pem_private_key(private_key.encode(), password=None)
    except (ValueError, TypeError):  # (TypeError: an encrypted key)
        return _invalid(f"Secret {secret.key}: {TLS_PRIVATE_KEY} is not an unencrypted PEM private key")
    public = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if loaded.public_key().public_bytes(*public) != certificates[0].public_key().public_bytes(*public):
        return _invalid(f"Secret {secret.key}: {TLS_PRIVATE_KEY} is not the certificate's key")
    return ListenerCertificate(secret.key, chain, private_key)


def _invalid(message: str) -> CertificateProblem:
    return CertificateProblem(Reason.INVALID_CERTIFICATE_REF, message)
