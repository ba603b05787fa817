"""BackendTLSPolicy through ``kvgate up`` and real Envoy, to simulated replicas serving HTTPS with a
certificate that names a host, not their IPs: a pool governed by a policy is served (Envoy verifies
the name; the picker scrapes and asks models naming it too), so is a Service; a policy naming
another host fails its requests (Envoy refuses the certificate) and a policy whose CA cannot be
read answers 500: neither reaches a replica, nothing goes in plain text."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.picker.tls import self_signed
from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json
from tests.e2e.test_up_routing import (
    StartUp,
    gateway_yaml,
    pods_yaml,
    pool_ref,
    sim_fleet,
    start_up,
    wait_ready,
)

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests

HOST = "vllm.models.svc"


def policy(name: str, kind: str, target: str, validation: str) -> str:
    group = "inference.networking.k8s.io" if kind == "InferencePool" else '""'
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {{name: {name}}}
spec:
  targetRefs: [{{group: {group}, kind: {kind}, name: {target}}}]
  validation: {validation}
"""


def service(name: str, address: str, port: int) -> str:
    return f"""
apiVersion: v1
kind: Service
metadata: {{name: {name}, annotations: {{kvgate.io/endpoints: "{address}"}}}}
spec:
  ports: [{{port: {port}}}]
"""


async def test_backend_tls_policies_for_a_pool_and_services(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    pair = self_signed((HOST,))
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    port = free_port()
    fleet = await sim_fleet(start_fleet, "127.0.6.21", port, "--model", "base",
                            "--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    config = tmp_path / "config"
    config.mkdir()
    ca = "".join(f"    {line}\n" for line in pair.cert_pem.decode().splitlines())
    by_ca = f"{{caCertificateRefs: [{{group: '', kind: ConfigMap, name: ca}}], hostname: {HOST}}}"
    first = fleet.addresses[0]
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "pods.yaml").write_text(pods_yaml("pool", fleet))
    (config / "resources.yaml").write_text("\n---\n".join([
        f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: pool}}
spec:
  selector: {{matchLabels: {{app: pool}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
""",
        f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca}}\ndata:\n  ca.crt: |\n{ca}",
        service("direct", first, port), service("wrong-name", first, port), service("broken", first, port),
        policy("pool-tls", "InferencePool", "pool", by_ca),
        policy("direct-tls", "Service", "direct", by_ca),
        policy("wrong-tls", "Service", "wrong-name", by_ca.replace(HOST, "other.example")),
        policy("broken-tls", "Service", "broken", by_ca.replace("name: ca", "name: missing")),
        f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches: [{{headers: [{{name: x-backend, value: direct}}]}}]
      backendRefs: [{{name: direct, port: {port}}}]
    - matches: [{{headers: [{{name: x-backend, value: wrong}}]}}]
      backendRefs: [{{name: wrong-name, port: {port}}}]
    - matches: [{{headers: [{{name: x-backend, value: broken}}]}}]
      backendRefs: [{{name: broken, port: {port}}}]
    - backendRefs: [{pool_ref("pool")}]
""",
    ]))
    up = await start_up(config)
    await wait_ready(http, up, ["pool"])  # (ready: the picker scraped the replicas, naming HOST)
    body = {"model": "base", "prompt": "hi", "max_tokens": 3}
    for sent in (body, {**body, "stream": True}):
        reply = await post_json(http, up.url, sent)
        assert reply.status == 200, reply.text
    async with http.get(f"{up.url}/v1/models") as response:  # (the replicas' own lists, over TLS)
        assert "base" in {model["id"] for model in (await response.json())["data"]}
    reply = await post_json(http, up.url, body, headers={"x-backend": "direct"})
    assert reply.status == 200, reply.text
    for backend, status in (("wrong", 503), ("broken", 500)):
        reply = await post_json(http, up.url, body, headers={"x-backend": backend})
        assert reply.status == status, reply.text
        assert json.loads(reply.text)["error"]["message"], reply.text
    assert sum(stats["requests_received"] for stats in await fleet_stats(http, fleet)) == 3
    async with http.get(f"{up.admin_url}/status") as response:
        status_doc = await response.json()
    accepted = {entry["name"]: {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}
                for entry in status_doc["resources"] if entry["kind"] == "BackendTLSPolicy"}
    assert accepted["pool-tls"]["Accepted"] == ("True", "Accepted")
    assert accepted["direct-tls"]["Accepted"] == ("True", "Accepted")
    assert accepted["broken-tls"]["Accepted"] == ("False", "NoValidCACertificate")
    assert accepted["broken-tls"]["ResolvedRefs"] == ("False", "InvalidCACertificateRef")
