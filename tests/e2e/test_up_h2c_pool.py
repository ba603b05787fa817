"""An InferencePool of gRPC model servers (``appProtocol: kubernetes.io/h2c``) through ``kvgate
up`` and real Envoy: Envoy speaks HTTP/2 with prior knowledge to the pool's endpoints, which a gRPC
server (speaking nothing else) answers; the picker picks among them by their metrics (a simulated
replica serves the page on the pool's ``kvgate.io/metrics-port``) and routes the gRPC method the
pool opts in (``kvgate.io/extra-paths``: outside the inference API)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.test_up_routing import StartUp, gateway_yaml, pool_ref, start_up, wait_ready

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests

CHECK = "/grpc.health.v1.Health/Check"


@pytest.fixture
async def grpc_server() -> AsyncIterator[int]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


@pytest.mark.parametrize("protocol", ["kubernetes.io/h2c", "http"])
async def test_a_pool_of_grpc_servers_is_spoken_to_over_h2c(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession, grpc_server: int, protocol: str,
) -> None:
    metrics_port = free_port()  # (the pod's metrics, on another port as Triton's are)
    await start_fleet(replicas=1, time_scale=0.01, extra_args=[
        "--port", str(metrics_port), "--hosts-from", "127.0.0.1", "--admin-port", "0"])
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "pool.yaml").write_text(f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: grpc-models
  annotations: {{kvgate.io/metrics-port: "{metrics_port}", kvgate.io/extra-paths: "{CHECK}"}}
spec:
  selector: {{matchLabels: {{app: grpc-models}}}}
  targetPorts: [{{number: {grpc_server}}}]
  appProtocol: {protocol}
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: grpc-models-0, labels: {{app: grpc-models}}}}
status: {{phase: Running, podIP: 127.0.0.1}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{pool_ref("grpc-models")}]}}]
""")
    up = await start_up(config)
    await wait_ready(http, up, ["grpc-models"])
    async with grpc.aio.insecure_channel(up.url.removeprefix("http://")) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        if protocol == "http":  # HTTP/1.1 to a server that speaks HTTP/2 alone
            with pytest.raises(grpc.aio.AioRpcError):
                await check(health_pb2.HealthCheckRequest(), timeout=5)
            return
        reply = await check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
