"""BackendTLSPolicies resolved: which backend is reached over TLS, verified how, and each policy's
conditions. Pure, over a :class:`ResourceSet`.

A policy targets Services of its namespace (the Gateway API's Extended support; ``sectionName``
one port of it, by name) or InferencePools (kvgate's implementation-specific support: the pool's
model servers, for Envoy and for the picker's own requests to them). Where several policies target
one Service port or pool, the oldest wins, then the first by name; the others are
``Accepted: False, Conflicted``. A policy naming a port wins over one naming the whole Service.

What a policy asks of the connection (:class:`BackendTls`): SNI ``hostname``; the server's
certificate verified against the CA certificates of its ConfigMaps (key ``ca.crt``) or, with
``wellKnownCACertificates: System``, the system's; and it must name ``subjectAltNames`` (any one),
else ``hostname``. A policy that cannot be applied as written (an unknown ``wellKnownCACertificates``,
a CA reference that does not resolve or is not PEM) still governs its targets
(:class:`BrokenBackendTls`): their requests get HTTP 500, never a connection in plain text or one
verified against less than the policy names (the Gateway API: "connections using an invalid
CACertificateRef MUST fail").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kvgate.gateway.controlplane.resources.backend_tls_policy import BackendTLSPolicy
from kvgate.gateway.controlplane.resources.conditions import Condition, ConditionType, Reason, condition
from kvgate.gateway.controlplane.resources.core import CA_CERT_KEY
from kvgate.gateway.controlplane.resources.gateway_api import CORE_GROUP, INFERENCE_GROUP
from kvgate.gateway.controlplane.resources.loader import ResourceSet
from kvgate.gateway.controlplane.resources.meta import ObjectKey

SERVICE = "Service"
INFERENCE_POOL = "InferencePool"
SUPPORTED_TARGETS = {(CORE_GROUP, SERVICE), (INFERENCE_GROUP, INFERENCE_POOL)}
WELL_KNOWN_SYSTEM = "System"


@dataclass(frozen=True, slots=True)
class BackendTls:
    """TLS to a backend as ``policy`` asks it: SNI ``hostname``; the certificate chain verified
    against ``ca_pem`` (its ConfigMaps') or ``ca_file`` (the system's CA certificates, a file on
    Envoy's and the picker's disk) and naming one of ``subject_alt_names`` (``("Hostname" | "URI",
    value)``; none given: ``hostname``)."""

    policy: ObjectKey
    hostname: str
    ca_pem: str | None
    ca_file: str | None = None
    subject_alt_names: tuple[tuple[str, str], ...] = ()

    @property
    def verified_names(self) -> tuple[tuple[str, str], ...]:
        """The names the certificate must carry one of."""
        return self.subject_alt_names or (("Hostname", self.hostname),)

    def __repr__(self) -> str:  # (not the CA bundle)
        return f"BackendTls({self.policy}, hostname={self.hostname!r})"


@dataclass(frozen=True, slots=True)
class BrokenBackendTls:
    """A policy that governs a backend but cannot be applied: its requests answer 500."""

    policy: ObjectKey
    message: str


TargetKey = tuple[str, ObjectKey, str | None]
"""(``Service`` | ``InferencePool``, the object, a Service port's name or None)."""


@dataclass(frozen=True, slots=True)
class PolicyJudgement:
    """One policy's conditions (before its ancestors are known) and the objects it targets."""

    policy: BackendTLSPolicy
    accepted: Condition
    resolved_refs: Condition
    targets: tuple[tuple[str, ObjectKey], ...]


@dataclass(frozen=True, slots=True)
class BackendTlsPolicies:
    by_target: Mapping[TargetKey, BackendTls | BrokenBackendTls] = field(
        default_factory=lambda: MappingProxyType({}))
    judged: tuple[PolicyJudgement, ...] = ()

    def for_service(self, key: ObjectKey, port_name: str | None) -> BackendTls | BrokenBackendTls | None:
        """The policy for a Service port (named by ``port_name``), else for the whole Service."""
        found = self.by_target.get((SERVICE, key, port_name)) if port_name else None
        return found if found is not None else self.by_target.get((SERVICE, key, None))

    def for_pool(self, key: ObjectKey) -> BackendTls | BrokenBackendTls | None:
        return self.by_target.get((INFERENCE_POOL, key, None))


def _age(policy: BackendTLSPolicy) -> tuple[str, str]:
    # (no timestamp, as in hand-written manifests: after every dated one; then by name)
    return (policy.metadata.creation_timestamp or "~", policy.metadata.name)


def _ca_bundle(resources: ResourceSet, policy: BackendTLSPolicy
               ) -> tuple[str | None, list[tuple[Reason, str]]]:
    """The PEM of every CA reference, joined, and the problems of those that cannot be used."""
    from cryptography import x509  # (imported on first use: most backends are plain HTTP)

    namespace = policy.metadata.namespace
    bundle: list[str] = []
    problems: list[tuple[Reason, str]] = []
    for ref in policy.spec.validation.ca_certificate_refs:
        if (ref.group, ref.kind) != (CORE_GROUP, "ConfigMap"):
            problems.append((Reason.INVALID_KIND, f"caCertificateRef {ref.group or 'core'}/{ref.kind} "
                             f"{ref.name}: only ConfigMaps"))
            continue
        config_map = next((c for c in resources.config_maps if c.key == ObjectKey(namespace, ref.name)), None)
        text = config_map.data.get(CA_CERT_KEY) if config_map is not None else None
        if config_map is None:
            problems.append((Reason.INVALID_CA_CERTIFICATE_REF,
                             f"ConfigMap {namespace}/{ref.name} not found"))
            continue
        if not text:
            problems.append((Reason.INVALID_CA_CERTIFICATE_REF,
                             f"ConfigMap {namespace}/{ref.name} has no {CA_CERT_KEY}"))
            continue
        try:
            x509.load_pem_x509_certificates(text.encode())
        except ValueError:
            problems.append((Reason.INVALID_CA_CERTIFICATE_REF,
                             f"ConfigMap {namespace}/{ref.name}: {CA_CERT_KEY} is not PEM certificates"))
            continue
        bundle.append(text if text.endswith("\n") else text + "\n")
    return ("".join(bundle) or None), problems


def _target_problem(resources: ResourceSet, policy: BackendTLSPolicy, group: str, kind: str, name: str,
                    section: str | None) -> str | None:
    namespace = policy.metadata.namespace
    if (group, kind) not in SUPPORTED_TARGETS:
        return f"targetRef {group or 'core'}/{kind} {name}: only Services and InferencePools"
    key = ObjectKey(namespace, name)
    if kind == SERVICE:
        service = next((s for s in resources.services if s.key == key), None)
        if service is None:
            return f"Service {key} not found"
        if section is not None and not any(port.name == section for port in service.spec.ports):
            return f"Service {key} has no port named {section!r}"
        return None
    if not any(pool.key == key for pool in resources.inference_pools):
        return f"InferencePool {key} not found"
    if section is not None:
        return f"InferencePool {key}: a sectionName is not supported (the policy covers the whole pool)"
    return None


def resolve_backend_tls(resources: ResourceSet, system_ca_file: str | None = None) -> BackendTlsPolicies:
    """Every policy judged, and what governs each target. ``system_ca_file``: the system's CA
    certificates (``wellKnownCACertificates: System``); None: none are known on this machine, and
    such a policy is not Accepted (its targets answer 500)."""
    by_target: dict[TargetKey, BackendTls | BrokenBackendTls] = {}
    judged: list[PolicyJudgement] = []
    for policy in sorted(resources.backend_tls_policies, key=_age):
        generation = policy.observed_generation
        validation = policy.spec.validation
        ca_pem, problems = _ca_bundle(resources, policy)
        accepted_problem: tuple[Reason, str] | None = None
        well_known = validation.well_known_ca_certificates
        if well_known and well_known != WELL_KNOWN_SYSTEM:
            accepted_problem = (Reason.INVALID, f"wellKnownCACertificates {well_known!r}: only "
                                f"{WELL_KNOWN_SYSTEM!r}")
        elif well_known and system_ca_file is None:
            accepted_problem = (Reason.INVALID, "wellKnownCACertificates System: no system CA certificates "
                                "found on this machine (SSL_CERT_FILE names a bundle)")
        elif validation.ca_certificate_refs and ca_pem is None:
            accepted_problem = (Reason.NO_VALID_CA_CERTIFICATE, "no caCertificateRef can be used: "
                                + "; ".join(text for _, text in problems))
        governs: BackendTls | BrokenBackendTls
        if accepted_problem is not None:
            governs = BrokenBackendTls(policy.key, accepted_problem[1])
        elif problems:
            governs = BrokenBackendTls(policy.key, "; ".join(text for _, text in problems))
        else:
            sans = tuple((san.type, san.value) for san in validation.subject_alt_names)
            governs = BackendTls(policy.key, validation.hostname, ca_pem,
                                 system_ca_file if well_known else None, sans)
        targets: list[tuple[str, ObjectKey]] = []
        conflicts: list[str] = []
        for ref in policy.spec.target_refs:
            key = ObjectKey(policy.metadata.namespace, ref.name)
            supported = (ref.group, ref.kind) in SUPPORTED_TARGETS
            if supported:  # (its status goes to the Gateways whose routes reach it, found or not)
                targets.append((ref.kind, key))
            problem = _target_problem(resources, policy, ref.group, ref.kind, ref.name, ref.section_name)
            if problem is not None:
                accepted_problem = accepted_problem or (
                    Reason.TARGET_NOT_FOUND if supported else Reason.INVALID, problem)
                continue
            target: TargetKey = (ref.kind, key, ref.section_name)
            holder = by_target.setdefault(target, governs)
            if holder is not governs:
                where = f"{ref.kind} {key}" + (f" port {ref.section_name}" if ref.section_name else "")
                conflicts.append(f"{where} is governed by the older BackendTLSPolicy {holder.policy}")
        if accepted_problem is None and conflicts:
            accepted_problem = (Reason.CONFLICTED, "; ".join(conflicts))
        if accepted_problem is None:
            options = policy.spec.options
            text = ("policy accepted" if not options
                    else f"policy accepted; options not used by kvgate: {', '.join(sorted(options))}")
            accepted = condition(ConditionType.ACCEPTED, True, Reason.ACCEPTED, text, generation)
        else:
            accepted = condition(ConditionType.ACCEPTED, False, accepted_problem[0], accepted_problem[1],
                                 generation)
        if problems:
            resolved = condition(ConditionType.RESOLVED_REFS, False, problems[0][0],
                                 "; ".join(text for _, text in problems), generation)
        else:
            resolved = condition(ConditionType.RESOLVED_REFS, True, Reason.RESOLVED_REFS,
                                 "CA certificates loaded" if validation.ca_certificate_refs
                                 else "the system's CA certificates", generation)
        judged.append(PolicyJudgement(policy, accepted, resolved, tuple(targets)))
    return BackendTlsPolicies(MappingProxyType(by_target), tuple(judged))
