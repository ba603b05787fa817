"""Status conditions, as the Gateway API and the Inference Extension define them.

A :class:`StatusReport` holds one :class:`ResourceStatus` per resource and parent (an HTTPRoute
has one per parentRef; an InferencePool one per Gateway that routes to it; a Gateway one for
itself and one per listener, named by ``section``). It is what ``kvgate status`` prints and the
admin endpoint serves (``StatusReport.to_json()``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvgate.gateway.controlplane.resources.meta import ResourceRef


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    ACCEPTED = "Accepted"
    RESOLVED_REFS = "ResolvedRefs"
    PROGRAMMED = "Programmed"
    CONFLICTED = "Conflicted"


class Reason(StrEnum):
    """The reasons kvgate sets; the names are the Gateway API's and GIE's own."""

    ACCEPTED = "Accepted"
    RESOLVED_REFS = "ResolvedRefs"
    PROGRAMMED = "Programmed"
    PENDING = "Pending"
    INVALID = "Invalid"
    # Gateway / listener
    LISTENERS_NOT_VALID = "ListenersNotValid"
    UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"
    HOSTNAME_CONFLICT = "HostnameConflict"
    NO_CONFLICTS = "NoConflicts"
    INVALID_ROUTE_KINDS = "InvalidRouteKinds"
    PROTOCOL_CONFLICT = "ProtocolConflict"
    INVALID_CERTIFICATE_REF = "InvalidCertificateRef"
    # HTTPRoute Accepted
    NOT_ALLOWED_BY_LISTENERS = "NotAllowedByListeners"
    NO_MATCHING_LISTENER_HOSTNAME = "NoMatchingListenerHostname"
    NO_MATCHING_PARENT = "NoMatchingParent"
    UNSUPPORTED_VALUE = "UnsupportedValue"
    # HTTPRoute ResolvedRefs
    BACKEND_NOT_FOUND = "BackendNotFound"
    INVALID_KIND = "InvalidKind"
    REF_NOT_PERMITTED = "RefNotPermitted"
    # InferencePool
    INVALID_EXTENSION_REF = "InvalidExtensionRef"
    HTTPROUTE_NOT_ACCEPTED = "HTTPRouteNotAccepted"
    # InferenceObjective / InferenceModelRewrite
    POOL_NOT_FOUND = "PoolNotFound"
    MODEL_NAME_IN_USE = "ModelNameInUse"
    # BackendTLSPolicy (the Gateway API's policy reasons)
    CONFLICTED = "Conflicted"
    TARGET_NOT_FOUND = "TargetNotFound"
    NO_VALID_CA_CERTIFICATE = "NoValidCACertificate"
    INVALID_CA_CERTIFICATE_REF = "InvalidCACertificateRef"


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: ConditionStatus
    reason: str
    message: str
    observed_generation: int

    @property
    def is_true(self) -> bool:
        return self.status is ConditionStatus.TRUE

    @property
    def is_good(self) -> bool:
        """In its good state: True, but False for Conflicted."""
        good = ConditionStatus.FALSE if self.type == ConditionType.CONFLICTED else ConditionStatus.TRUE
        return self.status is good

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": str(self.status),
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": self.observed_generation,
        }


def condition(
    kind: ConditionType, ok: bool | None, reason: Reason, message: str, generation: int
) -> Condition:
    """A condition whose status is True (ok), False (not ok) or Unknown (None)."""
    status = ConditionStatus.UNKNOWN if ok is None else ConditionStatus.TRUE if ok else ConditionStatus.FALSE
    return Condition(str(kind), status, str(reason), message, generation)


@dataclass(frozen=True, slots=True)
class ResourceStatus:
    """The conditions of one resource, as seen by one parent (or none) and for one section."""

    resource: ResourceRef
    conditions: tuple[Condition, ...]
    parent: ResourceRef | None = None
    section: str | None = None
    supported_kinds: tuple[str, ...] = ()
    """A Gateway listener's: the route kinds it takes (its ``status.supportedKinds``)."""
    listeners: tuple[str, ...] = ()
    """A route's, per parent Gateway: the listeners that took it (their ``attachedRoutes``)."""

    def get(self, kind: ConditionType | str) -> Condition | None:
        return next((cond for cond in self.conditions if cond.type == str(kind)), None)

    @property
    def healthy(self) -> bool:
        """Every condition is in its good state (Conflicted is good when False)."""
        return all(cond.is_good for cond in self.conditions)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.resource.kind,
            "namespace": self.resource.namespace,
            "name": self.resource.name,
            "conditions": [cond.to_json() for cond in self.conditions],
        }
        if self.parent is not None:
            out["parentRef"] = {
                "kind": self.parent.kind,
                "namespace": self.parent.namespace,
                "name": self.parent.name,
            }
        if self.section is not None:
            out["sectionName"] = self.section
        return out


@dataclass(frozen=True, slots=True)
class StatusReport:
    entries: tuple[ResourceStatus, ...] = ()

    @staticmethod
    def of(entries: Iterable[ResourceStatus]) -> StatusReport:
        return StatusReport(tuple(entries))

    def for_resource(self, ref: ResourceRef) -> tuple[ResourceStatus, ...]:
        return tuple(entry for entry in self.entries if entry.resource == ref)

    def find(
        self, ref: ResourceRef, kind: ConditionType | str, *, parent: ResourceRef | None = None
    ) -> Condition | None:
        """The first condition of type ``kind`` for ``ref`` (under ``parent`` when given)."""
        for entry in self.for_resource(ref):
            if parent is not None and entry.parent != parent:
                continue
            found = entry.get(kind)
            if found is not None:
                return found
        return None

    @property
    def problems(self) -> tuple[ResourceStatus, ...]:
        return tuple(entry for entry in self.entries if not entry.healthy)

    def problem_lines(self) -> tuple[str, ...]:
        """One line per condition in its bad state: ``HTTPRoute default/llm (Gateway default/kvgate):
        ResolvedRefs False (BackendNotFound): InferencePool default/x not found``."""
        lines = []
        for entry in self.problems:
            where = str(entry.resource)
            if entry.parent is not None:
                where += f" ({entry.parent})"
            if entry.section is not None:
                where += f" listener {entry.section}"
            lines += [f"{where}: {cond.type} {cond.status} ({cond.reason}): {cond.message}"
                      for cond in entry.conditions if not cond.is_good]
        return tuple(lines)

    def to_json(self) -> list[dict[str, Any]]:
        return [entry.to_json() for entry in self.entries]
