"""A rule's backendRefs → weighted targets (cluster, per-filter config, backend filters) and clusters.

An InferencePool target goes to the pool's ORIGINAL_DST cluster with an ``ExtProcPerRoute`` naming
the pool (on the route for one target, on each weighted entry for a split: verified to reach the
picker). A FailOpen pool also has a fallback cluster, used by the route of the pair that matches when
the picker set no destination. A Service target goes to a STATIC cluster with ext_proc disabled. An
invalid backend keeps its weight: its share goes to a cluster with no endpoints and is tagged so the
listener's local-reply mapper turns Envoy's 503 into the Gateway API's 500.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvgate.extproc.names import BACKEND_REQUEST_METADATA_KEY, SESSION_METADATA_KEY, is_system_owned
from kvgate.gateway.controlplane import envoy_clusters as ecl
from kvgate.gateway.controlplane import envoy_config as ec
from kvgate.gateway.controlplane.resources import BackendKind, ResolvedBackend, ResolvedPool, ResolvedRule
from kvgate.gateway.controlplane.resources.backend_tls import BackendTls
from kvgate.gateway.controlplane.resources.gateway_api import HeaderModifier, HTTPRouteFilter
from kvgate.gateway.controlplane.resources.resolved import BackendProtocol
from kvgate.gateway.controlplane.translate.names import (
    INVALID_BACKEND_CLUSTER,
    INVALID_BACKEND_HEADER,
    picker_cluster_name,
    service_cluster_name,
)
from kvgate.gateway.controlplane.translate.sessions import session_spec
from kvgate.gateway.controlplane.translate.settings import TranslationSettings
from kvgate.policies.types import FailureMode

JsonDict = dict[str, Any]

PER_ROUTE_TYPE = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
EXT_PROC_DISABLED: Mapping[str, JsonDict] = {ec.EXT_PROC_FILTER: {"@type": PER_ROUTE_TYPE, "disabled": True}}
EXT_PROC_ENABLED: Mapping[str, JsonDict] = {
    ec.EXT_PROC_FILTER: ec.ext_proc_enabled({"@type": PER_ROUTE_TYPE, "overrides": {}}),
}
"""The filter turned on for a route whose weighted clusters name their pools (Envoy refuses a
``FilterConfig`` with no config)."""


@dataclass(frozen=True, slots=True)
class Target:
    """One weighted destination of a rule. ``fallback_cluster`` differs from ``cluster`` only for a
    FailOpen pool (the cluster used when the picker could not be asked)."""

    weight: int
    cluster: str
    fallback_cluster: str
    per_filter: Mapping[str, JsonDict]
    """Per-filter configs of the target as a weighted cluster of a route."""
    route_filter: Mapping[str, JsonDict]
    """The same as a route's own (a pool's ``ExtProcPerRoute`` in the ``FilterConfig`` that turns
    the filter on: ``ec.ext_proc_filter``)."""
    headers: JsonDict = field(default_factory=dict)
    """``request_headers_to_add`` / ``request_headers_to_remove`` / ``host_rewrite_literal`` of the
    backendRef's own filters."""
    retries: bool = False
    """A pool whose cluster follows the picker's fallbacks: its routes retry (``pool_retry_policy``)."""


@dataclass(slots=True)
class ClusterSet:
    """Clusters collected during one translation, by name (the same name always has the same config)."""

    by_name: dict[str, JsonDict] = field(default_factory=dict)
    per_filter: dict[str, tuple[Mapping[str, JsonDict], Mapping[str, JsonDict]]] = field(default_factory=dict)
    """Per-filter configs by pool id (a weighted cluster's, a route's): one shared object per pool
    (parsed once into protobuf)."""

    def add(self, cluster: JsonDict) -> str:
        name: str = cluster["name"]
        self.by_name.setdefault(name, cluster)
        return name

    def sorted(self) -> tuple[JsonDict, ...]:
        return tuple(self.by_name[name] for name in sorted(self.by_name))


def static_cluster(name: str, addresses: tuple[str, ...] = ()) -> JsonDict:
    """Round robin over ``addresses`` (``ip:port``); none: every request gets 503 "no healthy upstream"."""
    lb_endpoints = [
        {"endpoint": {"address": ecl.socket_address(*ecl.split_host_port(address))}} for address in addresses
    ]
    return {
        "name": name,
        "type": "STATIC",
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": ec.duration(2.0),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": lb_endpoints}] if lb_endpoints else [],
        },
    }


HTTP2_OPTIONS: JsonDict = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    }
}
"""A cluster's upstream HTTP/2 (prior knowledge in clear text; offered by ALPN over TLS)."""


