"""Envoy configuration as plain dicts (proto-JSON shape): pure builders, no IO.

Each builder returns one Envoy resource (a cluster, a listener, a route, an HTTP filter) so that the
static bootstrap here and the xDS translator reuse the same code. The shapes follow the behaviour of
real Envoy 1.40 measured in ``docs/envoy-extproc.md``:

- one ORIGINAL_DST cluster per pool follows ``x-gateway-destination-endpoint`` (ONE ``ip:port``);
- the pool reaches the picker as gRPC initial metadata ``x-kvgate-pool`` from a per-route
  ``ExtProcPerRoute`` override;
- FULL_DUPLEX_STREAMED cannot fail open for requests with a body, so a FailOpen pool's routes switch
  the request body to BUFFERED, and its requests go to a round-robin cluster of the pool's endpoints
  unless the picker set the destination (matched through the ``envoy.lb`` dynamic metadata, which a
  client cannot forge).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kvgate.extproc.names import (
    DESTINATION_HEADER,
    LB_NAMESPACE,
    OUTCOME_HEADER,
    POOL_METADATA_KEY,
    SERVED_KEY,
    STREAM_HEADER,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
)
from kvgate.gateway.controlplane.downstream import DownstreamSettings
from kvgate.gateway.controlplane.downstream import duration as duration  # re-exported: every builder uses it
from kvgate.gateway.controlplane.envoy_clusters import (
    EXT_PROC_CLUSTER,
    PoolBackend,
    ext_proc_cluster,
    pool_cluster_name,
    pool_clusters,
    pool_fallback_cluster_name,
    socket_address,
)
from kvgate.gateway.controlplane.local_replies import openai_local_replies
from kvgate.policies.types import FailureMode

JsonDict = dict[str, Any]
BodyMode = Literal["FULL_DUPLEX_STREAMED", "BUFFERED", "STREAMED", "NONE"]

EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
OUTCOME_CLUSTER = "kvgate_outcomes"
"""The pickers' outcome-report ports: loopback, apart from the ext_proc port (``extproc.server``)."""
_TYPE = "type.googleapis.com/"
_HCM_TYPE = _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_EXT_PROC_TYPE = _TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_PER_ROUTE_TYPE = _TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute"
FILTER_CONFIG_TYPE = _TYPE + "envoy.config.route.v3.FilterConfig"
_STRIPPED_HEADERS = (DESTINATION_HEADER, SERVED_KEY, SUBSET_KEY, STREAM_HEADER, OUTCOME_HEADER)


@dataclass(frozen=True, slots=True)
class ExtProcSettings:
    """How the ext_proc filter talks to the picker (the same for every pool).

    The defaults are GIE's processing mode (full duplex both ways), as the Inference Extension's
    gateways configure a picker; :data:`ONE_PASS` is what kvgate writes for its own Envoy.
    """

    cluster_name: str = EXT_PROC_CLUSTER
    request_body_mode: BodyMode = "FULL_DUPLEX_STREAMED"
    response_body_mode: BodyMode = "FULL_DUPLEX_STREAMED"
    message_timeout_s: float = 30.0
    max_message_timeout_s: float = 3600.0
    """The most a picker may extend one message's timeout to (Envoy's limit, an hour; a held
    request asks for its queue timeout, at most 30 minutes, plus ``message_timeout_s``)."""
    grpc_timeout_s: float = 30.0
    max_body_bytes: int = 8 * 1024 * 1024
    send_served_endpoint: bool = True
    allow_mode_override: bool = False
    """Lets the picker turn the response body on per request (in its reply to the response headers)."""
    tls: bool = False
    """Reach the picker over TLS without verifying its certificate (the Inference Extension's
    reference configuration; ``kvgate picker``'s default ``--secure-serving``); kvgate up's own
    loopback link stays plaintext."""
    response_header_mode: Literal["SEND", "SKIP"] = "SEND"
    """SKIP: the picker never sees the response (the Inference Extension's reference configuration
    with BUFFERED requests); the served endpoint and the end of the response are then unknown to it."""
    outcome_reports: bool = False
    """Envoy reports the outcome of each request the picker marked (``x-kvgate-outcome``: those
    whose response it skips) to the pickers' gRPC access-log service, in batches off the request
    path (:func:`outcome_access_log`, ``extproc.outcomes``), through the cluster
    ``outcome_cluster_name`` (the pickers' outcome ports, never their ext_proc port)."""
    outcome_cluster_name: str = OUTCOME_CLUSTER


