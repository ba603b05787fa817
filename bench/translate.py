"""Benchmark: validate and translate 1,000 HTTPRoutes (not a test; results in bench/results/translate.md).

``python -m kvgate.bench.translate [--routes 1000] [--runs 7]``. Each route has three rules (a model-header
match, a canary header match with a 90/10 split, a path prefix), across eight InferencePools with
four pods each and a few hostnames. Times are medians over ``--runs``; parsing YAML is reported apart.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

from kvgate.gateway.controlplane.resources import ResourceSet, ValidatedConfig, parse_manifests, validate
from kvgate.gateway.controlplane.translate import EnvoyResources, TranslationSettings, translate

T = TypeVar("T")
POOLS = 8
HOSTS = ("*", "a.example.com", "b.example.com", "*.example.org")


def manifests(routes: int) -> str:
    docs = [
        """apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec: {gatewayClassName: kvgate, listeners: [{name: http, port: 8080, protocol: HTTP}]}""",
        """apiVersion: v1
kind: Service
metadata: {name: epp, namespace: default}
spec: {ports: [{port: 9002}]}""",
    ]
    for p in range(POOLS):
        mode = "FailOpen" if p % 4 == 0 else "FailClose"
        docs.append(f"""apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: pool-{p}, namespace: default}}
spec:
  selector: {{matchLabels: {{app: pool-{p}}}}}
  targetPorts: [{{number: 8000}}]
  endpointPickerRef: {{name: epp, port: {{number: 9002}}, failureMode: {mode}}}""")
        for i in range(4):
            docs.append(f"""apiVersion: v1
kind: Pod
metadata: {{name: pool-{p}-{i}, namespace: default, labels: {{app: pool-{p}}}}}
status: {{phase: Running, podIP: 10.0.{p}.{i + 1}}}""")
    for r in range(routes):
        host = HOSTS[r % len(HOSTS)]
        hostnames = "" if host == "*" else f'  hostnames: ["{host}"]\n'
        a, b, c = (f"pool-{(r + k) % POOLS}" for k in range(3))
        ref = "group: inference.networking.k8s.io, kind: InferencePool"
        model = f"headers: [{{name: X-Gateway-Model-Name, value: model-{r}}}]"
        canary = 'headers: [{name: x-canary, value: "yes"}]'
        health = f"{{path: {{type: Exact, value: /t{r}/health}}, method: GET}}"
        docs.append(f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: route-{r:04d}, namespace: default}}
spec:
  parentRefs: [{{name: gw}}]
{hostnames}  rules:
    - matches: [{{path: {{type: PathPrefix, value: /t{r}}}, {model}}}]
      backendRefs: [{{{ref}, name: {a}}}]
    - matches: [{{path: {{type: PathPrefix, value: /t{r}}}, {canary}}}]
      backendRefs: [{{{ref}, name: {a}, weight: 90}}, {{{ref}, name: {b}, weight: 10}}]
    - matches: [{{path: {{type: PathPrefix, value: /t{r}/v1}}}}, {health}]
      timeouts: {{request: 60s}}
      backendRefs: [{{{ref}, name: {c}}}]""")
    return "\n---\n".join(docs) + "\n"


def timed(runs: int, work: Callable[[], T]) -> tuple[float, T]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--routes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    text = manifests(args.routes)
    settings = TranslationSettings(picker_addresses=("127.0.0.1:9002",))
    parse_s, resources = timed(args.runs, lambda: parse_manifests([("bench.yaml", text)]))
    assert isinstance(resources, ResourceSet)
    validate_s, config = timed(args.runs, lambda: validate(resources))
    assert isinstance(config, ValidatedConfig)
    assert len(config.routes) == args.routes
    translate_s, envoy = timed(args.runs, lambda: translate(config, settings))
    assert isinstance(envoy, EnvoyResources)
    snapshot_s, snapshot = timed(args.runs, envoy.snapshot)
    routes = sum(len(vh["routes"]) for rc in envoy.routes for vh in rc["virtual_hosts"])
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(
        f"{args.routes} HTTPRoutes, {POOLS} pools; {routes} Envoy routes in "
        f"{sum(len(rc['virtual_hosts']) for rc in envoy.routes)} virtual hosts, "
        f"{len(envoy.clusters)} clusters"
    )
    print(f"median of {args.runs} runs:")
    print(f"  parse YAML            {parse_s * 1000:8.1f} ms")
    print(f"  validate              {validate_s * 1000:8.1f} ms")
    print(f"  translate (dicts)     {translate_s * 1000:8.1f} ms")
    print(f"  snapshot (protobuf)   {snapshot_s * 1000:8.1f} ms")
    print(f"  validate + translate + snapshot {(validate_s + translate_s + snapshot_s) * 1000:8.1f} ms")
    print(f"snapshot version {snapshot.version}")


if __name__ == "__main__":
    main()
