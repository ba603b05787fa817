"""Gateway API manifests (``gateway.networking.k8s.io``): Gateway, HTTPRoute, ReferenceGrant.

Only what kvgate acts on is typed; fields a real manifest may carry that kvgate does not act on
(addresses, session persistence…) are accepted and ignored so that ordinary
manifests load. Rules the Gateway API's CRDs check at admission (CEL) are checked here too, so
a manifest ``kubectl apply`` would refuse is refused at load time.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from kvgate.gateway.controlplane.resources.meta import (
    AnyValue,
    Duration,
    PortNumber,
    Resource,
    SpecModel,
    parse_duration,
)

GATEWAY_GROUP = "gateway.networking.k8s.io"
INFERENCE_GROUP = "inference.networking.k8s.io"
CORE_GROUP = ""

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
_PRECISE_HOSTNAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""The Gateway API's ``PreciseHostname`` (a filter's hostname: no wildcard, nothing else)."""


# --------------------------------------------------------------------------- Gateway


class RouteNamespaces(SpecModel):
    from_: Literal["All", "Same", "Selector"] = Field(default="Same", alias="from")
    selector: AnyValue | None = None


class RouteGroupKind(SpecModel):
    group: str = GATEWAY_GROUP
    kind: str


class AllowedRoutes(SpecModel):
    namespaces: RouteNamespaces = RouteNamespaces()
    kinds: tuple[RouteGroupKind, ...] = ()


class SecretObjectReference(SpecModel):
    group: str = CORE_GROUP
    kind: str = "Secret"
    name: str = Field(min_length=1, max_length=253)
    namespace: str | None = None


class ListenerTLS(SpecModel):
    """GatewayTLSConfig: kvgate terminates TLS (``Terminate``) with the first certificate it can
    read; ``Passthrough`` belongs to TLS listeners, which kvgate does not serve."""

    mode: Literal["Terminate", "Passthrough"] = "Terminate"
    certificate_refs: tuple[SecretObjectReference, ...] = Field(default=(), max_length=64)
    options: AnyValue | None = None


class Listener(SpecModel):
    name: str = Field(min_length=1, max_length=253)
    port: PortNumber
    protocol: str = Field(min_length=1)
    hostname: str | None = None
    allowed_routes: AllowedRoutes = AllowedRoutes()
    tls: ListenerTLS | None = None


class GatewaySpec(SpecModel):
    gateway_class_name: str = Field(min_length=1)
    listeners: tuple[Listener, ...] = Field(min_length=1, max_length=64)
    addresses: AnyValue | None = None
    infrastructure: AnyValue | None = None

    @field_validator("listeners")
    @classmethod
    def _unique_names(cls, listeners: tuple[Listener, ...]) -> tuple[Listener, ...]:
        names = [listener.name for listener in listeners]
        if len(set(names)) != len(names):
            raise ValueError("listener names must be unique within a Gateway")
        return listeners


class Gateway(Resource):
    kind: Literal["Gateway"]
    spec: GatewaySpec


# --------------------------------------------------------------------------- HTTPRoute


class ParentReference(SpecModel):
    group: str = GATEWAY_GROUP
    kind: str = "Gateway"
    namespace: str | None = None
    name: str = Field(min_length=1)
    section_name: str | None = None
    port: PortNumber | None = None


class PathMatch(SpecModel):
    type: Literal["Exact", "PathPrefix", "RegularExpression"] = "PathPrefix"
    value: str = "/"

    @model_validator(mode="after")
    def _absolute(self) -> PathMatch:
        if self.type != "RegularExpression" and not self.value.startswith("/"):
            raise ValueError(f"path {self.value!r} must start with '/'")
        return self


class HeaderMatch(SpecModel):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    name: str = Field(min_length=1, max_length=256, pattern=_HEADER_NAME.pattern)
    value: str = Field(max_length=4096)


class QueryParamMatch(SpecModel):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    name: str = Field(min_length=1, max_length=256)
    value: str = Field(max_length=1024)


