"""HTTPRoute ``retry`` (GEP-1731) through ``kvgate up -f DIR`` and real Envoy, against a Service
backend that fails on purpose: a rule's retries reach a success the first try missed, its codes
(a 429) are retried as asked, ``attempts`` bounds the tries, and a rule without ``retry`` is tried
once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.test_up_routing import StartUp, gateway_yaml, start_up

__all__ = ["start_up"]
pytestmark = pytest.mark.e2e


class Flaky:
    """A backend answering each path's queued statuses in turn (then 200), counting its requests."""

    def __init__(self) -> None:
        self.queued: dict[str, list[int]] = {}
        self.hits: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        self.hits[path] = self.hits.get(path, 0) + 1
        queue = self.queued.get(path, [])
        status = queue.pop(0) if queue else 200
        return web.json_response({"path": path}, status=status)


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[Flaky, int]]:
    backend = Flaky()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", backend.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield backend, port
    await runner.cleanup()


def route_yaml(port: int) -> str:
    return f"""
apiVersion: v1
kind: Service
metadata:
  name: flaky
  annotations: {{kvgate.io/endpoints: "127.0.0.1:{port}"}}
spec:
  ports: [{{port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches: [{{path: {{type: PathPrefix, value: /retried}}}}]
      retry: {{attempts: 2, backoff: 10ms}}
      backendRefs: [{{name: flaky, port: 80}}]
    - matches: [{{path: {{type: PathPrefix, value: /limited}}}}]
      retry: {{codes: [429], attempts: 3, backoff: 10ms}}
      backendRefs: [{{name: flaky, port: 80}}]
    - matches: [{{path: {{type: PathPrefix, value: /once}}}}]
      backendRefs: [{{name: flaky, port: 80}}]
"""


async def test_a_rules_retry_reaches_the_answer_the_first_try_missed(
    tmp_path: Path, http: aiohttp.ClientSession, start_up: StartUp, flaky: tuple[Flaky, int]
) -> None:
    backend, port = flaky
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "route.yaml").write_text(route_yaml(port))
    up = await start_up(tmp_path)

    async def get(path: str) -> int:
        async with http.get(f"{up.url}{path}") as response:
            await response.read()
            return response.status

    backend.queued["/retried/a"] = [503, 502]
    assert await get("/retried/a") == 200  # two retries: the third try answered
    assert backend.hits["/retried/a"] == 3
    backend.queued["/retried/b"] = [503, 503, 503]
    assert await get("/retried/b") == 503  # attempts bound the tries
    assert backend.hits["/retried/b"] == 3
    backend.queued["/retried/c"] = [429]
    assert await get("/retried/c") == 429  # not one of the required codes: not retried
    assert backend.hits["/retried/c"] == 1

    backend.queued["/limited/a"] = [429, 429]
    assert await get("/limited/a") == 200  # the rule's codes
    assert backend.hits["/limited/a"] == 3

    backend.queued["/once/a"] = [503]
    assert await get("/once/a") == 503  # no retry asked: one try
    assert backend.hits["/once/a"] == 1
