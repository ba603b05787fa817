"""A Service port's ``appProtocol`` (GEP-1911) through ``kvgate up`` and real Envoy:
``kubernetes.io/ws`` lets a WebSocket through to that backend alone (a realtime API), and
``kubernetes.io/h2c`` makes Envoy speak HTTP/2 with prior knowledge to it (a gRPC server); the same
servers named by ports without it refuse the upgrade, or cannot be spoken to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from tests.e2e.test_up_routing import StartUp, gateway_yaml, start_up, wait_ready

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests


@pytest.fixture
async def websocket_echo() -> AsyncIterator[int]:
    """An HTTP/1.1 server echoing WebSocket text frames on ``/v1/realtime``."""

    async def echo(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for message in socket:
            await socket.send_str(f"echo: {message.data}")
        return socket

    app = web.Application()
    app.router.add_get("/v1/realtime", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture
async def grpc_health_server() -> AsyncIterator[int]:
    """A gRPC server (HTTP/2 only) answering the health service's Check: SERVING."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


def service(name: str, port: int, app_protocol: str | None) -> str:
    protocol = f", appProtocol: {app_protocol}" if app_protocol else ""
    return f"""
apiVersion: v1
kind: Service
metadata: {{name: {name}, annotations: {{kvgate.io/endpoints: "127.0.0.1:{port}"}}}}
spec:
  ports: [{{port: {port}{protocol}}}]
"""


def rule(header: str, name: str, port: int) -> str:
    return (f"    - matches: [{{headers: [{{name: x-backend, value: {header}}}]}}]\n"
            f"      backendRefs: [{{name: {name}, port: {port}}}]\n")


async def test_websocket_and_h2c_backends_by_their_app_protocol(
    tmp_path: Path, start_up: StartUp, http: aiohttp.ClientSession, websocket_echo: int,
    grpc_health_server: int,
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "services.yaml").write_text("---".join([
        service("realtime", websocket_echo, "kubernetes.io/ws"),
        service("grpc-api", grpc_health_server, "kubernetes.io/h2c"),
        service("realtime-plain", websocket_echo, None),
        service("grpc-plain", grpc_health_server, None),
    ]))
    (config / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
{rule("ws", "realtime", websocket_echo)}{rule("ws-plain", "realtime-plain", websocket_echo)}\
{rule("h2c", "grpc-api", grpc_health_server)}{rule("h2c-plain", "grpc-plain", grpc_health_server)}""")
    up = await start_up(config)
    await wait_ready(http, up, [])  # (no pool: ready once Envoy serves)
    async with http.ws_connect(f"{up.url}/v1/realtime", headers={"x-backend": "ws"}) as socket:
        for text in ("hello", "again"):
            await socket.send_str(text)
            assert (await socket.receive(timeout=5)).data == f"echo: {text}"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(f"{up.url}/v1/realtime", headers={"x-backend": "ws-plain"})
    assert refused.value.status == 403
    target = up.url.removeprefix("http://")
    async with grpc.aio.insecure_channel(target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        reply = await check(health_pb2.HealthCheckRequest(), metadata=(("x-backend", "h2c"),), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):  # HTTP/1.1 to a server that speaks HTTP/2 alone
            await check(health_pb2.HealthCheckRequest(), metadata=(("x-backend", "h2c-plain"),), timeout=5)


async def test_a_websocket_is_not_held_where_the_listener_routes_on_models(
    tmp_path: Path, start_up: StartUp, http: aiohttp.ClientSession, websocket_echo: int,
) -> None:
    """The listener routes by model (its body-based router holds each request's body until it
    ends): a WebSocket session's frames are its body after the upgrade, and pass as they come."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "services.yaml").write_text(service("realtime", websocket_echo, "kubernetes.io/ws"))
    (config / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches: [{{headers: [{{name: x-gateway-model-name, value: some-model}}]}}]
      backendRefs: [{{name: realtime, port: {websocket_echo}}}]
    - matches: [{{path: {{value: /v1/realtime}}}}]
      backendRefs: [{{name: realtime, port: {websocket_echo}}}]
""")
    up = await start_up(config)
    await wait_ready(http, up, [])
    async with http.ws_connect(f"{up.url}/v1/realtime") as socket:
        for text in ("hello", "again"):
            await socket.send_str(text)
            assert (await socket.receive(timeout=5)).data == f"echo: {text}"
