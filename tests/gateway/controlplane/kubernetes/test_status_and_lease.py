"""Status written back and leader election, against the FAKE API server (tests/kube_api_fake.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kvgate.gateway.controlplane.kubernetes.client import KubeClient
from kvgate.gateway.controlplane.kubernetes.lease import LeaderElector
from kvgate.gateway.controlplane.kubernetes.provider import KubernetesProvider
from kvgate.gateway.controlplane.kubernetes.status import CONTROLLER_NAME, StatusPublisher, StatusWriter
from kvgate.gateway.controlplane.resources import ValidationOptions
from tests.gateway.controlplane.kubernetes.test_informer import pod
from tests.gateway.controlplane.kubernetes.test_provider import GATEWAY, GATEWAY_CLASS, POOL, ROUTE
from tests.kube_api_fake import FakeApiServer


@pytest.fixture
async def cluster() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    await server.start()
    for obj in (GATEWAY_CLASS, GATEWAY, POOL, ROUTE, pod("llm-0")):
        await server.apply(dict(obj))
    yield server
    await server.stop()


async def test_status_is_written_as_kubectl_shows_it_and_only_when_it_changes(cluster: FakeApiServer) -> None:
    provider = KubernetesProvider(await KubeClient.connect(host=cluster.url), namespace="default",
                                  options=ValidationOptions(require_picker_service=False))
    client = await KubeClient.connect(host=cluster.url)
    try:
        snapshot = await provider.first()
        writer = StatusWriter(client, addresses=["10.1.2.3", "kvgate.infra.svc.cluster.local"])
        assert await writer.write(snapshot.config.status) == 3  # Gateway, HTTPRoute, InferencePool
        gateway = cluster.get_object("gateways", "gw")
        assert gateway is not None
        conditions = {c["type"]: c for c in gateway["status"]["conditions"]}
        assert conditions["Accepted"]["status"] == "True"
        assert conditions["Accepted"]["observedGeneration"] == 1
        assert conditions["Accepted"]["lastTransitionTime"].endswith("Z")
        [listener] = gateway["status"]["listeners"]
        assert (listener["name"], listener["attachedRoutes"]) == ("http", 1)
        assert gateway["status"]["addresses"] == [
            {"type": "IPAddress", "value": "10.1.2.3"},
            {"type": "Hostname", "value": "kvgate.infra.svc.cluster.local"},
        ]
        route = cluster.get_object("httproutes", "r")
        assert route is not None
        [parent] = route["status"]["parents"]
        assert parent["controllerName"] == CONTROLLER_NAME
        assert parent["parentRef"]["name"] == "gw"
        states = {c["type"]: c["status"] for c in parent["conditions"]}
        assert states == {"Accepted": "True", "ResolvedRefs": "True"}
        pool = cluster.get_object("inferencepools", "llm")
        assert pool is not None
        assert pool["status"]["parents"][0]["parentRef"]["kind"] == "Gateway"
        assert gateway["metadata"]["generation"] == 1  # status writes leave the generation alone

        writes = sum(1 for r in cluster.requests if r.startswith("PATCH"))
        assert await writer.write(snapshot.config.status) == 0
        assert sum(1 for r in cluster.requests if r.startswith("PATCH")) == writes

        # an invalid backendRef: ResolvedRefs=False with the Gateway API's reason
        broken = {**ROUTE, "spec": {**ROUTE["spec"], "rules": [{"backendRefs": [
            {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "missing"}]}]}}
        await cluster.apply(broken)
        updates = provider.updates()
        later = await asyncio.wait_for(updates.__anext__(), 5)
        while later is snapshot:
            later = await asyncio.wait_for(updates.__anext__(), 5)
        await writer.write(later.config.status)
        route = cluster.get_object("httproutes", "r")
        assert route is not None
        resolved = {c["type"]: c for c in route["status"]["parents"][0]["conditions"]}["ResolvedRefs"]
        assert (resolved["status"], resolved["reason"]) == ("False", "BackendNotFound")
        assert resolved["observedGeneration"] == 2
    finally:
        await provider.stop()
        await client.close()


async def test_one_replica_holds_the_lease_and_another_takes_over_when_it_stops(
    cluster: FakeApiServer,
) -> None:
    clients = [await KubeClient.connect(host=cluster.url) for _ in range(2)]
    first = LeaderElector(clients[0], "default", identity="a", lease_duration_s=0.6, retry_s=0.1)
    second = LeaderElector(clients[1], "default", identity="b", lease_duration_s=0.6, retry_s=0.1)
    stop_first, stop_second = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(first.run(stop_first))]
    try:
        await asyncio.sleep(0.2)
        tasks.append(asyncio.create_task(second.run(stop_second)))
        await asyncio.sleep(0.5)
        assert first.is_leader
        assert not second.is_leader
        stop_first.set()  # the leader goes away without handing over
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3.0
        while not second.is_leader:
            assert loop.time() < deadline, "the lease was not taken over"
            await asyncio.sleep(0.05)
        lease = cluster.get_object("leases", "kvgate-status-writer")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
        assert not first.is_leader
    finally:
        stop_first.set()
        stop_second.set()
        await asyncio.gather(*tasks)
        for client in clients:
            await client.close()


async def test_another_controllers_pool_parents_are_kept(cluster: FakeApiServer) -> None:
    """An InferencePool two gateway implementations route to (a migration): kvgate writes its own
    parent with its controllerName and keeps the other's entry; its own stale entry is replaced."""
    other = {"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "theirs"},
             "controllerName": "example.net/gateway-controller",
             "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                             "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    unnamed = {**other, "parentRef": {"kind": "Gateway", "name": "older-controller"}}
    del unnamed["controllerName"]
    pool = cluster.get_object("inferencepools", "llm")
    assert pool is not None
    await cluster.apply({**pool, "status": {"parents": [other, unnamed]}})
    provider = KubernetesProvider(await KubeClient.connect(host=cluster.url), namespace="default",
                                  options=ValidationOptions(require_picker_service=False))
    client = await KubeClient.connect(host=cluster.url)
    try:
        snapshot = await provider.first()
        await StatusWriter(client).write(snapshot.config.status)
        written = cluster.get_object("inferencepools", "llm")
        assert written is not None
        parents = written["status"]["parents"]
        names = [(p["parentRef"]["name"], p.get("controllerName")) for p in parents]
        assert names == [("theirs", "example.net/gateway-controller"), ("older-controller", None),
                         ("gw", CONTROLLER_NAME)]
    finally:
        await provider.stop()
        await client.close()


async def test_a_status_the_api_server_refused_is_written_again_without_a_new_change(
    cluster: FakeApiServer,
) -> None:
    """A write refused (here 403, as a momentary RBAC gap; a 500 or a dropped connection alike) is
    tried again with back-off until it lands: before, it waited for the next configuration change."""
    provider = KubernetesProvider(await KubeClient.connect(host=cluster.url), namespace="default",
                                  options=ValidationOptions(require_picker_service=False))
    client = await KubeClient.connect(host=cluster.url)
    lease_client = await KubeClient.connect(host=cluster.url)
    elector = LeaderElector(lease_client, "default", identity="a", lease_duration_s=5.0, retry_s=0.1)
    writer = StatusWriter(client)
    publisher = StatusPublisher(client, elector, writer, list)
    cluster.deny("PATCH", "httproutes")
    try:
        snapshot = await provider.first()
        publisher.notify(snapshot.config)
        await publisher.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while writer.failed == 0 or (cluster.get_object("gateways", "gw") or {}).get("status") is None:
            assert loop.time() < deadline, "the first write never came"
            await asyncio.sleep(0.05)
        assert (cluster.get_object("httproutes", "r") or {}).get("status") is None
        cluster.allow("PATCH", "httproutes")
        while not (cluster.get_object("httproutes", "r") or {}).get("status"):
            assert loop.time() < deadline + 5.0, "the refused status was never written again"
            await asyncio.sleep(0.05)
        assert writer.failed == 0
    finally:
        await publisher.stop()
        await provider.stop()
        await lease_client.close()
