"""Addresses behind references: Services, InferencePools (endpoints and picker), with pool status.

Pure functions over a :class:`ResourceSet`; the results are frozen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvgate.gateway.controlplane.resources.backend_tls import BackendTls, BackendTlsPolicies, BrokenBackendTls
from kvgate.gateway.controlplane.resources.conditions import Condition, ConditionType, Reason, condition
from kvgate.gateway.controlplane.resources.core import Pod, Service, check_address, format_address
from kvgate.gateway.controlplane.resources.inference import InferencePool
from kvgate.gateway.controlplane.resources.label_selector import LabelSelector
from kvgate.gateway.controlplane.resources.loader import ResourceSet
from kvgate.gateway.controlplane.resources.meta import ObjectKey
from kvgate.gateway.controlplane.resources.resolved import ModelServerTls, ResolvedPicker, ResolvedPool
from kvgate.policies.types import ROLE_LABEL, Endpoint, Role

MODEL_SERVER_TLS_ANNOTATION = "kvgate.io/model-server-tls"
"""``"true"``: the pool's model servers serve HTTPS (inference and ``/metrics`` on one port)."""
MODEL_SERVER_CA_ANNOTATION = "kvgate.io/model-server-ca-file"
"""A CA file (PEM) on the picker's and Envoy's disk, e.g. a mounted ConfigMap: HTTPS to the model
servers, their certificates verified against it."""


def model_server_tls(pool: InferencePool) -> ModelServerTls | str | None:
    """The pool's HTTPS to its model servers, from its annotations (another value than ``"true"``
    is plain HTTP: ``control_plane.pool_spec`` warns of it), or why its CA file cannot be used:
    read here, because Envoy refuses a whole cluster update naming a file it cannot load."""
    annotations = pool.metadata.annotations
    ca_file = annotations.get(MODEL_SERVER_CA_ANNOTATION, "").strip() or None
    if ca_file is None:
        on = annotations.get(MODEL_SERVER_TLS_ANNOTATION, "").strip().lower() == "true"
        return ModelServerTls() if on else None
    from cryptography import x509  # (imported here: most pools' model servers serve plain HTTP)

    try:
        x509.load_pem_x509_certificates(Path(ca_file).read_bytes())
    except (OSError, ValueError) as exc:
        return f"{MODEL_SERVER_CA_ANNOTATION} {ca_file!r}: not a readable PEM certificate file ({exc})"
    return ModelServerTls(ca_file)


@dataclass(frozen=True, slots=True)
class ServiceAddresses:
    addresses: tuple[str, ...]
    problem: str | None = None


def pod_role(pod: Pod) -> Role:
    """The pod's ``llm-d.ai/role`` (an unknown value: both, as a pod without the label)."""
    try:
        return Role.parse(pod.metadata.labels.get(ROLE_LABEL))
    except ValueError:
        return Role.BOTH


def ready_pods(resources: ResourceSet, namespace: str, selector: Mapping[str, str] | LabelSelector,
               ) -> tuple[Pod, ...]:
    """Ready pods in ``namespace`` that ``selector`` selects (a Service's: every pair of the map),
    sorted by name."""
    if not isinstance(selector, LabelSelector):
        selector = LabelSelector(match_labels=selector)
    chosen = [
        pod
        for pod in resources.pods
        if pod.metadata.namespace == namespace and pod.ready and selector.matches(pod.metadata.labels)
    ]
    return tuple(sorted(chosen, key=lambda pod: pod.metadata.name))


def service_addresses(resources: ResourceSet, service: Service, port: int | None) -> ServiceAddresses:
    """``ip:port`` of a Service: its ``kvgate.io/endpoints`` annotation, else ready selected pods.

    ``port`` is the port the reference names (None: any; the annotation's addresses are used as
    written, and a selector-based Service uses its only port).
    """
    annotated = service.annotated_endpoints
    if annotated is not None:
        try:
            return ServiceAddresses(tuple(sorted({check_address(addr) for addr in annotated})))
        except ValueError as exc:
            return ServiceAddresses((), f"{service.ref}: bad kvgate.io/endpoints annotation: {exc}")
    if not service.spec.selector:
        return ServiceAddresses((), f"{service.ref} has no selector and no kvgate.io/endpoints annotation")
    if port is None:
        if len(service.spec.ports) != 1:
            return ServiceAddresses((), f"{service.ref}: name a port (it has {len(service.spec.ports)})")
        service_port = service.spec.ports[0]
    else:
        found = service.port(port)
        if found is None:
            return ServiceAddresses((), f"{service.ref} has no port {port}")
        service_port = found
    target = service_port.effective_target
    pods = ready_pods(resources, service.metadata.namespace, service.spec.selector)
    if isinstance(target, int) or target.isdigit():
        number = int(target)
        numbered = {format_address(pod.status.pod_ip or "", number) for pod in pods}
        return ServiceAddresses(tuple(sorted(numbered)))
    # A named targetPort (``targetPort: http``) is each pod's container port of that name, as
    # Kubernetes builds the Service's endpoints: pods may differ, and a pod without it is no endpoint.
    addresses: set[str] = set()
    for pod in pods:
        named = pod.named_port(target, service_port.protocol)
        if named is not None:
            addresses.add(format_address(pod.status.pod_ip or "", named))
    return ServiceAddresses(tuple(sorted(addresses)))


