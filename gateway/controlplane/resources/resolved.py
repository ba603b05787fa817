"""The validated configuration: what translation to Envoy reads. Immutable, sorted, references resolved.

Only what is usable appears: Gateways that are Accepted with their valid listeners, HTTPRoutes
attached to at least one listener, InferencePools whose picker reference resolved. A backend that
cannot be used stays in its rule with ``valid=False`` and its weight, because the Gateway API
says its share of traffic must get HTTP 500 (``ResolvedRule.answers_500`` when it is all of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from kvgate.gateway.controlplane.resources.backend_tls import BackendTls
from kvgate.gateway.controlplane.resources.certificates import ListenerCertificate
from kvgate.gateway.controlplane.resources.conditions import StatusReport
from kvgate.gateway.controlplane.resources.gateway_api import (
    HTTPExternalAuthFilter,
    HTTPRouteFilter,
    HTTPRouteMatch,
    HTTPRouteRetry,
    HTTPRouteTimeouts,
    RequestRedirect,
    SessionPersistence,
)
from kvgate.gateway.controlplane.resources.meta import ObjectKey
from kvgate.policies.types import Endpoint, FailureMode


@dataclass(frozen=True, slots=True)
class ResolvedListener:
    name: str
    port: int
    hostname: str | None
    certificate: ListenerCertificate | None = None
    """An HTTPS listener's certificate (TLS terminated by Envoy); None for HTTP."""


@dataclass(frozen=True, slots=True)
class ResolvedGateway:
    key: ObjectKey
    gateway_class_name: str
    listeners: tuple[ResolvedListener, ...]


@dataclass(frozen=True, slots=True)
class ResolvedPicker:
    """The endpoint picker of a pool. ``addresses`` empty: kvgate's in-process picker serves it."""

    service: str
    port: int
    failure_mode: FailureMode
    addresses: tuple[str, ...] = ()
    tls: BackendTls | None = None
    """Another picker's TLS as a BackendTLSPolicy on its Service asks it (else encrypted, not
    verified: the Inference Extension picker serves a self-signed certificate by default)."""


@dataclass(frozen=True, slots=True)
class ModelServerTls:
    """The pool's model servers serve HTTPS (vLLM's ``--ssl-certfile``): inference and metrics.
    ``ca_file`` (a path the picker and Envoy can read): verify their certificates against it (the
    chain only: pods are reached by IP); None: encrypted, not verified (the Inference Extension
    picker's default, ``--model-server-metrics-https-insecure-skip-verify``)."""

    ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class ResolvedPool:
    """An InferencePool with its endpoints: ready selected pods × targetPorts, sorted.

    ``id`` (``namespace/name``) is the pool name kvgate uses everywhere else (``Endpoint.pool``,
    the picker's pool identifier, cluster names).
    """

    key: ObjectKey
    target_ports: tuple[int, ...]
    picker: ResolvedPicker
    endpoints: tuple[Endpoint, ...]
    spill_to: ObjectKey | None = None
    """The pool its overflow goes to when it is full (``kvgate.io/spill-to``), if any."""
    spill_addresses: tuple[str, ...] = ()
    """The endpoints of every pool down its spill chain (its data-plane cluster reaches them too)."""
    model_server_tls: ModelServerTls | None = None
    """HTTPS to the pool's model servers (``kvgate.io/model-server-tls``), else plain HTTP."""
    backend_tls: BackendTls | None = None
    """HTTPS to the pool's model servers as a BackendTLSPolicy asks it (over ``model_server_tls``)."""
    http2: bool = False
    """The pool's ``appProtocol: kubernetes.io/h2c``: Envoy speaks HTTP/2 to its model servers."""

    @property
    def id(self) -> str:
        return str(self.key)

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(endpoint.address for endpoint in self.endpoints)


class BackendProtocol(StrEnum):
    """How Envoy speaks to a Service backend, from its port's ``appProtocol`` (GEP-1911)."""

    HTTP1 = "http/1.1"
    H2C = "h2c"
    """``kubernetes.io/h2c``: HTTP/2 with prior knowledge, in clear text."""
    WEBSOCKET = "websocket"
    """``kubernetes.io/ws`` (``/wss`` over TLS, a BackendTLSPolicy's): HTTP/1.1 with WebSocket upgrades."""


class BackendKind(StrEnum):
    INFERENCE_POOL = "InferencePool"
    SERVICE = "Service"
    INVALID = "Invalid"


@dataclass(frozen=True, slots=True)
class ResolvedBackend:
    """One backendRef. ``valid=False``: requests sent to it must get 500 (``reason`` says why).

    ``addresses`` are a Service's ``ip:port`` list (empty for a pool: see ``pool.endpoints``).
    ``filters`` are the backendRef's own filters.
    """

    kind: BackendKind
    key: ObjectKey
    weight: int
    valid: bool
    reason: str = ""
    port: int | None = None
    pool: ResolvedPool | None = None
    addresses: tuple[str, ...] = ()
    filters: tuple[HTTPRouteFilter, ...] = ()
    tls: BackendTls | None = None
    """A Service reached over TLS (a BackendTLSPolicy); a pool's is ``pool.backend_tls``."""
    protocol: BackendProtocol = BackendProtocol.HTTP1
    """A Service port's application protocol (its ``appProtocol``)."""


@dataclass(frozen=True, slots=True)
class ResolvedMirror:
    """A rule's RequestMirror: where the copies go (``backend.valid`` False: nowhere, the route's
    ResolvedRefs says why) and the share of requests copied, in millionths."""

    backend: ResolvedBackend
    millionths: int


