"""From a :class:`ResourceSet` to a :class:`ValidatedConfig` with a status report. Pure.

Each resource is judged on its own: an invalid one is left out (or, for a backend, kept as
"answers 500") with conditions saying why, and everything else stays usable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvgate.gateway.controlplane.resources.backend_tls import SERVICE, BackendTlsPolicies, resolve_backend_tls
from kvgate.gateway.controlplane.resources.backends import PoolResolution, resolve_pool
from kvgate.gateway.controlplane.resources.certificates import (
    CertificateProblem,
    ListenerCertificate,
    listener_certificate,
)
from kvgate.gateway.controlplane.resources.conditions import (
    Condition,
    ConditionType,
    Reason,
    ResourceStatus,
    StatusReport,
    condition,
)
from kvgate.gateway.controlplane.resources.gateway_api import GATEWAY_GROUP, Gateway, Listener
from kvgate.gateway.controlplane.resources.inference import (
    InferenceModelRewrite,
    InferencePool,
    PoolObjectReference,
)
from kvgate.gateway.controlplane.resources.loader import ResourceSet
from kvgate.gateway.controlplane.resources.meta import ObjectKey, ResourceRef
from kvgate.gateway.controlplane.resources.resolved import (
    ModelRewriteRule,
    ModelRewriteTable,
    ResolvedGateway,
    ResolvedListener,
    ResolvedObjective,
    ResolvedPool,
    ResolvedRoute,
    ValidatedConfig,
    WeightedModel,
)
from kvgate.gateway.controlplane.resources.route_conflicts import settle_kind_conflicts
from kvgate.gateway.controlplane.resources.routes import RouteResult, validate_route

SUPPORTED_PROTOCOLS = frozenset({"HTTP", "HTTPS"})
ROUTE_KINDS = ("HTTPRoute", "GRPCRoute")
"""The route kinds a listener takes (its ``supportedKinds``, of those its ``allowedRoutes`` names)."""


@dataclass(frozen=True, slots=True)
class ValidationOptions:
    """``gateway_classes``: the classes kvgate implements (None: any class).
    ``require_picker_service``: an InferencePool's endpointPickerRef must name a Service in the
    manifests (GIE's behaviour; False lets a missing Service mean kvgate's in-process picker).
    ``system_ca_file``: see below.
    """

    gateway_classes: frozenset[str] | None = None
    require_picker_service: bool = True
    system_ca_file: str | None = None
    """The system's CA certificates on Envoy's (and the picker's) disk, for BackendTLSPolicies with
    ``wellKnownCACertificates: System`` (``gateway.controlplane.system_ca``); None: none known."""


GatewayIndex = Mapping[ObjectKey, tuple[ResolvedGateway, Mapping[str, Listener]]]


LastGood = Mapping[tuple[ObjectKey, str], ListenerCertificate]


def _route_kinds(listener: Listener) -> tuple[str, ...]:
    """The route kinds a listener takes: those of its ``allowedRoutes.kinds`` kvgate serves (all
    of them when it names none)."""
    named = listener.allowed_routes.kinds
    if not named:
        return ROUTE_KINDS
    return tuple(kind for kind in ROUTE_KINDS
                 if any(k.kind == kind and k.group == GATEWAY_GROUP for k in named))


def _validate_gateway(
    gateway: Gateway, options: ValidationOptions, resources: ResourceSet, last_good: LastGood
) -> tuple[ResolvedGateway | None, list[ResourceStatus]]:
    generation = gateway.observed_generation
    spec = gateway.spec
    if options.gateway_classes is not None and spec.gateway_class_name not in options.gateway_classes:
        message = (
            f"gatewayClassName {spec.gateway_class_name!r} is not one of {sorted(options.gateway_classes)}"
        )
        accepted = condition(ConditionType.ACCEPTED, False, Reason.INVALID, message, generation)
        programmed = condition(ConditionType.PROGRAMMED, False, Reason.INVALID, message, generation)
        return None, [ResourceStatus(gateway.ref, (accepted, programmed))]
    statuses: list[ResourceStatus] = []
    valid: list[ResolvedListener] = []
    seen: dict[tuple[int, str], str] = {}
    protocols: dict[int, str] = {}
    for listener in spec.listeners:
        host = (listener.hostname or "").lower()
        conflicted = condition(ConditionType.CONFLICTED, False, Reason.NO_CONFLICTS, "", generation)
        certificate: ListenerCertificate | CertificateProblem | None = None
        if listener.protocol == "HTTPS" and (listener.tls is None or listener.tls.mode == "Terminate"):
            certificate = listener_certificate(resources, gateway, listener)
        if listener.protocol not in SUPPORTED_PROTOCOLS:
            message = f"protocol {listener.protocol} is not supported (HTTP and HTTPS only)"
            ok, reason = False, Reason.UNSUPPORTED_PROTOCOL
        elif listener.protocol == "HTTPS" and listener.tls is not None and listener.tls.mode != "Terminate":
            message = "tls.mode Passthrough is for TLS listeners; an HTTPS listener terminates TLS"
            ok, reason = False, Reason.UNSUPPORTED_VALUE
        elif protocols.get(listener.port, listener.protocol) != listener.protocol:
            message = f"port {listener.port} already serves {protocols[listener.port]}"
            ok, reason = False, Reason.PROTOCOL_CONFLICT
            conflicted = condition(ConditionType.CONFLICTED, True, reason, message, generation)
        elif isinstance(certificate, CertificateProblem) and (gateway.key, listener.name) not in last_good:
            ok, reason, message = False, certificate.reason, certificate.message
        elif listener.allowed_routes.kinds and not _route_kinds(listener):
            ok, reason, message = (False, Reason.INVALID_ROUTE_KINDS,
                                   "allowedRoutes.kinds has neither HTTPRoute nor GRPCRoute")
        elif (listener.port, host) in seen:
            other = seen[(listener.port, host)]
            message = f"port {listener.port} and hostname {host or '*'} already used by listener {other}"
            ok, reason = False, Reason.HOSTNAME_CONFLICT
            conflicted = condition(
                ConditionType.CONFLICTED, True, Reason.HOSTNAME_CONFLICT, message, generation
            )
        else:
            ok, reason, message = True, Reason.ACCEPTED, "listener accepted"
            seen[(listener.port, host)] = listener.name
            protocols[listener.port] = listener.protocol
            served = certificate if isinstance(certificate, ListenerCertificate) else None
            if isinstance(certificate, CertificateProblem):  # a rotation gone wrong: nothing is lost
                served = last_good[(gateway.key, listener.name)]
                reason, message = certificate.reason, (
                    f"{certificate.message}; serving the last good certificate (from Secret {served.secret})")
            valid.append(ResolvedListener(listener.name, listener.port, listener.hostname, served))
        programmed_reason = Reason.PROGRAMMED if ok else Reason.INVALID
        refs_problem = reason in (Reason.INVALID_CERTIFICATE_REF, Reason.REF_NOT_PERMITTED)
        # (a listener whose certificate cannot be read is accepted, not programmed)
        conditions: tuple[Condition, ...] = (
            condition(ConditionType.ACCEPTED, ok or refs_problem, Reason.ACCEPTED if refs_problem else reason,
                      message, generation),
            conflicted,
            condition(ConditionType.PROGRAMMED, ok, programmed_reason,
                      "listener accepted" if ok else message, generation),
        )
        # ResolvedRefs on every listener, as the Gateway API lists a listener's conditions
        kinds = _route_kinds(listener)
        unknown = [k.kind for k in listener.allowed_routes.kinds
                   if k.group != GATEWAY_GROUP or k.kind not in ROUTE_KINDS]
        if refs_problem or reason is Reason.INVALID_ROUTE_KINDS:
            refs = condition(ConditionType.RESOLVED_REFS, False, reason, message, generation)
        elif unknown:
            refs = condition(ConditionType.RESOLVED_REFS, False, Reason.INVALID_ROUTE_KINDS,
                             f"allowedRoutes.kinds: {', '.join(unknown)} not supported (only "
                             f"{', '.join(ROUTE_KINDS)})", generation)
        else:
            loaded = "certificate loaded" if listener.protocol == "HTTPS" else "references resolved"
            refs = condition(ConditionType.RESOLVED_REFS, True, Reason.RESOLVED_REFS, loaded, generation)
        conditions = (*conditions, refs)
        statuses.append(ResourceStatus(gateway.ref, conditions, section=listener.name, supported_kinds=kinds))
    if not valid:
        message = "no listener is valid"
        accepted = condition(ConditionType.ACCEPTED, False, Reason.LISTENERS_NOT_VALID, message, generation)
        programmed = condition(ConditionType.PROGRAMMED, False, Reason.INVALID, message, generation)
        return None, [ResourceStatus(gateway.ref, (accepted, programmed)), *statuses]
    if len(valid) < len(spec.listeners):
        reason, message = (
            Reason.LISTENERS_NOT_VALID,
            f"{len(spec.listeners) - len(valid)} listener(s) not valid",
        )
    else:
        reason, message = Reason.ACCEPTED, "gateway accepted"
    accepted = condition(ConditionType.ACCEPTED, True, reason, message, generation)
    programmed = condition(ConditionType.PROGRAMMED, True, Reason.PROGRAMMED, message, generation)
    resolved = ResolvedGateway(gateway.key, spec.gateway_class_name, tuple(valid))
    return resolved, [ResourceStatus(gateway.ref, (accepted, programmed)), *statuses]


def _pool_statuses(resolution: PoolResolution, routes: list[RouteResult]) -> list[ResourceStatus]:
    """One entry per Gateway whose routes reference the pool (GIE's status.parents)."""
    source = resolution.source
    generation = source.observed_generation
    per_parent: dict[ResourceRef, bool] = {}
    for result in routes:
        if source.key not in result.referenced_pools:
            continue
        for parent, accepted in result.parents:
            per_parent[parent] = per_parent.get(parent, False) or accepted
    if not per_parent:
        pending = condition(
            ConditionType.ACCEPTED, None, Reason.PENDING, "no HTTPRoute references this pool", generation
        )
        return [ResourceStatus(source.ref, (pending, resolution.resolved_refs))]
    statuses = []
    for parent, accepted in sorted(per_parent.items()):
        if accepted:
            cond = condition(
                ConditionType.ACCEPTED,
                True,
                Reason.ACCEPTED,
                "referenced by an accepted HTTPRoute",
                generation,
            )
        else:
            message = "every HTTPRoute referencing this pool was rejected by this parent"
            cond = condition(
                ConditionType.ACCEPTED, False, Reason.HTTPROUTE_NOT_ACCEPTED, message, generation
            )
        statuses.append(ResourceStatus(source.ref, (cond, resolution.resolved_refs), parent=parent))
    return statuses


def _backend_tls_statuses(policies: BackendTlsPolicies, routes: list[RouteResult],
                          pickers: Mapping[ObjectKey, ObjectKey]) -> list[ResourceStatus]:
    """A BackendTLSPolicy's conditions per ancestor: each Gateway that accepted a route sending
    requests to one of its targets, or to a pool whose picker's Service it targets (``pickers``:
    pool → that Service), as the Gateway API's policy status lists them; none yet: one entry
    without a parent (``kvgate status`` shows it; nothing is written to the cluster)."""
    statuses = []
    for judged in policies.judged:
        ancestors: set[ResourceRef] = set()
        for result in routes:
            services = result.referenced_services | {
                pickers[pool] for pool in result.referenced_pools if pool in pickers}
            for kind, key in judged.targets:
                uses = key in (services if kind == SERVICE else result.referenced_pools)
                if uses:
                    ancestors.update(parent for parent, accepted in result.parents if accepted)
        conditions = (judged.accepted, judged.resolved_refs)
        if not ancestors:
            statuses.append(ResourceStatus(judged.policy.ref, conditions))
        statuses.extend(ResourceStatus(judged.policy.ref, conditions, parent=parent)
                        for parent in sorted(ancestors))
    return statuses


POOL_REF_GROUPS = frozenset({"inference.networking.k8s.io", "llm-d.ai"})
"""A poolRef's group naming the InferencePool: the Inference Extension's, or ``llm-d.ai``, which
llm-d's InferenceObjective and InferenceModelRewrite CRDs default it to (the pool itself is the
Inference Extension's)."""


def _pool_ref_problem(
    ref: PoolObjectReference, namespace: str, pools: Mapping[ObjectKey, object]
) -> str | None:
    if ref.group not in POOL_REF_GROUPS or ref.kind != "InferencePool":
        return f"poolRef kind {ref.group}/{ref.kind} is not supported"
    if ObjectKey(namespace, ref.name) not in pools:
        return f"InferencePool {namespace}/{ref.name} not found"
    return None


def _rewrite_tables(
    rewrites: list[InferenceModelRewrite], order: Mapping[ObjectKey, int]
) -> tuple[Mapping[ObjectKey, ModelRewriteTable], list[ResourceStatus]]:
    """Merge the rewrites of each pool in GIE's precedence (exact first; oldest, then load order)."""

    def age(rewrite: InferenceModelRewrite) -> tuple[str, int]:
        # Missing timestamps sort last among dated ones ("~" > any digit); load order breaks ties.
        return (rewrite.metadata.creation_timestamp or "~", order[rewrite.key])

    statuses: list[ResourceStatus] = []
    exact: dict[ObjectKey, list[ModelRewriteRule]] = {}
    generic: dict[ObjectKey, list[ModelRewriteRule]] = {}
    claimed: dict[tuple[ObjectKey, str], ObjectKey] = {}
    for rewrite in sorted(rewrites, key=age):
        pool = ObjectKey(rewrite.metadata.namespace, rewrite.spec.pool_ref.name)
        shadowed: list[str] = []
        for rule in rewrite.spec.rules:
            targets = tuple(WeightedModel(model, weight) for model, weight in rule.weighted_targets)
            models = frozenset(match.model.value for match in rule.matches)
            for model in sorted(models):
                owner = claimed.setdefault((pool, model), rewrite.key)
                if owner != rewrite.key:
                    shadowed.append(f"{model!r} (already rewritten by {owner})")
            bucket = exact if models else generic
            bucket.setdefault(pool, []).append(ModelRewriteRule(rewrite.key, models, targets))
        generation = rewrite.observed_generation
        if shadowed:
            message = "older rewrites take precedence for " + ", ".join(shadowed)
            cond = condition(ConditionType.ACCEPTED, True, Reason.MODEL_NAME_IN_USE, message, generation)
        else:
            cond = condition(ConditionType.ACCEPTED, True, Reason.ACCEPTED, "rewrite accepted", generation)
        statuses.append(ResourceStatus(rewrite.ref, (cond,)))
    tables = {
        pool: ModelRewriteTable(pool, tuple(exact.get(pool, [])) + tuple(generic.get(pool, [])))
        for pool in sorted(set(exact) | set(generic))
    }
    return MappingProxyType(tables), statuses


SPILL_ANNOTATION = "kvgate.io/spill-to"
"""On an InferencePool: the pool (a name in its namespace) that takes its requests when it is full."""


def spill_chains(pools: list[ResolvedPool], sources: Mapping[ObjectKey, InferencePool]
                 ) -> tuple[list[ResolvedPool], list[str]]:
    """``pools`` with their spill targets and the endpoints down each chain; a target that is not a
    resolved pool, or one that leads back, is left out with a note."""
    by_key = {pool.key: pool for pool in pools}
    targets: dict[ObjectKey, ObjectKey] = {}
    notes: list[str] = []
    for pool in pools:
        name = sources[pool.key].metadata.annotations.get(SPILL_ANNOTATION, "").strip()
        if not name:
            continue
        target = ObjectKey(pool.key.namespace, name)
        if target not in by_key or target == pool.key:
            notes.append(f"InferencePool {pool.key}: {SPILL_ANNOTATION} {name!r} names no other resolved "
                         "InferencePool in its namespace; no spill")
            continue
        if (by_key[target].model_server_tls, by_key[target].backend_tls, by_key[target].http2) != (
                pool.model_server_tls, pool.backend_tls, pool.http2):  # (one Envoy cluster reaches both)
            notes.append(f"InferencePool {pool.key}: {SPILL_ANNOTATION} {name!r}: its model servers are "
                         "reached with other TLS settings (kvgate.io/model-server-tls, -ca-file, or a "
                         "BackendTLSPolicy) or appProtocol; no spill")
            continue
        targets[pool.key] = target
    out = []
    for pool in pools:
        chain: list[ObjectKey] = []
        step = targets.get(pool.key)
        while step is not None and step != pool.key and step not in chain:
            chain.append(step)
            step = targets.get(step)
        if step == pool.key:
            notes.append(f"InferencePool {pool.key}: {SPILL_ANNOTATION} leads back to it; no spill")
            chain = []
        addresses = tuple(dict.fromkeys(a for key in chain for a in by_key[key].addresses
                                        if a not in pool.addresses))
        out.append(dataclasses.replace(pool, spill_to=chain[0] if chain else None, spill_addresses=addresses))
    return out, notes


def validate(resources: ResourceSet, options: ValidationOptions | None = None,
             last_good: LastGood | None = None) -> ValidatedConfig:
    """Resolve every reference and compute every resource's status conditions. ``last_good``: the
    certificates the previous configuration served (``ValidatedConfig.certificates``): an HTTPS
    listener whose Secret can no longer be read goes on serving its own, and says so."""
    last_good = last_good or {}
    options = options or ValidationOptions()
    statuses: list[ResourceStatus] = []

    gateways: dict[ObjectKey, tuple[ResolvedGateway, Mapping[str, Listener]]] = {}
    for gateway in resources.gateways:
        resolved_gateway, gateway_statuses = _validate_gateway(gateway, options, resources, last_good)
        statuses.extend(gateway_statuses)
        if resolved_gateway is not None:
            gateways[gateway.key] = (resolved_gateway, {ls.name: ls for ls in gateway.spec.listeners})

    backend_tls = resolve_backend_tls(resources, options.system_ca_file)
    resolutions = {
        pool.key: resolve_pool(resources, pool, require_picker_service=options.require_picker_service,
                               backend_tls=backend_tls.for_pool(pool.key), policies=backend_tls)
        for pool in resources.inference_pools
    }

    def lookup(key: ObjectKey) -> ResolvedPool | str | None:
        found = resolutions.get(key)
        if found is None:
            return None
        return found.pool if found.pool is not None else f"InferencePool {key}: {found.resolved_refs.message}"

    route_results = settle_kind_conflicts([
        validate_route(resources, route, gateways, lookup, backend_tls)
        for route in (*resources.http_routes, *(grpc.as_http_route() for grpc in resources.grpc_routes))])
    for result in route_results:
        statuses.extend(result.statuses)
    pickers = {key: ObjectKey(key.namespace, res.pool.picker.service)
               for key, res in resolutions.items() if res.pool is not None and res.pool.picker.addresses}
    statuses.extend(_backend_tls_statuses(backend_tls, route_results, pickers))
    for resolution in resolutions.values():
        statuses.extend(_pool_statuses(resolution, route_results))

    objectives = []
    for objective in resources.objectives:
        generation = objective.observed_generation
        problem = _pool_ref_problem(objective.spec.pool_ref, objective.metadata.namespace, resolutions)
        if problem is None:
            pool = ObjectKey(objective.metadata.namespace, objective.spec.pool_ref.name)
            objectives.append(ResolvedObjective(objective.key, pool, objective.spec.effective_priority))
            text = f"priority {objective.spec.effective_priority}"
            cond = condition(ConditionType.ACCEPTED, True, Reason.ACCEPTED, text, generation)
        else:
            cond = condition(ConditionType.ACCEPTED, False, Reason.POOL_NOT_FOUND, problem, generation)
        statuses.append(ResourceStatus(objective.ref, (cond,)))

    usable_rewrites = []
    for rewrite in resources.rewrites:
        problem = _pool_ref_problem(rewrite.spec.pool_ref, rewrite.metadata.namespace, resolutions)
        if problem is None:
            usable_rewrites.append(rewrite)
        else:
            cond = condition(
                ConditionType.ACCEPTED, False, Reason.POOL_NOT_FOUND, problem, rewrite.observed_generation
            )
            statuses.append(ResourceStatus(rewrite.ref, (cond,)))
    order = {rewrite.key: index for index, rewrite in enumerate(resources.rewrites)}
    tables, rewrite_statuses = _rewrite_tables(usable_rewrites, order)
    statuses.extend(rewrite_statuses)

    routes: list[ResolvedRoute] = [result.route for result in route_results if result.route is not None]
    pools, spill_notes = spill_chains([res.pool for res in resolutions.values() if res.pool is not None],
                                      {pool.key: pool for pool in resources.inference_pools})
    return ValidatedConfig(
        gateways=tuple(sorted((gw for gw, _ in gateways.values()), key=lambda gw: gw.key)),
        routes=tuple(sorted(routes, key=lambda route: (route.key, route.kind))),
        pools=tuple(sorted(pools, key=lambda pool: pool.key)),
        objectives=tuple(sorted(objectives, key=lambda objective: objective.key)),
        rewrites=tables,
        status=StatusReport.of(sorted(statuses, key=lambda s: (s.resource, str(s.parent), s.section or ""))),
        notes=(*resources.notes, *spill_notes),
    )
