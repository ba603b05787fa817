"""An HTTPRoute CORS filter through ``kvgate up`` and real Envoy: a browser's preflight from an
allowed origin is answered by the gateway (the replicas never see it) and the API's answers carry
the headers that let that origin read them."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions, bundled_example
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e
CORS = """
      filters:
        - type: CORS
          cors:
            allowOrigins: ["https://chat.example.com", "https://*.example.org"]
            allowMethods: [GET, POST]
            allowHeaders: [content-type, authorization]
            allowCredentials: true
            maxAge: 600
      backendRefs:"""


async def test_the_gateway_answers_allowed_origins_preflights(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    config = tmp_path / "config"
    shutil.copytree(bundled_example(), config)
    gateway = config / "gateway.yaml"
    gateway.write_text(gateway.read_text().replace("\n      backendRefs:", CORS, 1))
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.141", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        for origin in ("https://chat.example.com", "https://eu.example.org"):
            preflight = {"origin": origin, "access-control-request-method": "POST",
                         "access-control-request-headers": "content-type"}
            async with http.options(f"{up.url}/v1/completions", headers=preflight) as response:
                assert response.status == 200, await response.text()
                assert response.headers["access-control-allow-origin"] == origin
                assert response.headers["access-control-allow-methods"] == "GET, POST"
                assert response.headers["access-control-allow-credentials"] == "true"
                assert response.headers["access-control-max-age"] == "600"
                assert "x-envoy-upstream-service-time" not in response.headers  # no replica asked
        body = {"model": EXAMPLE_MODEL, "prompt": "from a web page", "max_tokens": 2}
        async with http.post(f"{up.url}/v1/completions", json=body,
                             headers={"origin": "https://chat.example.com"}) as response:
            assert response.status == 200
            assert response.headers["access-control-allow-origin"] == "https://chat.example.com"
    finally:
        await up.stop()


MODEL_ROUTES = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: kvgate, namespace: default}
spec:
  gatewayClassName: kvgate
  listeners: [{name: http, protocol: HTTP, port: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: llm, namespace: default}
spec:
  parentRefs: [{name: kvgate}]
  rules:
    - matches:
        - path: {type: PathPrefix, value: /v1/}
          headers: [{name: x-gateway-model-name, value: MODEL}]
      filters:
        - type: CORS
          cors: {allowOrigins: ["https://chat.example.com"], allowMethods: [POST]}
      backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: llama}]
    - matches: [{path: {type: PathPrefix, value: /v1/}}]
      backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: llama}]
""".replace("MODEL", EXAMPLE_MODEL)


async def test_a_model_routed_rules_policy_is_the_one_applied(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The body-based router re-matches on the model after the headers came: the CORS policy of the
    rule the model routes to applies, not the first match's (none here)."""
    config = tmp_path / "config"
    shutil.copytree(bundled_example(), config)
    (config / "gateway.yaml").write_text(MODEL_ROUTES)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.181", sim_time_scale=0.01))
    origin = {"origin": "https://chat.example.com"}
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        body = {"model": EXAMPLE_MODEL, "prompt": "from a web page", "max_tokens": 2}
        async with http.post(f"{up.url}/v1/completions", json=body, headers=origin) as response:
            assert response.status == 200
            assert response.headers.get("access-control-allow-origin") == "https://chat.example.com"
    finally:
        await up.stop()
