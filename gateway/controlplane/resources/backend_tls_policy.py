"""BackendTLSPolicy (``gateway.networking.k8s.io/v1``, the Gateway API's Standard channel since
v1.4): how the gateway speaks TLS to a backend. The manifest as the CRD types it; the CRD's
admission rules (CEL) are checked here too, so what ``kubectl apply`` refuses is refused at load.
``resources.backend_tls`` resolves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator

from kvgate.gateway.controlplane.resources.meta import Resource, SpecModel

_PRECISE_HOSTNAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_HOSTNAME = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_ABSOLUTE_URI = r"^(([^:/?#]+):)(//([^/?#]*))([^?#]*)(\?([^#]*))?(#(.*))?"


class PolicyTargetReference(SpecModel):
    """``LocalPolicyTargetReferenceWithSectionName``: an object of the policy's namespace (a
    Service, or an InferencePool: implementation-specific), ``section_name`` one of its ports."""

    group: str = Field(max_length=253)
    kind: str = Field(min_length=1, max_length=63)
    name: str = Field(min_length=1, max_length=253)
    section_name: str | None = Field(default=None, min_length=1, max_length=253)


class LocalObjectReference(SpecModel):
    group: str = Field(max_length=253)
    kind: str = Field(min_length=1, max_length=63)
    name: str = Field(min_length=1, max_length=253)


class SubjectAltName(SpecModel):
    type: Literal["Hostname", "URI"]
    hostname: str | None = Field(default=None, min_length=1, max_length=253, pattern=_HOSTNAME)
    uri: str | None = Field(default=None, min_length=1, max_length=253, pattern=_ABSOLUTE_URI)

    @model_validator(mode="after")
    def _one_value(self) -> SubjectAltName:
        if self.type == "Hostname" and (not self.hostname or self.uri):
            raise ValueError("SubjectAltName element must contain Hostname (and no URI) if Type is Hostname")
        if self.type == "URI" and (not self.uri or self.hostname):
            raise ValueError("SubjectAltName element must contain URI (and no Hostname) if Type is URI")
        return self

    @property
    def value(self) -> str:
        return self.hostname if self.type == "Hostname" and self.hostname else self.uri or ""


class BackendTLSPolicyValidation(SpecModel):
    ca_certificate_refs: tuple[LocalObjectReference, ...] = Field(default=(), max_length=8)
    well_known_ca_certificates: str | None = Field(default=None, alias="wellKnownCACertificates")
    """``System``: the system's CA certificates (any other value: the policy is not Accepted)."""
    hostname: str = Field(min_length=1, max_length=253, pattern=_PRECISE_HOSTNAME)
    subject_alt_names: tuple[SubjectAltName, ...] = Field(default=(), max_length=5)

    @model_validator(mode="after")
    def _one_trust_source(self) -> BackendTLSPolicyValidation:
        if self.ca_certificate_refs and self.well_known_ca_certificates:
            raise ValueError("must not contain both CACertificateRefs and WellKnownCACertificates")
        if not self.ca_certificate_refs and not self.well_known_ca_certificates:
            raise ValueError("must specify either CACertificateRefs or WellKnownCACertificates")
        return self


class BackendTLSPolicySpec(SpecModel):
    target_refs: tuple[PolicyTargetReference, ...] = Field(min_length=1, max_length=16)
    validation: BackendTLSPolicyValidation
    options: Mapping[str, str] = Field(default_factory=dict, max_length=16)

    @model_validator(mode="after")
    def _distinct_targets(self) -> BackendTLSPolicySpec:
        seen: set[tuple[str, str, str, str | None]] = set()
        sectioned: dict[tuple[str, str, str], bool] = {}
        for ref in self.target_refs:
            target = (ref.group, ref.kind, ref.name)
            if sectioned.setdefault(target, ref.section_name is not None) != (ref.section_name is not None):
                raise ValueError("sectionName must be specified when targetRefs includes 2 or more "
                                 "references to the same target")
            key = (ref.group, ref.kind, ref.name, ref.section_name)
            if key in seen:
                raise ValueError("sectionName must be unique when targetRefs includes 2 or more references "
                                 "to the same target")
            seen.add(key)
        return self


class BackendTLSPolicy(Resource):
    kind: Literal["BackendTLSPolicy"]
    spec: BackendTLSPolicySpec