def backend_transport(tls: BackendTls, alpn: tuple[str, ...] = ("http/1.1",)) -> JsonDict:
    """Envoy's TLS to a backend that a BackendTLSPolicy governs."""
    return ecl.verified_tls(tls.hostname, tls.ca_pem, tls.ca_file, tls.verified_names, alpn)


def pool_transport(pool: ResolvedPool) -> JsonDict | None:
    """TLS to the pool's model servers: a BackendTLSPolicy's, else the pool's annotations', else none."""
    if pool.backend_tls is not None:
        return backend_transport(pool.backend_tls, ("h2",) if pool.http2 else ("http/1.1",))
    if pool.model_server_tls is not None:
        transport = ecl.model_server_tls(pool.model_server_tls.ca_file)
        if pool.http2:
            transport["typed_config"]["common_tls_context"]["alpn_protocols"] = ["h2"]
        return transport
    return None


def with_pool_protocol(pool: ResolvedPool, cluster: JsonDict) -> JsonDict:
    """``cluster`` (one that reaches the pool's model servers) speaking the pool's protocol: TLS
    where it is asked for, HTTP/2 for an ``appProtocol: kubernetes.io/h2c`` pool."""
    transport = pool_transport(pool)
    if transport is not None:
        cluster["transport_socket"] = transport
    if pool.http2:
        cluster["typed_extension_protocol_options"] = copy.deepcopy(HTTP2_OPTIONS)
    return cluster





def service_cluster(backend: ResolvedBackend, name: str | None = None, *, http2: bool = False) -> JsonDict:
    """A Service backend's cluster: HTTP/2 for ``http2`` or an ``appProtocol: kubernetes.io/h2c``
    port (or a GRPCRoute's backend), else HTTP/1.1; TLS where a BackendTLSPolicy governs it. An
    HTTP/2 cluster's name says so: one port may be an HTTPRoute's backend in HTTP/1.1 and a
    GRPCRoute's in HTTP/2."""
    http2 = http2 or backend.protocol is BackendProtocol.H2C
    default_name = service_cluster_name(backend.key, backend.port) + ("_h2" if http2 else "")
    cluster = static_cluster(name or default_name, backend.addresses)
    if http2:
        cluster["typed_extension_protocol_options"] = copy.deepcopy(HTTP2_OPTIONS)
    if backend.tls is not None:
        cluster["transport_socket"] = backend_transport(backend.tls, ("h2",) if http2 else ("http/1.1",))
    return cluster


def pool_clusters(pool: ResolvedPool, settings: TranslationSettings) -> list[JsonDict]:
    """The pool's cluster (the picker's pick and fallbacks over its replicas, or ORIGINAL_DST for an
    external picker or with ``endpoint_fallbacks`` off), the FailOpen fallback (possibly empty) and an
    external picker's cluster."""
    if follows_fallbacks(pool, settings):
        # the spill chain's endpoints too: the picker may name one when the pool is full
        clusters = [ecl.pool_override_cluster(pool.id, (*pool.addresses, *pool.spill_addresses))]
    else:
        clusters = [ecl.pool_cluster(pool.id)]
    if pool.picker.failure_mode is FailureMode.FAIL_OPEN:
        backend = ecl.PoolBackend(pool.id, FailureMode.FAIL_OPEN, pool.addresses)
        if pool.addresses:
            clusters.append(ecl.pool_fallback_cluster(backend))
        else:
            clusters.append(static_cluster(ecl.pool_fallback_cluster_name(pool.id)))
    for cluster in clusters:  # (the clusters that reach the model servers)
        with_pool_protocol(pool, cluster)
    if pool.picker.addresses:
        name = picker_cluster_name(pool.key.namespace, pool.picker.service, pool.picker.port)
        addresses = [ecl.split_host_port(address) for address in pool.picker.addresses]
        # another endpoint picker (the Inference Extension's, or kvgate picker elsewhere) serves TLS by
        # default (--secure-serving), with a certificate no one can verify: encrypted, not verified
        cluster = ecl.ext_proc_cluster(addresses, name, tls=True)
        if pool.picker.tls is not None:  # (verified as its Service's BackendTLSPolicy asks)
            cluster["transport_socket"] = backend_transport(pool.picker.tls, ("h2",))
        clusters.append(cluster)
    return clusters


def follows_fallbacks(pool: ResolvedPool, settings: TranslationSettings) -> bool:
    """Whether the pool's cluster and routes use the picker's fallback endpoints (kvgate's own picker)."""
    return settings.endpoint_fallbacks and not pool.picker.addresses


