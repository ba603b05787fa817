"""GRPCRoute (``gateway.networking.k8s.io/v1``, Standard since Gateway API v1.1): gRPC requests
routed by service, method and headers to Services, and how kvgate serves one: as the HTTPRoute it
amounts to (:meth:`GRPCRoute.as_http_route`), so that attachment, references, status and Envoy's
configuration are the HTTPRoute's own code, told the kind where the two differ (ReferenceGrants
and listeners name the kind; a GRPCRoute's Services are spoken to in HTTP/2; its rules take the
filters the GRPCRoute API defines).

A gRPC call is an HTTP/2 POST to ``/{service}/{method}``, so a method match is a path match:
service and method ``Exact`` → the path ``/{service}/{method}``; a service alone → the prefix
``/{service}`` (element-wise: ``/pkg.Svc`` does not match ``/pkg.SvcX/M``); a method alone, or
``RegularExpression`` (RE2, Envoy's dialect) → the regex ``/{service}/{method}`` with ``[^/]+`` for
the part not given; no method match → every path. Headers match as an HTTPRoute's do. The CRD's
CEL rules are checked at load, as ``kubectl apply`` would.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from kvgate.gateway.controlplane.resources.gateway_api import (
    HeaderMatch,
    HTTPBackendRef,
    HTTPRoute,
    HTTPRouteFilter,
    HTTPRouteMatch,
    ParentReference,
    PathMatch,
    SessionPersistence,
)
from kvgate.gateway.controlplane.resources.meta import Resource, SpecModel

GRPC_ROUTE = "GRPCRoute"
GRPC_FILTERS = frozenset({"RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror"})
"""The GRPCRoute API's filter types kvgate applies (ExtensionRef loads and is not Accepted)."""

_SERVICE = re.compile(r"^\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$", re.IGNORECASE)
_METHOD = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*$")


class GRPCMethodMatch(SpecModel):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    service: str | None = Field(default=None, max_length=1024)
    method: str | None = Field(default=None, max_length=1024)

    @model_validator(mode="after")
    def _cel(self) -> GRPCMethodMatch:
        if not self.service and not self.method:
            raise ValueError("One or both of 'service' or 'method' must be specified")
        if self.type == "Exact":
            if self.service and not _SERVICE.match(self.service):
                raise ValueError(f"service {self.service!r} must only contain valid characters "
                                 f"(matching {_SERVICE.pattern})")
            if self.method and not _METHOD.match(self.method):
                raise ValueError(f"method {self.method!r} must only contain valid characters "
                                 f"(matching {_METHOD.pattern})")
        return self

    def path(self) -> PathMatch:
        """The HTTP path match this method match amounts to (module docstring)."""
        service, method = self.service or None, self.method or None
        if self.type == "Exact":
            if service is not None and method is not None:
                return PathMatch(type="Exact", value=f"/{service}/{method}")
            if service is not None:
                return PathMatch(type="PathPrefix", value=f"/{service}")
            return PathMatch(type="RegularExpression", value=f"/[^/]+/{re.escape(method or '')}")
        return PathMatch(type="RegularExpression", value=f"/({service or '[^/]+'})/({method or '[^/]+'})")


class GRPCRouteMatch(SpecModel):
    method: GRPCMethodMatch | None = None
    headers: tuple[HeaderMatch, ...] = Field(default=(), max_length=16)

    def as_http(self) -> HTTPRouteMatch:
        path = self.method.path() if self.method is not None else PathMatch()
        return HTTPRouteMatch(path=path, headers=self.headers)


class GRPCRouteRule(SpecModel):
    name: str | None = None
    matches: tuple[GRPCRouteMatch, ...] = Field(default=(), max_length=64)
    filters: tuple[HTTPRouteFilter, ...] = Field(default=(), max_length=16)
    backend_refs: tuple[HTTPBackendRef, ...] = Field(default=(), max_length=16)
    """(A GRPCBackendRef has an HTTPBackendRef's fields; its filters are the GRPCRoute API's.)"""
    session_persistence: SessionPersistence | None = None

    @model_validator(mode="after")
    def _cel(self) -> GRPCRouteRule:
        for filters in (self.filters, *(ref.filters for ref in self.backend_refs)):
            for kind in ("RequestHeaderModifier", "ResponseHeaderModifier"):
                if sum(1 for flt in filters if flt.type == kind) > 1:
                    raise ValueError(f"{kind} filter cannot be repeated")
        return self


class GRPCRouteSpec(SpecModel):
    parent_refs: tuple[ParentReference, ...] = Field(default=(), max_length=32)
    hostnames: tuple[str, ...] = Field(default=(), max_length=16)
    rules: tuple[GRPCRouteRule, ...] = Field(default=(), max_length=16)

    @model_validator(mode="after")
    def _cel(self) -> GRPCRouteSpec:
        if sum(len(rule.matches) for rule in self.rules) > 128:
            raise ValueError("the total number of matches across all rules in a route must be less than 128")
        names = [rule.name for rule in self.rules if rule.name is not None]
        if len(set(names)) != len(names):
            raise ValueError("Rule name must be unique within the route")
        return self


class GRPCRoute(Resource):
    kind: Literal["GRPCRoute"]
    spec: GRPCRouteSpec

    def as_http_route(self) -> HTTPRoute:
        """This route as the HTTPRoute kvgate serves it by (``kind`` stays GRPCRoute: its status,
        ReferenceGrants and listeners' allowed kinds are a GRPCRoute's). Filters other than
        :data:`GRPC_FILTERS` are kept, and refused where an HTTPRoute's unsupported ones are."""
        rules = [
            {
                "name": rule.name,
                "matches": [match.as_http() for match in rule.matches] or [HTTPRouteMatch()],
                "filters": list(rule.filters),
                "backendRefs": list(rule.backend_refs),
                "sessionPersistence": rule.session_persistence,
            }
            for rule in self.spec.rules
        ]
        return HTTPRoute.model_validate({
            "apiVersion": self.api_version, "kind": GRPC_ROUTE, "metadata": self.metadata,
            "spec": {"parentRefs": list(self.spec.parent_refs), "hostnames": list(self.spec.hostnames),
                     "rules": rules},
        })
