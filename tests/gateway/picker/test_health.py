"""The picker's gRPC health port answers the names the Inference Extension's chart probes."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvgate.gateway.picker.pools_file import PoolSpec
from kvgate.gateway.picker.service import PickerService, PickerSettings

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _statuses(port: int) -> dict[str, int]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        names = ("", "liveness", "readiness", "inference-extension")
        return {n: (await stub.Check(health_pb2.HealthCheckRequest(service=n))).status for n in names}


async def _until(port: int, name: str, wanted: int) -> dict[str, int]:
    for _ in range(100):
        statuses = await _statuses(port)
        if statuses[name] == wanted:
            return statuses
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never became {wanted}: {statuses}")


async def test_liveness_serves_at_once_and_readiness_once_a_pool_is_served() -> None:
    service = PickerService(PickerSettings(grpc_address="127.0.0.1:0", admin_port=0,
                                           health_address="127.0.0.1:0"))
    await service.start()
    try:
        port = service.extproc.health_port
        before = await _statuses(port)
        assert before == {"": SERVING, "liveness": SERVING, "readiness": NOT_SERVING,
                          "inference-extension": NOT_SERVING}
        service.apply_pools([PoolSpec(name="llama", endpoints=("127.0.0.1:1",))], default="llama")
        after = await _until(port, "readiness", SERVING)
        assert after["inference-extension"] == SERVING
        service.apply_pools([], default=None)
        assert (await _until(port, "readiness", NOT_SERVING))["liveness"] == SERVING
    finally:
        await service.stop()