@dataclass(frozen=True, slots=True)
class ResolvedExternalAuth:
    """A rule's ExternalAuth filter and its service (``backend.valid`` False: the rule answers 500,
    never letting a request through unchecked)."""

    config: HTTPExternalAuthFilter
    backend: ResolvedBackend


@dataclass(frozen=True, slots=True)
class ResolvedRule:
    index: int
    name: str | None
    matches: tuple[HTTPRouteMatch, ...]
    filters: tuple[HTTPRouteFilter, ...]
    timeouts: HTTPRouteTimeouts | None
    backends: tuple[ResolvedBackend, ...]
    ignored: tuple[str, ...] = ()
    """Fields of the rule kvgate does not apply; translation warns of them."""
    session_persistence: SessionPersistence | None = None
    """The rule's ``sessionPersistence`` (its pools' pickers keep the sessions: ``translate.sessions``)."""
    retry: HTTPRouteRetry | None = None
    """The rule's ``retry`` (GEP-1731; ``translate.retries`` says how it meets the picker's own)."""
    mirrors: tuple[ResolvedMirror, ...] = ()
    """The rule's RequestMirror filters, resolved (``translate.mirrors``)."""
    external_auth: ResolvedExternalAuth | None = None
    """The rule's ExternalAuth filter, resolved (``translate.external_auth``)."""

    @property
    def valid_backends(self) -> tuple[ResolvedBackend, ...]:
        return tuple(backend for backend in self.backends if backend.valid and backend.weight > 0)

    @property
    def redirect(self) -> RequestRedirect | None:
        """The rule's RequestRedirect: every request it matches is answered with a redirect."""
        return next((f.request_redirect for f in self.filters if f.request_redirect is not None), None)

    @property
    def answers_500(self) -> bool:
        """No redirect and no valid backend with a weight: every request this rule matches must get
        HTTP 500."""
        unchecked = self.external_auth is not None and not self.external_auth.backend.valid
        return self.redirect is None and (not self.valid_backends or unchecked)


@dataclass(frozen=True, slots=True)
class RouteAttachment:
    """The route accepted by one listener; ``hostnames`` are the intersection of both ("*": any)."""

    gateway: ObjectKey
    listener: str
    port: int
    hostnames: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ResolvedRoute:
    key: ObjectKey
    attachments: tuple[RouteAttachment, ...]
    rules: tuple[ResolvedRule, ...]
    creation_timestamp: str | None = None
    kind: str = "HTTPRoute"
    """``HTTPRoute``, or ``GRPCRoute`` (served as the HTTPRoute it amounts to)."""

    @property
    def name(self) -> str:
        """Unique among the routes of any kind (an HTTPRoute's is its key, as before GRPCRoutes)."""
        return str(self.key) if self.kind == "HTTPRoute" else f"{self.kind}:{self.key}"


@dataclass(frozen=True, slots=True)
class ResolvedObjective:
    key: ObjectKey
    pool: ObjectKey
    priority: int

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


@dataclass(frozen=True, slots=True)
class WeightedModel:
    model: str
    weight: int


@dataclass(frozen=True, slots=True)
class ModelRewriteRule:
    """``models`` empty: a generic rule that matches any model."""

    source: ObjectKey
    models: frozenset[str]
    targets: tuple[WeightedModel, ...]


@dataclass(frozen=True, slots=True)
class ModelRewriteTable:
    """Every rewrite rule for one pool, in GIE's precedence: exact matches first (oldest resource
    first, then list order), then generic rules in the same order."""

    pool: ObjectKey
    rules: tuple[ModelRewriteRule, ...]

    def lookup(self, model: str) -> tuple[WeightedModel, ...] | None:
        """The weighted targets for ``model``, or None when no rule matches."""
        for rule in self.rules:
            if not rule.models or model in rule.models:
                return rule.targets
        return None


def _empty_map() -> Mapping[ObjectKey, ModelRewriteTable]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ValidatedConfig:
    gateways: tuple[ResolvedGateway, ...] = ()
    routes: tuple[ResolvedRoute, ...] = ()
    pools: tuple[ResolvedPool, ...] = ()
    objectives: tuple[ResolvedObjective, ...] = ()
    rewrites: Mapping[ObjectKey, ModelRewriteTable] = field(default_factory=_empty_map)
    status: StatusReport = field(default_factory=StatusReport)
    notes: tuple[str, ...] = ()

    def pool(self, key: ObjectKey) -> ResolvedPool | None:
        return next((pool for pool in self.pools if pool.key == key), None)

    def certificates(self) -> Mapping[tuple[ObjectKey, str], ListenerCertificate]:
        """Each HTTPS listener's certificate by (Gateway, listener name): a later validation serves
        it while the listener's Secret cannot be read (``validate``'s ``last_good``)."""
        return {(gateway.key, listener.name): listener.certificate for gateway in self.gateways
                for listener in gateway.listeners if listener.certificate is not None}

    def objective(self, key: ObjectKey) -> ResolvedObjective | None:
        return next((objective for objective in self.objectives if objective.key == key), None)

    def routes_for(self, gateway: ObjectKey, listener: str) -> tuple[ResolvedRoute, ...]:
        return tuple(
            route
            for route in self.routes
            if any(a.gateway == gateway and a.listener == listener for a in route.attachments)
        )
