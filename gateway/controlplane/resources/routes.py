"""HTTPRoute validation: parent attachment (Accepted) and backend references (ResolvedRefs); a
GRPCRoute's too, as the HTTPRoute it amounts to (``resources.grpc_route``), told apart by its kind
where the two differ.

Per the Gateway API, a route gets one status per parentRef. ``Accepted`` says whether that parent
took the route; ``ResolvedRefs`` whether every backendRef resolved. An unresolved backend does not
reject the route: its rule keeps it with ``valid=False`` so its share of traffic gets HTTP 500.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from kvgate.gateway.controlplane.resources.backend_tls import BackendTlsPolicies, BrokenBackendTls
from kvgate.gateway.controlplane.resources.backends import find_service, service_addresses
from kvgate.gateway.controlplane.resources.conditions import (
    Condition,
    ConditionType,
    Reason,
    ResourceStatus,
    condition,
)
from kvgate.gateway.controlplane.resources.core import Namespace
from kvgate.gateway.controlplane.resources.gateway_api import (
    CORE_GROUP,
    GATEWAY_GROUP,
    INFERENCE_GROUP,
    SUPPORTED_BACKEND_FILTERS,
    SUPPORTED_FILTERS,
    HTTPBackendRef,
    HTTPRoute,
    Listener,
    ParentReference,
)
from kvgate.gateway.controlplane.resources.grpc_route import GRPC_FILTERS, GRPC_ROUTE
from kvgate.gateway.controlplane.resources.hostnames import intersect
from kvgate.gateway.controlplane.resources.label_selector import LabelSelector
from kvgate.gateway.controlplane.resources.loader import ResourceSet
from kvgate.gateway.controlplane.resources.meta import ObjectKey, ResourceRef
from kvgate.gateway.controlplane.resources.resolved import (
    BackendKind,
    BackendProtocol,
    ResolvedBackend,
    ResolvedExternalAuth,
    ResolvedGateway,
    ResolvedMirror,
    ResolvedPool,
    ResolvedRoute,
    ResolvedRule,
    RouteAttachment,
)

APP_PROTOCOLS: Mapping[str, BackendProtocol] = {
    "http": BackendProtocol.HTTP1,
    "https": BackendProtocol.HTTP1,  # (TLS as a BackendTLSPolicy says)
    "kubernetes.io/h2c": BackendProtocol.H2C,
    "kubernetes.io/ws": BackendProtocol.WEBSOCKET,
    "kubernetes.io/wss": BackendProtocol.WEBSOCKET,
}
"""A Service port's ``appProtocol`` (lower case; none: ``http``) and how Envoy speaks to it; another
value leaves the backend unresolved (GEP-1911: ``ResolvedRefs: False, UnsupportedProtocol``)."""

PoolLookup = Callable[[ObjectKey], "ResolvedPool | str | None"]
"""A pool key → the usable pool, a reason it is unusable, or None when there is no such pool."""


@dataclass(frozen=True, slots=True)
class RouteResult:
    route: ResolvedRoute | None
    statuses: tuple[ResourceStatus, ...]
    referenced_pools: frozenset[ObjectKey]
    parents: tuple[tuple[ResourceRef, bool], ...]
    """Each parent with whether it accepted the route."""
    referenced_services: frozenset[ObjectKey] = frozenset()
    """The Services its rules send requests to (backends, mirrors, external authorization)."""


def _permitted(resources: ResourceSet, route: HTTPRoute, group: str, kind: str, target: ObjectKey) -> bool:
    if target.namespace == route.metadata.namespace:
        return True
    for grant in resources.reference_grants:
        if grant.metadata.namespace != target.namespace:
            continue
        from_ok = any(
            f.group == GATEWAY_GROUP and f.kind == route.kind and f.namespace == route.metadata.namespace
            for f in grant.spec.from_
        )
        to_ok = any(
            t.group == group and t.kind == kind and t.name in (None, target.name) for t in grant.spec.to
        )
        if from_ok and to_ok:
            return True
    return False


def _backend(
    resources: ResourceSet, route: HTTPRoute, ref: HTTPBackendRef, pools: PoolLookup,
    backend_tls: BackendTlsPolicies,
) -> tuple[ResolvedBackend, Reason | None]:
    key = ObjectKey(ref.namespace or route.metadata.namespace, ref.name)

    def invalid(reason: Reason, message: str) -> tuple[ResolvedBackend, Reason | None]:
        return ResolvedBackend(BackendKind.INVALID, key, ref.weight, False, message, ref.port), reason

    grpc = route.kind == GRPC_ROUTE
    if (ref.group, ref.kind) == (INFERENCE_GROUP, "InferencePool") and grpc:
        return invalid(Reason.INVALID_KIND, f"InferencePool {key}: a GRPCRoute's backends are Services "
                       "(InferencePools are routed from HTTPRoutes)")
    if (ref.group, ref.kind) == (INFERENCE_GROUP, "InferencePool"):
        if not _permitted(resources, route, ref.group, ref.kind, key):
            return invalid(Reason.REF_NOT_PERMITTED, f"InferencePool {key}: no ReferenceGrant allows it")
        found = pools(key)
        if found is None:
            return invalid(Reason.BACKEND_NOT_FOUND, f"InferencePool {key} not found")
        if isinstance(found, str):
            # The reference resolves; the pool itself is unusable (its own status says why).
            backend = ResolvedBackend(BackendKind.INFERENCE_POOL, key, ref.weight, False, found, ref.port)
            return backend, None
        backend = ResolvedBackend(
            BackendKind.INFERENCE_POOL, key, ref.weight, True, "", ref.port, pool=found, filters=ref.filters
        )
        return backend, None
    if (ref.group, ref.kind) == (CORE_GROUP, "Service"):
        if ref.port is None:
            return invalid(Reason.UNSUPPORTED_VALUE, f"Service {key}: backendRef needs a port")
        if not _permitted(resources, route, ref.group, ref.kind, key):
            return invalid(Reason.REF_NOT_PERMITTED, f"Service {key}: no ReferenceGrant allows it")
        service = find_service(resources, key)
        if service is None:
            return invalid(Reason.BACKEND_NOT_FOUND, f"Service {key} not found")
        found_addresses = service_addresses(resources, service, ref.port)
        if found_addresses.problem is not None:
            return invalid(Reason.BACKEND_NOT_FOUND, found_addresses.problem)
        service_port = service.port(ref.port)
        app_protocol = service_port.app_protocol if service_port is not None else None
        protocol = APP_PROTOCOLS.get((app_protocol or "http").lower())
        if grpc:  # gRPC is HTTP/2: any port that speaks HTTP is spoken to in HTTP/2 (h2c, or h2 over TLS)
            speaks_http = protocol in (BackendProtocol.HTTP1, BackendProtocol.H2C)
            protocol = BackendProtocol.H2C if speaks_http else None
        if protocol is None:
            known = ", ".join(APP_PROTOCOLS)
            return invalid(Reason.UNSUPPORTED_PROTOCOL, f"Service {key} port {ref.port}: appProtocol "
                           f"{app_protocol!r} is not one kvgate speaks to a backend ({known})")
        tls = backend_tls.for_service(key, service_port.name if service_port is not None else None)
        if isinstance(tls, BrokenBackendTls):  # (the reference resolves; the policy says why it fails)
            message = f"Service {key}: BackendTLSPolicy {tls.policy}: {tls.message}"
            return ResolvedBackend(BackendKind.SERVICE, key, ref.weight, False, message, ref.port), None
        backend = ResolvedBackend(
            BackendKind.SERVICE,
            key,
            ref.weight,
            True,
            "",
            ref.port,
            addresses=found_addresses.addresses,
            filters=ref.filters,
            tls=tls,
            protocol=protocol,
        )
        return backend, None
    return invalid(Reason.INVALID_KIND, f"backendRef kind {ref.group or 'core'}/{ref.kind} is not supported")


def _rule_problem(route: HTTPRoute) -> str | None:
    """A reason the route cannot be accepted at all (unsupported filter or invalid regex)."""
    grpc = route.kind == GRPC_ROUTE
    supported = GRPC_FILTERS if grpc else SUPPORTED_FILTERS
    on_backends = GRPC_FILTERS & SUPPORTED_BACKEND_FILTERS if grpc else SUPPORTED_BACKEND_FILTERS
    for index, rule in enumerate(route.spec.rules):
        for flt in rule.filters:
            if flt.type not in supported:
                return f"rule {index}: filter {flt.type} is not supported (only {sorted(supported)})"
        for flt in (f for ref in rule.backend_refs for f in ref.filters):
            if flt.type not in on_backends:
                return (f"rule {index}: filter {flt.type} is not supported on a backendRef (only "
                        f"{sorted(on_backends)})")
        for match in rule.matches:
            patterns = [match.path.value] if match.path.type == "RegularExpression" else []
            patterns += [h.value for h in match.headers if h.type == "RegularExpression"]
            patterns += [q.value for q in match.query_params if q.type == "RegularExpression"]
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    return f"rule {index}: invalid regular expression {pattern!r}: {exc}"
                unsupported = _NOT_RE2.search(pattern)
                if unsupported is not None:
                    return (
                        f"rule {index}: regular expression {pattern!r} uses {unsupported.group(0)!r}, which"
                        " RE2 (Envoy's regex engine) does not support (no lookaround, backreferences"
                        " or atomic groups)"
                    )
    return None


# Python-only constructs: Envoy would NACK the whole update (an unescaped backslash before them is
# what makes them special; an escaped one, ``\\(?=``, is a literal and fine).
_NOT_RE2 = re.compile(r"(?<!\\)(?:\(\?(?:=|!|<=|<!|>|P=)|\\[1-9])")


def _namespace_allowed(resources: ResourceSet, listener: Listener, gateway_ns: str, route_ns: str) -> bool:
    origin = listener.allowed_routes.namespaces
    if origin.from_ == "All":
        return True
    if origin.from_ == "Same":
        return route_ns == gateway_ns
    selector = namespace_selector(origin.selector)
    if selector is None:
        return False
    namespace: Namespace | None = next(
        (ns for ns in resources.namespaces if ns.metadata.name == route_ns), None
    )
    labels = dict(namespace.metadata.labels) if namespace is not None else {}
    labels.setdefault("kubernetes.io/metadata.name", route_ns)
    return selector.matches(labels)


def namespace_selector(value: object) -> LabelSelector | None:
    """A listener's ``allowedRoutes.namespaces.selector`` (None: left out or not a label selector,
    which selects no namespace: never every one)."""
    if not isinstance(value, Mapping):
        return None
    try:
        return LabelSelector.model_validate(value)
    except ValidationError:
        return None


def _kind_allowed(listener: Listener, kind: str) -> bool:
    kinds = listener.allowed_routes.kinds
    return not kinds or any(k.kind == kind and k.group == GATEWAY_GROUP for k in kinds)


def _attach(
    resources: ResourceSet,
    route: HTTPRoute,
    parent: ParentReference,
    gateways: Mapping[ObjectKey, tuple[ResolvedGateway, Mapping[str, Listener]]],
) -> tuple[list[RouteAttachment], Reason, str]:
    key = ObjectKey(parent.namespace or route.metadata.namespace, parent.name)
    if (parent.group, parent.kind) != (GATEWAY_GROUP, "Gateway"):
        return [], Reason.NO_MATCHING_PARENT, f"parent kind {parent.kind} is not supported (Gateway only)"
    found = gateways.get(key)
    if found is None:
        return [], Reason.NO_MATCHING_PARENT, f"Gateway {key} not found or not accepted"
    gateway, specs = found
    candidates = [
        listener
        for listener in gateway.listeners
        if (parent.section_name is None or listener.name == parent.section_name)
        and (parent.port is None or listener.port == parent.port)
    ]
    if not candidates:
        wanted = f"sectionName {parent.section_name!r}" if parent.section_name else f"port {parent.port}"
        return [], Reason.NO_MATCHING_PARENT, f"Gateway {key} has no valid listener with {wanted}"
    allowed = [
        listener
        for listener in candidates
        if _kind_allowed(specs[listener.name], route.kind)
        and _namespace_allowed(resources, specs[listener.name], key.namespace, route.metadata.namespace)
    ]
    if not allowed:
        namespace = route.metadata.namespace
        message = f"no listener of Gateway {key} allows {route.kind}s from namespace {namespace}"
        return [], Reason.NOT_ALLOWED_BY_LISTENERS, message
    attachments = []
    for listener in allowed:
        hostnames = intersect(listener.hostname, route.spec.hostnames)
        if hostnames:
            attachments.append(RouteAttachment(key, listener.name, listener.port, hostnames))
    if not attachments:
        return [], Reason.NO_MATCHING_LISTENER_HOSTNAME, "no listener hostname matches the route's hostnames"
    names = ", ".join(a.listener for a in attachments)
    return attachments, Reason.ACCEPTED, f"accepted by listener(s) {names}"


def validate_route(
    resources: ResourceSet,
    route: HTTPRoute,
    gateways: Mapping[ObjectKey, tuple[ResolvedGateway, Mapping[str, Listener]]],
    pools: PoolLookup,
    backend_tls: BackendTlsPolicies | None = None,
) -> RouteResult:
    generation = route.observed_generation
    rules: list[ResolvedRule] = []
    ref_problems: list[tuple[Reason, str]] = []
    referenced: set[ObjectKey] = set()
    services: set[ObjectKey] = set()
    policies = backend_tls or BackendTlsPolicies()

    def resolve(ref: HTTPBackendRef) -> tuple[ResolvedBackend, Reason | None]:
        backend, problem = _backend(resources, route, ref, pools, policies)
        if backend.kind is BackendKind.SERVICE:
            services.add(backend.key)
        return backend, problem

    for index, rule in enumerate(route.spec.rules):
        backends = []
        for ref in rule.backend_refs:
            backend, problem = resolve(ref)
            backends.append(backend)
            if backend.kind is BackendKind.INFERENCE_POOL:
                referenced.add(backend.key)
            if problem is not None:
                ref_problems.append((problem, backend.reason))
        mirrors = []
        for flt in rule.filters:
            if flt.request_mirror is None:
                continue
            target = flt.request_mirror.backend_ref
            ref = HTTPBackendRef(group=target.group, kind=target.kind, name=target.name,
                                 namespace=target.namespace, port=target.port)
            backend, problem = resolve(ref)
            if backend.kind is BackendKind.INFERENCE_POOL:
                referenced.add(backend.key)  # (a pool mirrored to is one this route uses)
            if problem is not None:
                ref_problems.append((problem, f"RequestMirror: {backend.reason}"))
            mirrors.append(ResolvedMirror(backend, flt.request_mirror.millionths))
        external_auth = None
        auth = next((flt.external_auth for flt in rule.filters if flt.external_auth is not None), None)
        if auth is not None:
            target = auth.backend_ref
            if (target.group, target.kind) == (CORE_GROUP, "Service"):
                ref = HTTPBackendRef(name=target.name, namespace=target.namespace, port=target.port)
                auth_backend, problem = resolve(ref)
            else:
                key = ObjectKey(target.namespace or route.metadata.namespace, target.name)
                auth_backend = ResolvedBackend(BackendKind.INVALID, key, 1, False,
                                               f"ExternalAuth backendRef kind {target.kind}: a Service only")
                problem = Reason.INVALID_KIND
            if problem is not None:
                ref_problems.append((problem, f"ExternalAuth: {auth_backend.reason}"))
            external_auth = ResolvedExternalAuth(auth, auth_backend)
        rules.append(
            ResolvedRule(index, rule.name, rule.matches, rule.filters, rule.timeouts, tuple(backends),
                         retry=rule.retry, mirrors=tuple(mirrors),
                         session_persistence=rule.session_persistence, external_auth=external_auth)
        )
    if ref_problems:
        reason, _ = ref_problems[0]
        message = "; ".join(text for _, text in ref_problems)
        resolved_refs: Condition = condition(ConditionType.RESOLVED_REFS, False, reason, message, generation)
    else:
        resolved_refs = condition(
            ConditionType.RESOLVED_REFS, True, Reason.RESOLVED_REFS, "all references resolved", generation
        )
    rule_problem = _rule_problem(route)
    statuses = []
    parents: list[tuple[ResourceRef, bool]] = []
    attachments: list[RouteAttachment] = []
    if not route.spec.parent_refs:
        cond = condition(
            ConditionType.ACCEPTED, False, Reason.NO_MATCHING_PARENT, "no parentRefs", generation
        )
        statuses.append(ResourceStatus(route.ref, (cond, resolved_refs)))
    for parent in route.spec.parent_refs:
        parent_ref = ResourceRef(parent.kind, parent.namespace or route.metadata.namespace, parent.name)
        took: tuple[str, ...] = ()
        if rule_problem is not None:
            accepted = condition(
                ConditionType.ACCEPTED, False, Reason.UNSUPPORTED_VALUE, rule_problem, generation
            )
        else:
            found, reason, message = _attach(resources, route, parent, gateways)
            attachments.extend(a for a in found if a not in attachments)
            accepted = condition(ConditionType.ACCEPTED, bool(found), reason, message, generation)
            took = tuple(dict.fromkeys(a.listener for a in found))
        statuses.append(
            ResourceStatus(route.ref, (accepted, resolved_refs), parent=parent_ref, listeners=took))
        parents.append((parent_ref, accepted.is_true))
    resolved = (
        ResolvedRoute(route.key, tuple(attachments), tuple(rules), route.metadata.creation_timestamp,
                      kind=route.kind)
        if attachments
        else None
    )
    return RouteResult(resolved, tuple(statuses), frozenset(referenced), tuple(parents), frozenset(services))
