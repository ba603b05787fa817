"""An HTTPRoute ExternalAuth filter through ``kvgate up`` and real Envoy, with an HTTP authorization
service (requests it allows are served, the others get its status in OpenAI's JSON shape, and when
it cannot be reached no request passes: 503) and with one speaking Envoy's ext_authz gRPC protocol
(which sees the body it asked for)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from envoy.service.auth.v3 import external_auth_pb2 as auth_pb
from envoy.service.auth.v3 import external_auth_pb2_grpc as auth_grpc
from envoy.type.v3 import http_status_pb2
from google.rpc import code_pb2, status_pb2

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions, bundled_example
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e
AUTH = """
      filters:
        - type: ExternalAuth
          externalAuth:
            protocol: HTTP
            backendRef: {name: auth, port: 80}
            http: {path: /check, allowedHeaders: [x-api-key]}
      backendRefs:"""


class Authorizer:
    def __init__(self) -> None:
        self.checked: list[str] = []

    async def check(self, request: web.Request) -> web.Response:
        self.checked.append(request.path)
        if request.headers.get("x-api-key") == "good":
            return web.Response(status=200)
        return web.Response(status=401, text="no such key")


@pytest.fixture
async def authorizer() -> AsyncIterator[tuple[Authorizer, int, web.AppRunner]]:
    auth = Authorizer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", auth.check)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield auth, port, runner
    await runner.cleanup()


async def test_only_requests_the_service_allows_are_served(
    tmp_path: Path, http: aiohttp.ClientSession, authorizer: tuple[Authorizer, int, web.AppRunner]
) -> None:
    auth, port, runner = authorizer
    config = tmp_path / "config"
    shutil.copytree(bundled_example(), config)
    gateway = config / "gateway.yaml"
    gateway.write_text(gateway.read_text().replace("\n      backendRefs:", AUTH, 1))
    (config / "auth.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: auth\n  namespace: default\n"
        f"  annotations: {{kvgate.io/endpoints: \"127.0.0.1:{port}\"}}\nspec:\n  ports: [{{port: 80}}]\n")
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.151", sim_time_scale=0.01))
    body = {"model": EXAMPLE_MODEL, "prompt": "who may ask", "max_tokens": 2}
    url = f"{up.url}/v1/completions"
    good = {"x-api-key": "good"}
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        async with http.post(url, json=body, headers=good) as response:
            assert response.status == 200, await response.text()
        assert auth.checked == ["/check/v1/completions"]
        for headers in ({}, {"x-api-key": "bad"}):
            async with http.post(url, json=body, headers=headers) as response:
                assert response.status == 401
                error = (await response.json())["error"]
                assert (error["type"], error["code"]) == ("invalid_request_error", "unauthorized")
        await runner.cleanup()  # the service goes away: nothing passes unchecked
        async with http.post(url, json=body, headers=good) as response:
            assert response.status == 503
            assert (await response.json())["error"]["code"] == "authorization_unavailable"
    finally:
        await up.stop()


class GrpcAuthorizer(auth_grpc.AuthorizationServicer):  # type: ignore[misc]
    """Envoy's ext_authz gRPC protocol: OK when the request carries ``x-api-key: good``."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def Check(self, request: auth_pb.CheckRequest, context: object) -> auth_pb.CheckResponse:
        http_request = request.attributes.request.http
        self.bodies.append(http_request.raw_body or http_request.body.encode())
        if http_request.headers.get("x-api-key") == "good":
            return auth_pb.CheckResponse(status=status_pb2.Status(code=code_pb2.OK))
        return auth_pb.CheckResponse(
            status=status_pb2.Status(code=code_pb2.PERMISSION_DENIED),
            denied_response=auth_pb.DeniedHttpResponse(status=http_status_pb2.HttpStatus(code=403)),
        )


async def test_a_grpc_authorization_service_sees_the_body_it_asked_for(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    authorizer = GrpcAuthorizer()
    server = grpc.aio.server()
    auth_grpc.add_AuthorizationServicer_to_server(authorizer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = tmp_path / "config"
    shutil.copytree(bundled_example(), config)
    gateway = config / "gateway.yaml"
    grpc_auth = AUTH.replace("protocol: HTTP", "protocol: GRPC").replace(
        "http: {path: /check, allowedHeaders: [x-api-key]}", "forwardBody: {maxSize: 4096}")
    gateway.write_text(gateway.read_text().replace("\n      backendRefs:", grpc_auth, 1))
    (config / "auth.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: auth\n  namespace: default\n"
        f"  annotations: {{kvgate.io/endpoints: \"127.0.0.1:{port}\"}}\nspec:\n  ports: [{{port: 80}}]\n")
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.161", sim_time_scale=0.01))
    body = {"model": EXAMPLE_MODEL, "prompt": "checked over gRPC", "max_tokens": 2}
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        url = f"{up.url}/v1/completions"
        async with http.post(url, json=body, headers={"x-api-key": "good"}) as response:
            assert response.status == 200, await response.text()
        assert b"checked over gRPC" in authorizer.bodies[0]  # forwardBody: the service saw the body
        async with http.post(url, json=body) as response:
            assert response.status == 403
            assert (await response.json())["error"]["code"] == "unauthorized"
    finally:
        await up.stop()
        await server.stop(0)



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
        - type: ExternalAuth
          externalAuth:
            protocol: HTTP
            backendRef: {name: auth, port: 80}
            http: {allowedHeaders: [x-api-key]}
      backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: llama}]
    - matches: [{path: {type: PathPrefix, value: /v1/}}]
      backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: llama}]
""".replace("MODEL", EXAMPLE_MODEL)


async def test_a_model_routed_to_a_rule_with_external_auth_is_checked(
    tmp_path: Path, http: aiohttp.ClientSession, authorizer: tuple[Authorizer, int, web.AppRunner]
) -> None:
    """A request's first match (no model header yet) is the open rule; the body-based router
    re-matches on the model to the guarded rule, whose check must still run (it did not, when the
    ext_authz filter was off by default and turned on per route: docs in translate.external_auth);
    a request for another model stays on the open rule, unchecked."""
    auth, port, _ = authorizer
    config = tmp_path / "config"
    shutil.copytree(bundled_example(), config)
    (config / "gateway.yaml").write_text(MODEL_ROUTES)
    (config / "auth.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: auth\n  namespace: default\n"
        f"  annotations: {{kvgate.io/endpoints: \"127.0.0.1:{port}\"}}\nspec:\n  ports: [{{port: 80}}]\n")
    up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=2,
                            sim_hosts_from="127.0.9.171", sim_time_scale=0.01))
    body = {"model": EXAMPLE_MODEL, "prompt": "a guarded model", "max_tokens": 2}
    url = f"{up.url}/v1/completions"
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        async with http.post(url, json=body) as response:
            assert response.status == 401, await response.text()
        async with http.post(url, json=body, headers={"x-api-key": "good"}) as response:
            assert response.status == 200, await response.text()
        assert len(auth.checked) == 2
        async with http.post(url, json={**body, "model": "another-model"}) as response:
            assert response.status == 404  # the open rule: no check, the model unknown to the pool
        assert len(auth.checked) == 2
    finally:
        await up.stop()
