"""RequestMirror through ``kvgate up`` and real Envoy: the bundled example's route copies every
request to a shadow Service (a recorder here, answering 500 on purpose): clients are answered by the
pool alone, the shadow receives each request as the picker forwarded it, and a mirror whose
Service does not exist leaves the route serving with ResolvedRefs False."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions, bundled_example
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e
ROUTE = """
      filters:
        - type: RequestMirror
          requestMirror: {backendRef: {name: shadow, port: 80}}
        - type: RequestMirror
          requestMirror: {backendRef: {name: no-such-shadow, port: 80}}
      backendRefs:"""


@pytest.fixture
async def shadow() -> AsyncIterator[tuple[list[dict[str, object]], int]]:
    received: list[dict[str, object]] = []

    async def record(request: web.Request) -> web.Response:
        received.append({"path": request.path, "body": json.loads(await request.read())})
        return web.json_response({"error": "the shadow's answers go nowhere"}, status=500)

    app = web.Application()
    app.router.add_post("/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield received, port
    await runner.cleanup()


async def test_a_mirror_copies_requests_to_a_shadow_whose_answers_go_nowhere(
    tmp_path: Path, http: aiohttp.ClientSession, shadow: tuple[list[dict[str, object]], int]
) -> None:
    received, port = shadow
    config = tmp_path / "config"
    shutil.copytree(bundled_example(), config)
    gateway = config / "gateway.yaml"
    gateway.write_text(gateway.read_text().replace("\n      backendRefs:", ROUTE, 1))
    (config / "shadow.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: shadow\n  namespace: default\n"
        f"  annotations: {{kvgate.io/endpoints: \"127.0.0.1:{port}\"}}\nspec:\n  ports: [{{port: 80}}]\n")
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.121", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        for index in range(10):
            body = {"model": EXAMPLE_MODEL, "prompt": f"copy me {index}", "max_tokens": 2}
            async with http.post(f"{up.url}/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()  # the shadow's 500 never shows
        for _ in range(100):
            if len(received) >= 10:
                break
            await asyncio.sleep(0.02)
        assert len(received) == 10
        assert {copy["path"] for copy in received} == {"/v1/completions"}
        prompts = sorted(str(copy["body"]["prompt"]) for copy in received)  # type: ignore[index]
        assert prompts == [f"copy me {index}" for index in range(10)]
        async with http.get(f"{up.admin_url}/status") as response:
            status = json.dumps(await response.json())
        assert "no-such-shadow" in status  # ResolvedRefs False names the missing mirror
    finally:
        await up.stop()
