"""The ADS server over a real grpc.aio channel on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.rpc import status_pb2

from kvgate.gateway.controlplane.xds import (
    ANY_NODE,
    CLUSTER,
    LISTENER,
    ROUTE,
    AdsServer,
    Snapshot,
    SnapshotCache,
    XdsStatus,
)
from tests.gateway.controlplane.xds.envoy_dicts import listener, route_config, static_cluster

NODE = "envoy-test"


def snapshot(body: str, cluster: str = "pool") -> Snapshot:
    return Snapshot.from_dicts(
        listeners=[listener("http", 8080, "main")],
        routes=[route_config("main", body=body, cluster=cluster)],
        clusters=[static_cluster(cluster)],
    )


class AdsClient:
    """Plays Envoy's side of one ADS stream."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._requests: asyncio.Queue[discovery_pb2.DiscoveryRequest] = asyncio.Queue()
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        self.call = stub.StreamAggregatedResources(self._iterate())

    async def _iterate(self) -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        while True:
            yield await self._requests.get()

    def send(self, **fields: object) -> None:
        error = fields.pop("error", None)
        req = discovery_pb2.DiscoveryRequest(**fields)
        if error is not None:
            req.error_detail.CopyFrom(status_pb2.Status(code=3, message=str(error)))
        self._requests.put_nowait(req)

    async def receive(self) -> discovery_pb2.DiscoveryResponse:
        response: discovery_pb2.DiscoveryResponse = await asyncio.wait_for(self.call.read(), timeout=5)
        return response

    def ack(self, response: discovery_pb2.DiscoveryResponse, names: tuple[str, ...] = ()) -> None:
        self.send(
            type_url=response.type_url,
            version_info=response.version_info,
            response_nonce=response.nonce,
            resource_names=list(names),
        )


async def until(condition: Callable[[], bool]) -> None:
    """Wait (up to 5 s) for the server to have processed what the client sent."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met within 5 s")


@pytest.fixture
async def served() -> AsyncIterator[tuple[SnapshotCache, XdsStatus, grpc.aio.Channel]]:
    cache, status = SnapshotCache(), XdsStatus()
    server = AdsServer(cache, observer=status)
    port = await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield cache, status, channel
    await server.stop(grace=0)


async def test_subscribe_ack_update_and_nack_over_grpc(
    served: tuple[SnapshotCache, XdsStatus, grpc.aio.Channel],
) -> None:
    cache, status, channel = served
    first = snapshot("v1")
    cache.set_snapshot(ANY_NODE, first)
    client = AdsClient(channel)

    client.send(type_url=CLUSTER, node={"id": NODE})
    cds = await client.receive()
    assert (cds.type_url, cds.version_info, len(cds.resources)) == (CLUSTER, first.version_of(CLUSTER), 1)
    client.ack(cds)
    client.send(type_url=LISTENER)
    lds = await client.receive()
    client.ack(lds)
    client.send(type_url=ROUTE, resource_names=["main"])
    rds = await client.receive()
    assert rds.version_info == first.version_of(ROUTE, ["main"])
    client.ack(rds, ("main",))
    await until(lambda: status.counters[ROUTE].acks == 1)  # else the ACK may arrive after the next push

    # A new snapshot is pushed without being asked for: clusters first, then routes.
    second = snapshot("v2", cluster="pool2")
    cache.set_snapshot(ANY_NODE, second)
    pushed_cds, pushed_rds = await client.receive(), await client.receive()
    assert (pushed_cds.type_url, pushed_rds.type_url) == (CLUSTER, ROUTE)
    assert pushed_rds.version_info == second.version_of(ROUTE, ["main"])
    client.ack(pushed_cds)
    client.send(
        type_url=ROUTE,
        version_info=rds.version_info,
        response_nonce=pushed_rds.nonce,
        resource_names=["main"],
        error="route rejected",
    )

    # The rejection shows up in the status; the next snapshot is pushed again.
    await until(lambda: status.last_rejection(NODE, ROUTE) is not None)
    rejection = status.last_rejection(NODE, ROUTE)
    assert rejection is not None
    assert (rejection.version, rejection.message) == (pushed_rds.version_info, "route rejected")
    third = snapshot("v3", cluster="pool2")
    cache.set_snapshot(ANY_NODE, third)
    fixed = await client.receive()
    assert (fixed.type_url, fixed.version_info) == (ROUTE, third.version_of(ROUTE, ["main"]))
    client.ack(fixed, ("main",))
    await until(lambda: status.counters[ROUTE].acks == 2)

    report = status.as_dict()
    assert report["counters"] == {
        CLUSTER: {"pushes": 2, "acks": 2, "nacks": 0},
        LISTENER: {"pushes": 1, "acks": 1, "nacks": 0},
        ROUTE: {"pushes": 3, "acks": 2, "nacks": 1},
    }
    node_routes = status.nodes[NODE][ROUTE]
    assert node_routes.acked_version == fixed.version_info
    client.call.cancel()


async def test_each_node_gets_its_own_snapshot(
    served: tuple[SnapshotCache, XdsStatus, grpc.aio.Channel],
) -> None:
    cache, _, channel = served
    cache.set_snapshot(ANY_NODE, snapshot("default"))
    cache.set_snapshot("special", snapshot("special", cluster="special-pool"))
    plain, special = AdsClient(channel), AdsClient(channel)
    plain.send(type_url=CLUSTER, node={"id": "plain"})
    special.send(type_url=CLUSTER, node={"id": "special"})
    plain_cds, special_cds = await plain.receive(), await special.receive()
    assert b"special-pool" not in plain_cds.resources[0].value
    assert b"special-pool" in special_cds.resources[0].value
    plain.call.cancel()
    special.call.cancel()


async def test_delta_xds_is_unimplemented(served: tuple[SnapshotCache, XdsStatus, grpc.aio.Channel]) -> None:
    _, _, channel = served
    stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)

    async def one_request() -> AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]:
        yield discovery_pb2.DeltaDiscoveryRequest(type_url=CLUSTER)

    call = stub.DeltaAggregatedResources(one_request())
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await call.read()
    assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED
