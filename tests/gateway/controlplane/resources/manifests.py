"""Manifest builders shared by the resources tests (plain YAML text, as users write it)."""

from __future__ import annotations

from kvgate.gateway.controlplane.resources import ResourceSet, ValidatedConfig, parse_manifests, validate

GATEWAY = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: kvgate
  listeners:
    - {name: http, port: 8080, protocol: HTTP}
"""


def pool(name: str, app: str | None = None, *, epp: str = "epp", ports: str = "[{number: 8000}]") -> str:
    return f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: {name}}}
spec:
  selector: {{matchLabels: {{app: {app or name}}}}}
  targetPorts: {ports}
  endpointPickerRef: {{name: {epp}, port: {{number: 9002}}, failureMode: FailOpen}}
"""


EPP_SERVICE = """
apiVersion: v1
kind: Service
metadata: {name: epp}
spec:
  ports: [{port: 9002}]
"""


def pod(name: str, app: str, ip: str, *, ready: bool = True, namespace: str = "default") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {namespace}, labels: {{app: {app}}}}}
status:
  phase: Running
  podIP: {ip}
  conditions: [{{type: Ready, status: "{"True" if ready else "False"}"}}]
"""


def route(
    name: str, rules: str, *, parents: str = "[{name: gw}]", extra: str = "", namespace: str = "default"
) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  parentRefs: {parents}
{extra}  rules:
{rules}
"""


def pool_ref(name: str, weight: int | None = None) -> str:
    weight_part = "" if weight is None else f", weight: {weight}"
    return f"{{group: inference.networking.k8s.io, kind: InferencePool, name: {name}{weight_part}}}"


def base() -> list[str]:
    """A Gateway, two pools (a: two ready pods, b: one) and the picker Service."""
    return [
        GATEWAY,
        EPP_SERVICE,
        pool("pool-a"),
        pool("pool-b"),
        pod("a-1", "pool-a", "10.0.0.1"),
        pod("a-2", "pool-a", "10.0.0.2"),
        pod("b-1", "pool-b", "10.0.1.1"),
    ]


def load(*documents: str) -> ResourceSet:
    return parse_manifests([("test.yaml", "\n---\n".join(documents))])


def build(*documents: str) -> ValidatedConfig:
    return validate(load(*documents))
