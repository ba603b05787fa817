"""GRPCRoute through ``kvgate up`` and real Envoy: gRPC calls routed by service, method and header
to Services spoken to in HTTP/2 (no ``appProtocol`` needed), unary and streaming, and a rule whose
backend does not exist answers UNAVAILABLE, as the Gateway API asks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from kvgate.gateway.picker.tls import self_signed
from tests.e2e.test_up_https import secret_yaml
from tests.e2e.test_up_routing import StartUp, gateway_yaml, start_up, wait_ready

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests

TLS_HOST = "grpc.example.com"
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def health_server(status: int) -> tuple[grpc.aio.Server, int]:
    """A gRPC server (HTTP/2 only) whose health service answers ``status``."""
    servicer = HealthServicer()
    await servicer.set("", status)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.fixture
async def servers() -> AsyncIterator[tuple[int, int]]:
    """A server answering SERVING and one answering NOT_SERVING (they tell the backends apart)."""
    stable, stable_port = await health_server(SERVING)
    canary, canary_port = await health_server(NOT_SERVING)
    try:
        yield stable_port, canary_port
    finally:
        await stable.stop(None)
        await canary.stop(None)


def _raw(data: bytes) -> bytes:
    return data


def service(name: str, port: int) -> str:
    return f"""
apiVersion: v1
kind: Service
metadata: {{name: {name}, annotations: {{kvgate.io/endpoints: "127.0.0.1:{port}"}}}}
spec:
  ports: [{{port: {port}}}]
"""


async def test_grpc_calls_are_routed_by_method_and_header(
    tmp_path: Path, start_up: StartUp, http: aiohttp.ClientSession, servers: tuple[int, int],
) -> None:
    stable, canary = servers
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "services.yaml").write_text("---".join([service("stable", stable), service("canary", canary)]))
    (config / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: health}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches:
        - method: {{service: grpc.health.v1.Health, method: Check}}
          headers: [{{name: x-canary, value: "true"}}]
      backendRefs: [{{name: canary, port: {canary}}}]
    - matches: [{{method: {{service: grpc.health.v1.Health}}}}]
      backendRefs: [{{name: stable, port: {stable}}}]
    - matches: [{{method: {{service: broken.Svc}}}}]
      backendRefs: [{{name: missing, port: 1}}]
""")
    up = await start_up(config)
    await wait_ready(http, up, [])  # (no pool: ready once Envoy serves)
    async with grpc.aio.insecure_channel(up.url.removeprefix("http://")) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        assert (await stub.Check(request, timeout=5)).status == SERVING
        canary_reply = await stub.Check(request, metadata=(("x-canary", "true"),), timeout=5)
        assert canary_reply.status == NOT_SERVING
        # a streamed call of the service: the Check rule's header does not take it to the canary
        watch = stub.Watch(request, metadata=(("x-canary", "true"),), timeout=5)
        assert (await watch.read()).status == SERVING
        watch.cancel()
        broken = channel.unary_unary("/broken.Svc/Do", _raw, _raw)
        with pytest.raises(grpc.aio.AioRpcError) as unavailable:
            await broken(b"", timeout=5)
        assert unavailable.value.code() is grpc.StatusCode.UNAVAILABLE
        unrouted = channel.unary_unary("/other.Svc/Do", _raw, _raw)
        with pytest.raises(grpc.aio.AioRpcError) as unimplemented:  # no route: Envoy's 404
            await unrouted(b"", timeout=5)
        assert unimplemented.value.code() is grpc.StatusCode.UNIMPLEMENTED


@pytest.fixture
async def echo_server() -> AsyncIterator[int]:
    """A gRPC server whose ``/echo.Echo/Chat`` (bidirectional streaming) answers each message as it
    comes."""

    async def chat(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes],
                   ) -> AsyncIterator[bytes]:
        async for message in requests:
            yield b"echo: " + message

    handler = grpc.method_handlers_generic_handler("echo.Echo", {
        "Chat": grpc.stream_stream_rpc_method_handler(chat, _raw, _raw)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


async def test_a_streamed_call_is_not_held_where_the_listener_routes_on_models(
    tmp_path: Path, start_up: StartUp, http: aiohttp.ClientSession, echo_server: int,
) -> None:
    """The listener routes completions by model (its body-based router holds each request's body
    until it ends): a bidirectional gRPC stream on it gets each answer before it sends the next
    message, so nothing holds its body; the same by an HTTPRoute (to an h2c port). The two routes
    name different hostnames (an HTTPRoute and a GRPCRoute may not share one)."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "services.yaml").write_text(service("echo", echo_server))
    (config / "routes.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: echo}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [grpc.example.com]
  rules: [{{backendRefs: [{{name: echo, port: {echo_server}}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: by-model}}
spec:
  parentRefs: [{{name: gw}}]
  hostnames: [api.example.com]
  rules:
    - matches: [{{path: {{value: /v1}}, headers: [{{name: x-gateway-model-name, value: some-model}}]}}]
      backendRefs: [{{name: echo, port: {echo_server}}}]
    - matches: [{{path: {{value: /echo.Echo}}}}]
      backendRefs: [{{name: echo-h2c, port: {echo_server}}}]
""")
    (config / "h2c.yaml").write_text(service("echo-h2c", echo_server).replace(
        f"{{port: {echo_server}}}", f"{{port: {echo_server}, appProtocol: kubernetes.io/h2c}}"))
    up = await start_up(config)
    await wait_ready(http, up, [])
    for host in ("grpc.example.com", "api.example.com"):
        options = (("grpc.default_authority", host),)
        async with grpc.aio.insecure_channel(up.url.removeprefix("http://"), options=options) as channel:
            call = channel.stream_stream("/echo.Echo/Chat", _raw, _raw)(timeout=10)  # type: ignore[call-arg]
            for text in (b"one", b"two", b"three"):
                await call.write(text)
                assert await call.read() == b"echo: " + text, host
            await call.done_writing()
            assert await call.code() is grpc.StatusCode.OK


async def test_grpc_over_tls_on_an_https_listener(
    tmp_path: Path, start_up: StartUp, http: aiohttp.ClientSession, servers: tuple[int, int],
) -> None:
    """An HTTPS listener offers HTTP/2 by ALPN: a gRPC client over TLS reaches a GRPCRoute's
    Service (in clear-text HTTP/2 behind the gateway)."""
    stable, _ = servers
    pair = self_signed((TLS_HOST,))
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw}}
spec:
  gatewayClassName: kvgate
  listeners:
    - name: grpc
      port: 8443
      protocol: HTTPS
      hostname: {TLS_HOST}
      tls: {{certificateRefs: [{{name: grpc}}]}}
""")
    (config / "secret.yaml").write_text(secret_yaml("grpc", pair))
    (config / "services.yaml").write_text(service("stable", stable))
    (config / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: health}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{{name: stable, port: {stable}}}]}}]
""")
    up = await start_up(config)
    await wait_ready(http, up, [])
    assert up.url.startswith("https://")
    credentials = grpc.ssl_channel_credentials(root_certificates=pair.cert_pem)
    options = (("grpc.ssl_target_name_override", TLS_HOST), ("grpc.default_authority", TLS_HOST))
    target = up.url.removeprefix("https://")
    async with grpc.aio.secure_channel(target, credentials, options=options) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == SERVING
