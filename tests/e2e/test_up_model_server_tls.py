"""Model servers that serve HTTPS (vLLM's ``--ssl-certfile``), through ``kvgate up`` and real Envoy:
the pool's ``kvgate.io/model-server-tls`` (or its CA file) makes Envoy originate TLS to them and the
picker scrape their metrics and ask their models over it; a CA file that cannot be read is the
pool's ResolvedRefs False, nothing sent in plain text."""

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


def pool_yaml(name: str, port: int, annotations: str) -> str:
    return f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: {name}, annotations: {{{annotations}}}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
"""


@pytest.mark.parametrize("verified", [False, True])
async def test_a_pool_of_https_model_servers_is_served_over_tls(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession, verified: bool,
) -> None:
    pair = self_signed(("localhost",))
    (tmp_path / "certs").mkdir()
    cert, key = tmp_path / "certs" / "tls.crt", tmp_path / "certs" / "tls.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    port = free_port()
    first_ip = "127.0.6.1" if verified else "127.0.6.11"
    fleet = await sim_fleet(start_fleet, first_ip, port, "--model", "base",
                            "--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    assert all(url.startswith("https://") for url in fleet.urls)
    config = tmp_path / "config"
    config.mkdir()
    annotation = (f'"kvgate.io/model-server-ca-file": "{cert}"' if verified  # self-signed: its own CA
                  else '"kvgate.io/model-server-tls": "true"')
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "pool.yaml").write_text(pool_yaml("pool", port, annotation) + "---" + pool_yaml(
        "broken", port + 1, '"kvgate.io/model-server-ca-file": "/nonexistent/ca.pem"'))
    (config / "pods.yaml").write_text(pods_yaml("pool", fleet))
    (config / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches: [{{path: {{type: PathPrefix, value: /broken}}}}]
      backendRefs: [{pool_ref("broken")}]
    - backendRefs: [{pool_ref("pool")}]
""")
    up = await start_up(config)
    await wait_ready(http, up, ["pool"])  # (ready: the picker scraped the replicas over TLS)
    for body in ({"model": "base", "prompt": "hi", "max_tokens": 3},
                 {"model": "base", "prompt": "hi", "max_tokens": 3, "stream": True}):
        reply = await post_json(http, up.url, body)
        assert reply.status == 200, reply.text
    assert sum(stats["requests_received"] for stats in await fleet_stats(http, fleet)) == 2
    async with http.get(f"{up.url}/v1/models") as response:  # (the replicas' own lists, over TLS)
        assert "base" in {model["id"] for model in (await response.json())["data"]}
    async with http.get(f"{up.admin_url}/status") as response:
        status = await response.json()
    [broken] = [e for e in status["resources"] if e["kind"] == "InferencePool" and e["name"] == "broken"]
    refs = {c["type"]: c for c in broken["conditions"]}["ResolvedRefs"]
    assert refs["status"] == "False"
    assert "not a readable PEM certificate file" in refs["message"], refs
    reply = await post_json(http, up.url, {"model": "base", "prompt": "hi"}, path="/broken/v1/completions")
    assert reply.status == 500
    assert json.loads(reply.text)["error"]["code"] == "no_valid_backend"