def find_service(resources: ResourceSet, key: ObjectKey) -> Service | None:
    return next((svc for svc in resources.services if svc.key == key), None)


@dataclass(frozen=True, slots=True)
class PoolResolution:
    """A pool with its ResolvedRefs condition; ``pool`` is None when its picker reference is invalid."""

    source: InferencePool
    pool: ResolvedPool | None
    resolved_refs: Condition


def _picker(
    resources: ResourceSet, pool: InferencePool, require_service: bool, policies: BackendTlsPolicies,
) -> tuple[ResolvedPicker | None, str]:
    ref = pool.spec.endpoint_picker_ref
    if ref.group != "" or ref.kind != "Service":
        return (
            None,
            f"endpointPickerRef kind {ref.group or 'core'}/{ref.kind} is not supported (Service only)",
        )
    service = find_service(resources, ObjectKey(pool.metadata.namespace, ref.name))
    if service is None:
        if require_service:
            return None, f"endpointPickerRef: Service {pool.metadata.namespace}/{ref.name} not found"
        return ResolvedPicker(ref.name, ref.port_number, ref.failure_mode), "kvgate's own picker"
    if service.spec.ports and service.port(ref.port_number) is None:
        return None, f"endpointPickerRef: Service {ref.name} has no port {ref.port_number}"
    annotated = service.annotated_endpoints
    if annotated is None and not service.spec.selector:
        # A Service with no addresses of its own names kvgate's in-process picker.
        return ResolvedPicker(ref.name, ref.port_number, ref.failure_mode), "kvgate's own picker"
    found = service_addresses(resources, service, ref.port_number if service.spec.ports else None)
    if found.problem is not None:
        return None, f"endpointPickerRef: {found.problem}"
    port = service.port(ref.port_number)
    tls = policies.for_service(service.key, port.name if port is not None else None)
    if isinstance(tls, BrokenBackendTls):  # (never a picker reached on less than its policy asks)
        return None, f"endpointPickerRef: Service {ref.name}: BackendTLSPolicy {tls.policy}: {tls.message}"
    picker = ResolvedPicker(ref.name, ref.port_number, ref.failure_mode, found.addresses, tls)
    return picker, f"Service {ref.name} ({len(found.addresses)} addresses)"


def resolve_pool(
    resources: ResourceSet, pool: InferencePool, *, require_picker_service: bool,
    backend_tls: BackendTls | BrokenBackendTls | None = None, policies: BackendTlsPolicies | None = None,
) -> PoolResolution:
    """``backend_tls``: the BackendTLSPolicy that governs the pool, if one does (a broken one leaves
    the pool unusable: its requests answer 500, never in plain text); ``policies``: every one (an
    external picker's Service may have its own)."""
    generation = pool.observed_generation
    picker, message = _picker(resources, pool, require_picker_service, policies or BackendTlsPolicies())
    if picker is None:
        cond = condition(
            ConditionType.RESOLVED_REFS, False, Reason.INVALID_EXTENSION_REF, message, generation
        )
        return PoolResolution(pool, None, cond)
    ports = tuple(port.number for port in pool.spec.target_ports)
    pods = ready_pods(resources, pool.metadata.namespace, pool.spec.selector)
    endpoints = tuple(
        Endpoint(
            address=format_address(pod.status.pod_ip or "", port), pool=str(pool.key), name=pod.metadata.name,
            role=pod_role(pod),
        )
        for pod in pods
        for port in ports
    )
    tls = model_server_tls(pool)
    if isinstance(tls, str):
        cond = condition(ConditionType.RESOLVED_REFS, False, Reason.INVALID, tls, generation)
        return PoolResolution(pool, None, cond)
    if isinstance(backend_tls, BrokenBackendTls):
        message = f"BackendTLSPolicy {backend_tls.policy}: {backend_tls.message}"
        cond = condition(ConditionType.RESOLVED_REFS, False, Reason.INVALID, message, generation)
        return PoolResolution(pool, None, cond)
    resolved = ResolvedPool(pool.key, ports, picker, endpoints, model_server_tls=tls, backend_tls=backend_tls,
                            http2=pool.spec.app_protocol == "kubernetes.io/h2c")
    text = f"endpoint picker: {message}; {len(endpoints)} endpoints from {len(pods)} ready pods"
    cond = condition(ConditionType.RESOLVED_REFS, True, Reason.RESOLVED_REFS, text, generation)
    return PoolResolution(pool, resolved, cond)