def pool_per_route(pool: ResolvedPool, settings: TranslationSettings) -> JsonDict:
    """``ExtProcPerRoute`` naming the pool (and its external picker, if it has one).

    An external picker (another endpoint picker, e.g. the Inference Extension's own) is spoken to
    in GIE's processing mode (full duplex both ways, unless FailOpen needs a buffered request):
    kvgate's one-pass mode is for its own picker.
    """
    backend = ecl.PoolBackend(pool.id, pool.picker.failure_mode)
    external = bool(pool.picker.addresses)
    ext_proc = settings.ext_proc
    if external:
        ext_proc = ec.ExtProcSettings(cluster_name=ext_proc.cluster_name)
    per_route = ec.ext_proc_per_route(backend, ext_proc)
    if external:
        name = picker_cluster_name(pool.key.namespace, pool.picker.service, pool.picker.port)
        overrides = per_route["overrides"]
        overrides["grpc_service"] = {
            "envoy_grpc": {"cluster_name": name},
            "timeout": ec.duration(settings.ext_proc.grpc_timeout_s),
        }
        overrides.setdefault("processing_mode", ec.processing_mode(ext_proc.request_body_mode,
                                                                   ext_proc.response_body_mode))
    return per_route


def header_modifier(modifier: HeaderModifier, warnings: list[str], owner: str, *,
                    response: bool = False) -> JsonDict:
    """Envoy ``request_headers_to_add/remove`` for a RequestHeaderModifier (``response_…`` for a
    ResponseHeaderModifier); system headers are refused."""
    kind, side = ("ResponseHeaderModifier", "response") if response else ("RequestHeaderModifier", "request")

    def allowed(name: str) -> bool:
        lower = name.lower()
        if is_system_owned(lower) or lower == INVALID_BACKEND_HEADER:
            warnings.append(f"{owner}: {kind} may not touch system header {name!r}; ignored")
            return False
        return True

    to_add = [
        {"header": {"key": h.name.lower(), "value": h.value}, "append_action": action}
        for group, action in (
            (modifier.set, "OVERWRITE_IF_EXISTS_OR_ADD"),
            (modifier.add, "APPEND_IF_EXISTS_OR_ADD"),
        )
        for h in group
        if allowed(h.name)
    ]
    to_remove = [name.lower() for name in modifier.remove if allowed(name)]
    fields: JsonDict = {}
    if to_add:
        fields[f"{side}_headers_to_add"] = to_add
    if to_remove:
        fields[f"{side}_headers_to_remove"] = to_remove
    return fields


def _backend_filters(filters: tuple[HTTPRouteFilter, ...], warnings: list[str], owner: str) -> JsonDict:
    fields: JsonDict = {}
    for flt in filters:
        if flt.request_header_modifier is not None:
            fields.update(header_modifier(flt.request_header_modifier, warnings, owner))
        if flt.response_header_modifier is not None:
            fields.update(header_modifier(flt.response_header_modifier, warnings, owner, response=True))
        if flt.url_rewrite is not None:
            if flt.url_rewrite.hostname is not None:
                fields["host_rewrite_literal"] = flt.url_rewrite.hostname
            if flt.url_rewrite.path is not None:
                warnings.append(f"{owner}: a backendRef URLRewrite path is not supported; ignored")
    return fields