ONE_PASS = ExtProcSettings(request_body_mode="BUFFERED", response_body_mode="NONE", allow_mode_override=True)
"""kvgate's own data path: the request crosses into Python once (headers, then the whole body in one
message, no echo of it), the response headers come for the status and the served endpoint, and the
response body stays in Envoy unless the picker turns it on for one request (model rename, token
limits, sampled usage). The ext_proc stream stays open until the HTTP request ends, which is how the
picker learns that it ended (measured on Envoy 1.40: extproc/lifecycle.py)."""


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """One route: requests matching ``path_prefix`` (and the exact ``headers``) go to ``pool``."""

    name: str
    pool: str
    path_prefix: str = "/"
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 0.0
    """Route timeout; 0 disables it (LLM responses can be long)."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything a static bootstrap needs."""

    listen_port: int
    admin_port: int
    picker_addresses: tuple[tuple[str, int], ...]
    pools: tuple[PoolBackend, ...]
    routes: tuple[RouteSpec, ...] = ()
    """Empty: one catch-all route to the first pool."""
    listen_host: str = "127.0.0.1"
    settings: ExtProcSettings = field(default_factory=ExtProcSettings)
    subset_hint: tuple[str, ...] | None = None
    """If set, every request carries this ``envoy.lb.subset_hint`` (tests, fixed deployments)."""
    outcome_addresses: tuple[tuple[str, int], ...] = ()
    """The pickers' outcome-report ports (with ``settings.outcome_reports``)."""


def stream_retry_policy(retries: int, idle_timeout_s: float) -> JsonDict:
    """:func:`pool_retry_policy` for a streamed request, plus an idle timeout per attempt: a replica
    that accepts and then sends nothing (no headers, no token) for ``idle_timeout_s`` is abandoned
    and, when nothing reached the client yet, the request goes to the next endpoint (verified on
    Envoy 1.40: a hung first host, one idle timeout, served by the second). Streams only: a
    non-streamed generation is silent until it ends."""
    return {**pool_retry_policy(retries), "per_try_idle_timeout": duration(idle_timeout_s)}


def pool_retry_policy(retries: int) -> JsonDict:
    """Retry a request that has not started its response on the next endpoint the picker ranked, at
    most ``retries`` times: a replica's 5xx (overloaded, or an engine that died behind a live HTTP
    server) and no answer at all (Envoy's ``5xx`` includes connect failures and resets), and a reset
    before the request was sent. A response already streaming to the client is never retried."""
    return {"retry_on": "5xx,reset-before-request,refused-stream", "num_retries": retries}


def processing_mode(
    request_body_mode: BodyMode, response_body_mode: BodyMode, response_header_mode: str = "SEND"
) -> JsonDict:
    """GIE's processing mode; trailers are sent only with full-duplex bodies (Envoy needs them there)."""
    duplex = "FULL_DUPLEX_STREAMED"
    return {
        "request_header_mode": "SEND",
        "response_header_mode": response_header_mode,
        "request_body_mode": request_body_mode,
        "response_body_mode": response_body_mode,
        "request_trailer_mode": "SEND" if request_body_mode == duplex else "SKIP",
        "response_trailer_mode": "SEND" if response_body_mode == duplex else "SKIP",
    }


def ext_proc_filter(settings: ExtProcSettings) -> JsonDict:
    """The ext_proc HTTP filter. Fails closed; FailOpen pools relax it per route."""
    config: JsonDict = {
        "@type": _EXT_PROC_TYPE,
        "grpc_service": {
            "envoy_grpc": {"cluster_name": settings.cluster_name},
            "timeout": duration(settings.grpc_timeout_s),
        },
        "failure_mode_allow": False,
        # A FailClose pool whose picker is unreachable: 503 (local_replies gives it a body).
        "status_on_error": {"code": 503},
        "processing_mode": processing_mode(
            settings.request_body_mode, settings.response_body_mode, settings.response_header_mode
        ),
        "message_timeout": duration(settings.message_timeout_s),
        # A request the picker holds for room (flow control, extproc.holding) asks for longer
        # (override_message_timeout), up to this; 0 would turn the override off.
        "max_message_timeout": duration(settings.max_message_timeout_s),
        # The picker sets the router's per-try timeout header (extproc.attempt_timeout); ext_proc
        # refuses x-envoy-* mutations unless allowed. A client's copies never reach it: Envoy removes
        # the router's x-envoy-* headers from external requests, and with no internal_address_config
        # (kvgate writes none) every request is external (Envoy 1.40; tests/e2e/test_picker_contract).
        "mutation_rules": {"allow_envoy": True},
        "metadata_options": {
            "forwarding_namespaces": {"untyped": [SUBSET_NAMESPACE, LB_NAMESPACE]},
            "receiving_namespaces": {"untyped": [LB_NAMESPACE]},
        },
    }
    if settings.allow_mode_override:
        config["allow_mode_override"] = True
    if settings.send_served_endpoint:
        config["response_attributes"] = ["upstream.address"]
    # Off unless a route turns it on (ext_proc_enabled): Envoy's own reply to a request it could not
    # read (too many or too large headers) runs through every encoder filter, and an ext_proc filter
    # there opened a stream to the picker while the codec closed the connection: the client got an
    # empty reply instead of the 431 (measured on Envoy 1.40). Such a request matches no route.
    return {"name": EXT_PROC_FILTER, "typed_config": config, "disabled": True}


