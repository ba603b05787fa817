"""HTTPRoute filters through ``kvgate up`` and real Envoy: RequestRedirect (Core: the Location Envoy
writes, per the Gateway API's port rules), ResponseHeaderModifier on a rule and on a backendRef, and
URLRewrite with RequestHeaderModifier in front of a pool (the picker sees the client's path)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import post_json
from tests.e2e.test_up_routing import (
    StartUp,
    gateway_yaml,
    pods_yaml,
    pool_ref,
    pool_yaml,
    sim_fleet,
    start_up,
    wait_ready,
)

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests


async def test_redirects_and_response_headers(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    fleet = await sim_fleet(start_fleet, "127.0.4.1", port, "--model", "base")
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pool.yaml").write_text(pool_yaml("pool", port))
    (tmp_path / "pods.yaml").write_text(pods_yaml("pool", fleet))
    (tmp_path / "routes.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: filters}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches: [{{path: {{type: PathPrefix, value: /v0}}}}]
      filters:
        - type: RequestRedirect
          requestRedirect: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /v1}}, statusCode: 301}}
    - matches: [{{path: {{type: Exact, value: /docs}}}}]
      filters:
        - type: RequestRedirect
          requestRedirect: {{scheme: https, hostname: docs.example.com,
                            path: {{type: ReplaceFullPath, replaceFullPath: /llm}}}}
        - type: ResponseHeaderModifier
          responseHeaderModifier: {{set: [{{name: Cache-Control, value: no-store}}]}}
    - matches: [{{path: {{type: PathPrefix, value: /legacy}}}}]
      filters:
        - type: RequestRedirect
          requestRedirect: {{hostname: new.example.com, port: 8443, statusCode: 308}}
    - matches: [{{path: {{type: PathPrefix, value: /api}}}}]
      filters:
        - type: URLRewrite
          urlRewrite: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /}}}}
        - type: RequestHeaderModifier
          requestHeaderModifier: {{set: [{{name: X-Tenant, value: acme}}]}}
      backendRefs: [{pool_ref("pool")}]
    - matches: [{{path: {{type: PathPrefix, value: /v1}}}}]
      filters:
        - type: ResponseHeaderModifier
          responseHeaderModifier:
            set: [{{name: X-Served-By, value: kvgate}}]
            add: [{{name: Vary, value: Authorization}}]
      backendRefs:
        - group: inference.networking.k8s.io
          kind: InferencePool
          name: pool
          filters:
            - type: ResponseHeaderModifier
              responseHeaderModifier: {{add: [{{name: X-Pool, value: pool}}]}}
""")
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool"])
    async with http.get(f"{up.admin_url}/status") as response:
        status = await response.json()
    [route] = [e for e in status["resources"] if e["kind"] == "HTTPRoute" and e["name"] == "filters"]
    assert {c["type"]: c["status"] for c in route["conditions"]}["Accepted"] == "True", route
    host = up.url.removeprefix("http://")

    async def redirect(path: str, method: str = "GET") -> tuple[int, str, aiohttp.typedefs.LooseHeaders]:
        async with http.request(method, up.url + path, allow_redirects=False) as reply:
            await reply.read()
            return reply.status, reply.headers.get("location", ""), reply.headers

    # the path's prefix replaced; host and port as the client named them; the query kept
    assert (await redirect("/v0/completions?x=1"))[:2] == (301, f"http://{host}/v1/completions?x=1")
    # the scheme changed and no port: its well-known port, left out of the Location
    status_code, location, headers = await redirect("/docs", "POST")
    assert (status_code, location) == (302, "https://docs.example.com/llm")
    assert headers["cache-control"] == "no-store"  # type: ignore[index]
    assert (await redirect("/legacy/a/b"))[:2] == (308, "http://new.example.com:8443/legacy/a/b")

    # the picker routes a request whose path the route rewrites (it reads the body's API by the
    # client's path or the rewritten one) and the replica sees the rewritten path and header
    reply = await post_json(http, up.url, {"model": "base", "prompt": "hi", "max_tokens": 2},
                            path="/api/v1/completions")
    assert reply.status == 200, reply.text
    assert json.loads(reply.text)["usage"]["completion_tokens"] == 2
    reply = await post_json(http, up.url, {"model": "base", "prompt": "hi", "max_tokens": 2})
    assert reply.status == 200, reply.text
    assert reply.headers["x-served-by"] == "kvgate"
    assert reply.headers["vary"] == "Authorization"
    assert reply.headers["x-pool"] == "pool"
