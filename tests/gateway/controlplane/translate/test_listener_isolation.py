"""Listener isolation (the Gateway API's GatewayHTTPListenerIsolation): a request whose host matches
a more specific listener is served by that listener's routes alone, never by a wildcard
listener's on the same port (Envoy picks the most specific virtual host, and kvgate gives each
listener hostname its own)."""

from __future__ import annotations

from typing import Any

from kvgate.gateway.controlplane.resources import parse_manifests, validate
from kvgate.gateway.controlplane.translate import TranslationSettings, translate

MANIFESTS = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: kvgate
  listeners:
    - {name: wild, port: 8080, protocol: HTTP, hostname: "*.example.com"}
    - {name: foo, port: 8080, protocol: HTTP, hostname: "foo.example.com"}
---
apiVersion: v1
kind: Service
metadata: {name: a, annotations: {kvgate.io/endpoints: "10.0.0.1:80"}}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: b, annotations: {kvgate.io/endpoints: "10.0.0.2:80"}}
spec: {ports: [{port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ra}
spec:
  parentRefs: [{name: gw, sectionName: wild}]
  rules: [{backendRefs: [{name: a, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: rb}
spec:
  parentRefs: [{name: gw, sectionName: foo}]
  rules: [{matches: [{path: {type: PathPrefix, value: /b}}], backendRefs: [{name: b, port: 80}]}]
"""


def test_a_more_specific_listeners_host_is_served_by_its_own_routes_alone() -> None:
    config = validate(parse_manifests([("m.yaml", MANIFESTS)]))
    settings = TranslationSettings(picker_addresses=("127.0.0.1:9002",))
    routes: list[dict[str, Any]] = translate(config, settings).as_json()["routes"]
    hosts = {tuple(vh["domains"]): [r["name"] for r in vh["routes"]]
             for rc in routes for vh in rc["virtual_hosts"]}
    assert hosts[("foo.example.com",)] == ["default/rb/rule0/match0"]  # (/other on foo: 404, not ra)
    assert hosts[("*.example.com",)] == ["default/ra/rule0/match0"]