def ext_proc_enabled(per_route: JsonDict) -> JsonDict:
    """A route's ``typed_per_filter_config`` entry turning the ext_proc filter on (a
    ``FilterConfig``; the filter is off by default, :func:`ext_proc_filter`) with its
    ``ExtProcPerRoute``."""
    return {"@type": FILTER_CONFIG_TYPE, "config": per_route}


def ext_proc_per_route(pool: PoolBackend, settings: ExtProcSettings) -> JsonDict:
    """``ExtProcPerRoute`` naming the pool to the picker, with the pool's failure mode."""
    overrides: JsonDict = {}
    if pool.announced:
        overrides["grpc_initial_metadata"] = [{"key": POOL_METADATA_KEY, "value": pool.name}]
    if pool.failure_mode is FailureMode.FAIL_OPEN:
        overrides["failure_mode_allow"] = True
        if settings.request_body_mode == "FULL_DUPLEX_STREAMED":
            overrides["processing_mode"] = processing_mode("BUFFERED", settings.response_body_mode)
    return {"@type": _PER_ROUTE_TYPE, "overrides": overrides}


def strip_system_headers_filter() -> JsonDict:
    """Removes client-supplied system-owned headers before ext_proc and routing see them."""
    mutations = [{"remove": name} for name in _STRIPPED_HEADERS]
    return {
        "name": "kvgate.strip_system_headers",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": mutations},
        },
    }


def subset_hint_filter(addresses: Sequence[str]) -> JsonDict:
    """Sets the ``envoy.lb.subset_hint`` metadata the picker must honour."""
    return {
        "name": "kvgate.subset_hint",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [{"metadata_namespace": SUBSET_NAMESPACE, "value": {SUBSET_KEY: list(addresses)}}],
        },
    }


def router_filter() -> JsonDict:
    return {
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": _TYPE + "envoy.extensions.filters.http.router.v3.Router"},
    }


def _picked_match() -> JsonDict:
    """Matches once the picker has set ``envoy.lb`` dynamic metadata (a client cannot forge it)."""
    return {
        "filter": LB_NAMESPACE,
        "path": [{"key": DESTINATION_HEADER}],
        "value": {"present_match": True},
    }


def pool_routes(route: RouteSpec, pool: PoolBackend, settings: ExtProcSettings) -> list[JsonDict]:
    """The Envoy routes of one :class:`RouteSpec` (two for a FailOpen pool, picked one first)."""
    if route.pool != pool.name:
        raise ValueError(f"route {route.name!r} is for pool {route.pool!r}, not {pool.name!r}")
    match: JsonDict = {"prefix": route.path_prefix}
    if route.headers:
        match["headers"] = [
            {"name": name, "string_match": {"exact": value}} for name, value in route.headers
        ]
    per_filter = {EXT_PROC_FILTER: ext_proc_enabled(ext_proc_per_route(pool, settings))}

    def entry(name: str, route_match: JsonDict, cluster: str) -> JsonDict:
        return {
            "name": name,
            "match": route_match,
            # (WebSocket upgrades: kvgate's picker admits realtime sessions and refuses the rest)
            "route": {"cluster": cluster, "timeout": duration(route.timeout_s),
                      "upgrade_configs": [{"upgrade_type": "websocket"}]},
            "typed_per_filter_config": per_filter,
        }

    picked = entry(route.name, match, pool_cluster_name(pool.name))
    if pool.failure_mode is FailureMode.FAIL_CLOSE:
        return [picked]
    picked["match"] = {**match, "dynamic_metadata": [_picked_match()]}
    fallback = entry(f"{route.name}_fallback", match, pool_fallback_cluster_name(pool.name))
    return [picked, fallback]


def route_configuration(name: str, routes: Sequence[JsonDict], domains: Sequence[str] = ("*",)) -> JsonDict:
    return {
        "name": name,
        "virtual_hosts": [{"name": f"{name}_vh", "domains": list(domains), "routes": list(routes)}],
    }


OUTCOME_FLUSH_S = 0.05
"""How often Envoy sends the outcome reports it has gathered (each worker thread its own batch)."""