HttpMethod = Literal["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]


class HTTPRouteMatch(SpecModel):
    path: PathMatch = PathMatch()
    headers: tuple[HeaderMatch, ...] = ()
    query_params: tuple[QueryParamMatch, ...] = ()
    method: HttpMethod | None = None


class HTTPHeader(SpecModel):
    name: str = Field(min_length=1, max_length=256, pattern=_HEADER_NAME.pattern)
    value: str = Field(max_length=4096)


class HeaderModifier(SpecModel):
    set: tuple[HTTPHeader, ...] = ()
    add: tuple[HTTPHeader, ...] = ()
    remove: tuple[str, ...] = ()


class PathModifier(SpecModel):
    type: Literal["ReplaceFullPath", "ReplacePrefixMatch"]
    replace_full_path: str | None = None
    replace_prefix_match: str | None = None

    @model_validator(mode="after")
    def _one_value(self) -> PathModifier:
        if self.type == "ReplaceFullPath" and self.replace_full_path is None:
            raise ValueError("replaceFullPath must be set when type is ReplaceFullPath")
        if self.type == "ReplacePrefixMatch" and self.replace_prefix_match is None:
            raise ValueError("replacePrefixMatch must be set when type is ReplacePrefixMatch")
        return self


class URLRewrite(SpecModel):
    hostname: str | None = Field(default=None, min_length=1, max_length=253, pattern=_PRECISE_HOSTNAME)
    path: PathModifier | None = None


class RequestRedirect(SpecModel):
    """HTTPRequestRedirectFilter: the response is a redirect, the request reaches no backend."""

    scheme: Literal["http", "https"] | None = None
    hostname: str | None = Field(default=None, min_length=1, max_length=253, pattern=_PRECISE_HOSTNAME)
    path: PathModifier | None = None
    port: PortNumber | None = None
    status_code: Literal[301, 302, 303, 307, 308] = 302
    """301 and 302 are Core, the others Extended (Gateway API v1.6)."""


SUPPORTED_FILTERS = frozenset({
    "RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite", "RequestMirror",
    "CORS", "ExternalAuth",
})
"""Filter types a rule may carry (a route with another is not Accepted)."""
SUPPORTED_BACKEND_FILTERS = frozenset({"RequestHeaderModifier", "ResponseHeaderModifier", "URLRewrite"})
"""Filter types a backendRef may carry (a redirect names no backend: it belongs on the rule)."""
_ONCE_PER_RULE = (
    "RequestHeaderModifier", "ResponseHeaderModifier", "RequestRedirect", "URLRewrite", "CORS",
    "ExternalAuth",
)


class Fraction(SpecModel):
    numerator: int = Field(ge=0)
    denominator: int = Field(default=100, ge=1)

    @model_validator(mode="after")
    def _at_most_one(self) -> Fraction:
        if self.numerator > self.denominator:
            raise ValueError("numerator must be less than or equal to denominator")
        return self


class BackendObjectReference(SpecModel):
    """A backend named without a weight or filters (a RequestMirror's)."""

    group: str = CORE_GROUP
    kind: str = "Service"
    name: str = Field(min_length=1)
    namespace: str | None = None
    port: PortNumber | None = None


MILLION = 1_000_000


class RequestMirror(SpecModel):
    """Copies of the requests to ``backend_ref`` (their answers are dropped): all, or ``percent`` /
    ``fraction`` of them."""

    backend_ref: BackendObjectReference
    percent: int | None = Field(default=None, ge=0, le=100)
    fraction: Fraction | None = None

    @model_validator(mode="after")
    def _one_share(self) -> RequestMirror:
        if self.percent is not None and self.fraction is not None:
            raise ValueError("only one of percent or fraction may be specified in requestMirror")
        return self

    @property
    def millionths(self) -> int:
        """The share of requests mirrored, in millionths (Envoy's finest denominator)."""
        if self.percent is not None:
            return self.percent * MILLION // 100
        if self.fraction is not None:
            return self.fraction.numerator * MILLION // self.fraction.denominator
        return MILLION


class HTTPCORSFilter(SpecModel):
    """A rule's CORS policy (the Gateway API's HTTPCORSFilter): the gateway answers browsers'
    preflight requests and adds the response headers that let the origins read the answers."""

    allow_origins: tuple[str, ...] = Field(default=(), max_length=64)
    allow_credentials: bool | None = None
    allow_methods: tuple[str, ...] = Field(default=(), max_length=9)
    allow_headers: tuple[str, ...] = Field(default=(), max_length=64)
    expose_headers: tuple[str, ...] = Field(default=(), max_length=64)
    max_age: int = Field(default=5, ge=1)

    @field_validator("allow_origins")
    @classmethod
    def _origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        for origin in origins:
            if origin != "*" and not re.match(r"^(https?)://[^/?#\s]+$", origin):
                raise ValueError(f"allowOrigins entry {origin!r} is not \"*\" or scheme://host[:port]")
        return origins


class GRPCAuthConfig(SpecModel):
    allowed_headers: tuple[str, ...] = Field(default=(), max_length=64)


class HTTPAuthConfig(SpecModel):
    path: str | None = None
    allowed_headers: tuple[str, ...] = Field(default=(), max_length=64)
    allowed_response_headers: tuple[str, ...] = Field(default=(), max_length=64)


class ForwardBody(SpecModel):
    max_size: int = Field(default=0, ge=0)


class HTTPExternalAuthFilter(SpecModel):
    """A rule's external authorization (the Gateway API's HTTPExternalAuthFilter): each request is
    checked with a service speaking Envoy's ext_authz protocol (gRPC) or plain HTTP first."""

    protocol: Literal["HTTP", "GRPC"]
    backend_ref: BackendObjectReference
    grpc: GRPCAuthConfig | None = None
    http: HTTPAuthConfig | None = None
    forward_body: ForwardBody | None = None


class HTTPRouteFilter(SpecModel):
    """One filter. Types other than ``SUPPORTED_FILTERS`` load, and make the route not Accepted."""

    type: Literal[
        "RequestHeaderModifier",
        "ResponseHeaderModifier",
        "RequestMirror",
        "RequestRedirect",
        "URLRewrite",
        "ExtensionRef",
        "CORS",
        "ExternalAuth",
    ]
    request_header_modifier: HeaderModifier | None = None
    url_rewrite: URLRewrite | None = Field(default=None, alias="urlRewrite")
    response_header_modifier: HeaderModifier | None = None
    request_mirror: RequestMirror | None = None
    request_redirect: RequestRedirect | None = None
    extension_ref: AnyValue | None = None
    cors: HTTPCORSFilter | None = None
    external_auth: HTTPExternalAuthFilter | None = None

    @model_validator(mode="after")
    def _config_present(self) -> HTTPRouteFilter:
        if self.type == "RequestHeaderModifier" and self.request_header_modifier is None:
            raise ValueError("filter RequestHeaderModifier needs requestHeaderModifier")
        if self.type == "URLRewrite" and self.url_rewrite is None:
            raise ValueError("filter URLRewrite needs urlRewrite")
        if self.type == "ResponseHeaderModifier" and self.response_header_modifier is None:
            raise ValueError("filter ResponseHeaderModifier needs responseHeaderModifier")
        if self.type == "RequestRedirect" and self.request_redirect is None:
            raise ValueError("filter RequestRedirect needs requestRedirect")
        if self.type == "RequestMirror" and self.request_mirror is None:
            raise ValueError("filter RequestMirror needs requestMirror")
        if self.type == "CORS" and self.cors is None:
            raise ValueError("filter CORS needs cors")
        if self.type == "ExternalAuth" and self.external_auth is None:
            raise ValueError("filter ExternalAuth needs externalAuth")
        return self

    @property
    def path_modifier(self) -> PathModifier | None:
        """The path a URLRewrite or a RequestRedirect of this filter replaces, if any."""
        if self.url_rewrite is not None:
            return self.url_rewrite.path
        return self.request_redirect.path if self.request_redirect is not None else None


class HTTPRouteTimeouts(SpecModel):
    request: Duration | None = None
    backend_request: Duration | None = None

    @model_validator(mode="after")
    def _backend_within_request(self) -> HTTPRouteTimeouts:
        if self.request is None or self.backend_request is None:
            return self
        request, backend = parse_duration(self.request), parse_duration(self.backend_request)
        if request != 0 and backend > request:
            raise ValueError("backendRequest timeout must not be longer than the request timeout")
        return self

    @property
    def request_seconds(self) -> float | None:
        """None when unset; 0 means no timeout, as the Gateway API says."""
        return None if self.request is None else parse_duration(self.request)

    @property
    def backend_request_seconds(self) -> float | None:
        return None if self.backend_request is None else parse_duration(self.backend_request)


class HTTPRouteRetry(SpecModel):
    """GEP-1731: retry a backend request on these status ``codes`` (400-599), at most ``attempts``
    times (0: never), ``backoff`` apart at least."""

    codes: tuple[Annotated[int, Field(ge=400, le=599)], ...] = ()
    attempts: int | None = Field(default=None, ge=0)
    backoff: Duration | None = None

    @property
    def backoff_seconds(self) -> float | None:
        return None if self.backoff is None else parse_duration(self.backoff)


class CookieConfig(SpecModel):
    lifetime_type: Literal["Permanent", "Session"] = "Session"


class SessionPersistence(SpecModel):
    """GEP-1619: requests that name the same session (a cookie, or a header) go to the same backend."""

    session_name: str | None = Field(default=None, max_length=128)
    absolute_timeout: Duration | None = None
    idle_timeout: Duration | None = None
    type: Literal["Cookie", "Header"] = "Cookie"
    cookie_config: CookieConfig | None = None

    @model_validator(mode="after")
    def _permanent_needs_timeout(self) -> SessionPersistence:
        permanent = self.cookie_config is not None and self.cookie_config.lifetime_type == "Permanent"
        if permanent and self.absolute_timeout is None:
            raise ValueError("AbsoluteTimeout must be specified when cookie lifetimeType is Permanent")
        return self

    @property
    def absolute_seconds(self) -> float | None:
        return None if self.absolute_timeout is None else parse_duration(self.absolute_timeout)


class HTTPBackendRef(SpecModel):
    """A Service (``port`` required) or an InferencePool (``group: inference.networking.k8s.io``)."""

    group: str = CORE_GROUP
    kind: str = "Service"
    name: str = Field(min_length=1)
    namespace: str | None = None
    port: PortNumber | None = None
    weight: int = Field(default=1, ge=0, le=1_000_000)
    filters: tuple[HTTPRouteFilter, ...] = ()


class HTTPRouteRule(SpecModel):
    name: str | None = None
    matches: tuple[HTTPRouteMatch, ...] = (HTTPRouteMatch(),)
    filters: tuple[HTTPRouteFilter, ...] = ()
    backend_refs: tuple[HTTPBackendRef, ...] = ()
    timeouts: HTTPRouteTimeouts | None = None
    retry: HTTPRouteRetry | None = None
    session_persistence: SessionPersistence | None = None

    @model_validator(mode="after")
    def _prefix_rewrite_needs_prefix_match(self) -> HTTPRouteRule:
        for flt in self.filters:
            path = flt.path_modifier
            prefix_rewrite = path is not None and path.type == "ReplacePrefixMatch"
            if prefix_rewrite and any(match.path.type != "PathPrefix" for match in self.matches):
                raise ValueError("ReplacePrefixMatch needs every match of the rule to be a PathPrefix")
        kinds = [flt.type for flt in self.filters if flt.type in _ONCE_PER_RULE]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"{', '.join(_ONCE_PER_RULE)} may each appear once per rule")
        if "RequestRedirect" in kinds and "URLRewrite" in kinds:
            raise ValueError("a rule may have a RequestRedirect or a URLRewrite filter, not both")
        return self


class HTTPRouteSpec(SpecModel):
    parent_refs: tuple[ParentReference, ...] = Field(default=(), max_length=32)
    hostnames: tuple[str, ...] = Field(default=(), max_length=16)
    rules: tuple[HTTPRouteRule, ...] = Field(default=(HTTPRouteRule(),), max_length=16)


class HTTPRoute(Resource):
    kind: Literal["HTTPRoute", "GRPCRoute"]
    """``GRPCRoute``: a GRPCRoute as the HTTPRoute kvgate serves it by (``resources.grpc_route``; a
    manifest of that kind loads as a GRPCRoute)."""
    spec: HTTPRouteSpec


# --------------------------------------------------------------------------- ReferenceGrant


class ReferenceGrantFrom(SpecModel):
    group: str
    kind: str
    namespace: str


class ReferenceGrantTo(SpecModel):
    group: str
    kind: str
    name: str | None = None


class ReferenceGrantSpec(SpecModel):
    from_: tuple[ReferenceGrantFrom, ...] = Field(alias="from", min_length=1)
    to: tuple[ReferenceGrantTo, ...] = Field(min_length=1)


class ReferenceGrant(Resource):
    kind: Literal["ReferenceGrant"]
    spec: ReferenceGrantSpec
