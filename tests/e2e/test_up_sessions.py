"""HTTPRoute ``sessionPersistence`` (GEP-1619) through ``kvgate up`` and real Envoy, on a pool of
two simulated replicas: a request naming no session is given one (a cookie, or a header for the
client to send again) and the session's next requests go back to the replica that served it."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions, bundled_example
from kvgate.simulator.server import REPLICA_HEADER
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e
GATEWAY = """
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
    - matches: [{path: {type: PathPrefix, value: /v1/chat/}}]
      sessionPersistence: {type: Header, sessionName: X-Chat-Id}
      backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: llama}]
    - matches: [{path: {type: PathPrefix, value: /v1/}}]
      sessionPersistence:
        sessionName: sticky
        absoluteTimeout: 1h
        cookieConfig: {lifetimeType: Permanent}
      backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: llama}]
"""


async def completion(http: aiohttp.ClientSession, url: str, headers: dict[str, str], index: int,
                     chat: bool = False) -> tuple[str, aiohttp.ClientResponse]:
    messages = [{"role": "user", "content": f"turn {index}"}]
    path, body = (("/v1/chat/completions", {"messages": messages}) if chat
                  else ("/v1/completions", {"prompt": f"turn {index}"}))
    payload = {"model": EXAMPLE_MODEL, "max_tokens": 2, "stream": True, **body}
    async with http.post(f"{url}{path}", json=payload, headers=headers) as response:
        await response.read()
        assert response.status == 200
        return response.headers[REPLICA_HEADER], response


async def test_a_session_goes_back_to_its_replica(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    config = tmp_path / "config"
    shutil.copytree(bundled_example(), config)
    (config / "gateway.yaml").write_text(GATEWAY)
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.131", sim_time_scale=0.01))
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        cookie_sessions = {}
        for client in range(4):  # each client's first request starts a session: a Permanent cookie
            replica, response = await completion(http, up.url, {}, client)
            set_cookie = response.headers.get("set-cookie", "")
            assert set_cookie.startswith("sticky="), set_cookie
            assert "Max-Age=3600" in set_cookie, set_cookie
            cookie_sessions[set_cookie.split(";")[0]] = replica
        assert len(cookie_sessions) == 4  # four sessions, four ids
        for cookie, replica in cookie_sessions.items():
            for turn in range(4):
                went, response = await completion(http, up.url, {"cookie": f"a=1; {cookie}"}, turn)
                assert went == replica, (cookie, turn)
                assert "set-cookie" not in response.headers  # a session the request names: nothing to tell

        went, response = await completion(http, up.url, {}, 0, chat=True)
        chat_id = response.headers["x-chat-id"]  # a header session: the client sends it again
        for turn in range(4):
            again, response = await completion(http, up.url, {"X-Chat-Id": chat_id}, turn + 1, chat=True)
            assert again == went
            assert "x-chat-id" not in response.headers
    finally:
        await up.stop()