def _target(
    backend: ResolvedBackend,
    settings: TranslationSettings,
    clusters: ClusterSet,
    warnings: list[str],
    owner: str,
    grpc: bool = False,
) -> Target:
    headers = _backend_filters(backend.filters, warnings, f"{owner} backend {backend.key}")
    if backend.valid and backend.kind is BackendKind.INFERENCE_POOL and backend.pool is not None:
        pool = backend.pool
        names = [clusters.add(cluster) for cluster in pool_clusters(pool, settings)]
        fail_open = pool.picker.failure_mode is FailureMode.FAIL_OPEN
        configs = clusters.per_filter.get(pool.id)
        if configs is None:
            per_route = pool_per_route(pool, settings)
            configs = clusters.per_filter[pool.id] = (
                {ec.EXT_PROC_FILTER: per_route}, {ec.EXT_PROC_FILTER: ec.ext_proc_enabled(per_route)},
            )
        return Target(
            backend.weight, names[0], names[1] if fail_open else names[0], *configs, headers,
            follows_fallbacks(pool, settings),
        )
    if backend.valid and backend.kind is BackendKind.SERVICE:
        name = clusters.add(service_cluster(backend))
        return Target(backend.weight, name, name, EXT_PROC_DISABLED, EXT_PROC_DISABLED, headers)
    clusters.add(static_cluster(INVALID_BACKEND_CLUSTER))
    if grpc:  # Envoy's 503 "no healthy upstream" is a gRPC call's UNAVAILABLE, as GRPCRoute asks
        return Target(backend.weight, INVALID_BACKEND_CLUSTER, INVALID_BACKEND_CLUSTER, EXT_PROC_DISABLED,
                      EXT_PROC_DISABLED, {})
    tag = {
        "header": {"key": INVALID_BACKEND_HEADER, "value": "1"},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
    return Target(
        backend.weight,
        INVALID_BACKEND_CLUSTER,
        INVALID_BACKEND_CLUSTER,
        EXT_PROC_DISABLED,
        EXT_PROC_DISABLED,
        {"request_headers_to_add": [tag]},
    )


def rule_targets(
    rule: ResolvedRule, settings: TranslationSettings, clusters: ClusterSet, warnings: list[str], owner: str,
    *, grpc: bool = False,
) -> tuple[Target, ...]:
    """The weighted targets of a rule that does not answer 500 (backends of weight 0 are left out);
    a rule with ``timeouts.backendRequest`` or ``sessionPersistence`` tells its pools' picker
    (``with_initial_metadata``). ``grpc``: a GRPCRoute's rule, whose invalid backends' share is
    UNAVAILABLE (Envoy's 503), not 500."""
    targets = tuple(
        _target(backend, settings, clusters, warnings, owner, grpc)
        for backend in rule.backends
        if backend.weight > 0
    )
    metadata: list[tuple[str, str]] = []
    seconds = rule.timeouts.backend_request_seconds if rule.timeouts is not None else None
    if seconds:  # (None: unset; 0: no timeout)
        metadata.append((BACKEND_REQUEST_METADATA_KEY, str(max(1, round(seconds * 1000)))))
    if rule.session_persistence is not None:
        spec = session_spec(rule.session_persistence, warnings, owner)
        metadata.append((SESSION_METADATA_KEY, spec.encode()))
        if any(backend.kind is BackendKind.SERVICE for backend in rule.backends):
            warnings.append(f"{owner}: sessionPersistence applies to InferencePool backends (their picker "
                            "keeps the sessions); its Service backends are balanced without it")
    if not metadata:
        return targets
    return tuple(dataclasses.replace(target, per_filter=with_initial_metadata(target.per_filter, metadata),
                                     route_filter=with_initial_metadata(target.route_filter, metadata))
                 for target in targets)


def with_initial_metadata(
    configs: Mapping[str, JsonDict], added: list[tuple[str, str]]
) -> Mapping[str, JsonDict]:
    """``configs`` with each ext_proc override's gRPC initial metadata also carrying ``added``
    (copies: the pool's own configs are shared by its other rules)."""
    out: dict[str, JsonDict] = {}
    for name, config in configs.items():
        copied = copy.deepcopy(config)
        per_route = copied.get("config", copied)  # (a FilterConfig wraps the ExtProcPerRoute)
        metadata = per_route.get("overrides", {}).get("grpc_initial_metadata")
        if isinstance(metadata, list):
            metadata.extend({"key": key, "value": value} for key, value in added)
        out[name] = copied
    return out


def cluster_action(targets: tuple[Target, ...], picked: bool) -> tuple[JsonDict, JsonDict]:
    """(route-action fields, route-level fields) sending to ``targets``; ``picked``: the picker set a
    destination (FailOpen pools use their ORIGINAL_DST cluster), else the fallback clusters."""
    if len(targets) == 1:
        target = targets[0]
        action: JsonDict = {"cluster": target.cluster if picked else target.fallback_cluster}
        route_fields: JsonDict = {"typed_per_filter_config": dict(target.route_filter)}
        for key, value in target.headers.items():
            (action if key == "host_rewrite_literal" else route_fields)[key] = value
        return action, route_fields
    entries = []
    for target in targets:
        entry: JsonDict = {
            "name": target.cluster if picked else target.fallback_cluster,
            "weight": target.weight,
            **target.headers,
            "typed_per_filter_config": dict(target.per_filter),
        }
        entries.append(entry)
    # The ext_proc filter is off unless the route turns it on (ec.ext_proc_filter); each weighted
    # cluster then names its pool, or turns it off again (a Service backend).
    weighted = {"weighted_clusters": {"clusters": entries}}
    if any(target.per_filter is not EXT_PROC_DISABLED for target in targets):
        return weighted, {"typed_per_filter_config": dict(EXT_PROC_ENABLED)}
    return weighted, {}