def outcome_access_log(cluster_name: str) -> JsonDict:
    """An HTTP gRPC access log of the requests the picker marked with ``x-kvgate-outcome``, to the
    ``AccessLogService`` of the pickers' outcome ports (``extproc.access_log``; the cluster
    ``cluster_name``): with that header and the destination header, batched every
    :data:`OUTCOME_FLUSH_S` or 16 KiB."""
    return {
        "name": "envoy.access_loggers.http_grpc",
        "filter": {"header_filter": {"header": {"name": OUTCOME_HEADER, "present_match": True}}},
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {
                "log_name": "kvgate-outcomes",
                "grpc_service": {"envoy_grpc": {"cluster_name": cluster_name}},
                "transport_api_version": "V3",
                "buffer_flush_interval": duration(OUTCOME_FLUSH_S),
                "buffer_size_bytes": 16384,
            },
            "additional_request_headers_to_log": [OUTCOME_HEADER, DESTINATION_HEADER],
        },
    }


def http_connection_manager(
    stat_prefix: str,
    route_config: JsonDict,
    settings: ExtProcSettings,
    extra_filters: Sequence[JsonDict] = (),
    limits: DownstreamSettings | None = None,
) -> JsonDict:
    """HCM: strip system headers → ``extra_filters`` → ext_proc → router."""
    filters = [strip_system_headers_filter(), *extra_filters, ext_proc_filter(settings), router_filter()]
    config: JsonDict = {
        "@type": _HCM_TYPE,
        "stat_prefix": stat_prefix,
        "codec_type": "AUTO",
        **(limits or DownstreamSettings()).http_connection_manager_fields(),
        "local_reply_config": openai_local_replies(settings.max_body_bytes),
        "route_config": route_config,
        "http_filters": filters,
    }
    logs = (limits or DownstreamSettings()).access_logs()
    if settings.outcome_reports:
        logs.append(outcome_access_log(settings.outcome_cluster_name))
    if logs:
        config["access_log"] = logs
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": config}


def listener(name: str, host: str, port: int, hcm: JsonDict, buffer_limit_bytes: int) -> JsonDict:
    """A listener with one filter chain; ``buffer_limit_bytes`` bounds BUFFERED bodies (Envoy: 413).

    ``SO_REUSEPORT`` is off: otherwise a second Envoy silently shares a port already in use.
    """
    return {
        "name": name,
        "address": socket_address(host, port),
        "enable_reuse_port": False,
        "per_connection_buffer_limit_bytes": buffer_limit_bytes,
        "filter_chains": [{"filters": [hcm]}],
    }


def admin(port: int, host: str = "127.0.0.1") -> JsonDict:
    return {"address": socket_address(host, port)}


def bootstrap(
    admin_port: int, listeners: Sequence[JsonDict], clusters: Sequence[JsonDict], node_id: str = "kvgate"
) -> JsonDict:
    """A static bootstrap (``kvgate picker`` behind a hand-written Envoy, the tests and benchmarks;
    ``kvgate up`` serves the same resources over ADS instead: ``gateway.controlplane.xds``)."""
    return {
        "node": {"id": node_id, "cluster": "kvgate"},
        "admin": admin(admin_port),
        "static_resources": {"listeners": list(listeners), "clusters": list(clusters)},
    }


def static_bootstrap(config: GatewayConfig) -> JsonDict:
    """The whole gateway as one static bootstrap."""
    if not config.pools:
        raise ValueError("at least one pool is needed")
    pools = {pool.name: pool for pool in config.pools}
    if len(pools) != len(config.pools):
        raise ValueError("pool names must be unique")
    specs = config.routes or (RouteSpec(name="default", pool=config.pools[0].name),)
    routes: list[JsonDict] = []
    for spec in specs:
        if spec.pool not in pools:
            raise ValueError(f"route {spec.name!r} names unknown pool {spec.pool!r}")
        routes.extend(pool_routes(spec, pools[spec.pool], config.settings))
    extra = [subset_hint_filter(config.subset_hint)] if config.subset_hint is not None else []
    hcm = http_connection_manager("kvgate", route_configuration("kvgate", routes), config.settings, extra)
    main = listener("kvgate", config.listen_host, config.listen_port, hcm, config.settings.max_body_bytes)
    settings = config.settings
    clusters = [ext_proc_cluster(config.picker_addresses, settings.cluster_name, tls=settings.tls)]
    if settings.outcome_reports:
        if not config.outcome_addresses:
            raise ValueError("outcome reports need the pickers' outcome addresses")
        clusters.append(ext_proc_cluster(config.outcome_addresses, settings.outcome_cluster_name))
    for pool in config.pools:
        clusters.extend(pool_clusters(pool))
    return bootstrap(config.admin_port, [main], clusters)
