"""The Kubernetes provider against the FAKE API server (tests/kube_api_fake.py): the cluster's
objects become the configuration the file provider would make of the same manifests, and changes
(a Pod turning not-ready, a route edited) arrive as new snapshots."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kvgate.gateway.controlplane.kubernetes.client import KubeClient
from kvgate.gateway.controlplane.kubernetes.provider import KubernetesProvider
from kvgate.gateway.controlplane.resources import ConfigSnapshot, ValidationOptions
from kvgate.gateway.picker.tls import self_signed
from kvgate.policies.errors import ConfigError
from tests.gateway.controlplane.kubernetes.test_informer import pod
from tests.kube_api_fake import FakeApiServer

GATEWAY_CLASS: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "kvgate"},
    "spec": {"controllerName": "kvgate.io/gateway-controller"},
}
GATEWAY: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw"},
    "spec": {"gatewayClassName": "kvgate", "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP"}]},
}
POOL: dict[str, Any] = {
    "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "llm"},
    "spec": {"selector": {"matchLabels": {"app": "llm"}}, "targetPorts": [{"number": 8000}],
             "endpointPickerRef": {"name": "kvgate", "port": {"number": 9002}}},
}
ROUTE: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "r"},
    "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llm"}]}]},
}


@pytest.fixture
async def cluster() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer(bookmark_interval_s=0.1)
    await server.start()
    for obj in (GATEWAY_CLASS, GATEWAY, POOL, ROUTE, pod("llm-0", "10.0.0.1"), pod("llm-1", "10.0.0.2")):
        await server.apply(dict(obj))
    yield server
    await server.stop()


def _endpoints(snapshot: ConfigSnapshot) -> list[str]:
    [pool] = snapshot.config.pools
    return list(pool.addresses)


async def _next(updates: AsyncIterator[ConfigSnapshot], timeout_s: float = 5.0) -> ConfigSnapshot:
    return await asyncio.wait_for(updates.__anext__(), timeout_s)


async def test_the_cluster_becomes_a_configuration_and_follows_changes(cluster: FakeApiServer) -> None:
    provider = KubernetesProvider(
        await KubeClient.connect(host=cluster.url), namespace="default",
        options=ValidationOptions(require_picker_service=False),
    )
    try:
        first = await provider.first()
        assert _endpoints(first) == ["10.0.0.1:8000", "10.0.0.2:8000"]
        assert [route.key.name for route in first.config.routes] == ["r"]
        updates = provider.updates()
        assert await _next(updates) is first
        # a Pod turning not-ready leaves the pool (tests/e2e/test_up_kubernetes.py: traffic within 1 s)
        await cluster.apply(pod("llm-1", "10.0.0.2", ready=False))
        second = await _next(updates)
        assert _endpoints(second) == ["10.0.0.1:8000"]
        # scaling out: new Pods join
        for index in range(2, 5):
            await cluster.apply(pod(f"llm-{index}", f"10.0.0.{index + 1}"))
        third = await _next(updates)
        while len(_endpoints(third)) < 4:
            third = await _next(updates)
        assert _endpoints(third) == ["10.0.0.1:8000", "10.0.0.3:8000", "10.0.0.4:8000", "10.0.0.5:8000"]
        # a deleted route is gone from the configuration
        await cluster.delete("gateway.networking.k8s.io/v1", "HTTPRoute", "r")
        fourth = await _next(updates)
        assert fourth.config.routes == ()
        assert fourth.version > third.version
        assert provider.status().directory == "kubernetes:default"
    finally:
        await provider.stop()


async def test_an_object_that_does_not_load_keeps_the_last_good_configuration(cluster: FakeApiServer) -> None:
    provider = KubernetesProvider(
        await KubeClient.connect(host=cluster.url), namespace="default",
        options=ValidationOptions(require_picker_service=False),
    )
    published: list[ConfigSnapshot] = []

    async def consume() -> None:
        async for snapshot in provider.updates():
            published.append(snapshot)

    try:
        first = await provider.first()
        consumer = asyncio.create_task(consume())
        broken: dict[str, Any] = {**POOL, "metadata": {"name": "bad"}, "spec": {"targetPorts": "nope"}}
        await cluster.apply(broken)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while provider.status().last_error is None:
            assert loop.time() < deadline, "the broken object was not noticed"
            await asyncio.sleep(0.02)
        assert "bad" in (provider.status().last_error or "")
        assert provider.current is first
        await cluster.delete("inference.networking.k8s.io/v1", "InferencePool", "bad")
        while provider.status().last_error is not None:
            assert loop.time() < deadline + 5.0, "the fix was not noticed"
            await asyncio.sleep(0.02)
        assert published == [first]  # nothing new was published: the content is the first again
        consumer.cancel()
    finally:
        await provider.stop()


async def test_a_cluster_without_a_required_crd_is_refused_with_the_missing_ones_named() -> None:
    server = FakeApiServer()
    server.unserved.update({"inferencepools", "inferenceobjectives"})
    await server.start()
    provider = KubernetesProvider(await KubeClient.connect(host=server.url), namespace="default")
    try:
        refused = r"does not serve inferencepools: install the CRDs of Gateway API"
        with pytest.raises(ConfigError, match=refused):
            await provider.first()
    finally:
        await provider.stop()
        await server.stop()


async def test_only_gateways_of_kvgates_gateway_class_are_served(cluster: FakeApiServer) -> None:
    other_class = {**GATEWAY_CLASS, "metadata": {"name": "istio"},
                   "spec": {"controllerName": "istio.io/gateway"}}
    other = {**GATEWAY, "metadata": {"name": "theirs"},
             "spec": {**GATEWAY["spec"], "gatewayClassName": "istio"}}
    await cluster.apply(other_class)
    await cluster.apply(other)
    provider = KubernetesProvider(await KubeClient.connect(host=cluster.url), namespace="default",
                                  options=ValidationOptions(require_picker_service=False))
    try:
        snapshot = await provider.first()
        assert [g.key.name for g in snapshot.config.gateways] == ["gw"]
        assert provider.gateway_classes() == [("kvgate", 1)]
    finally:
        await provider.stop()


async def test_an_https_listener_follows_its_tls_secret_and_no_other_secret_is_read(
    cluster: FakeApiServer,
) -> None:
    pair = self_signed(("llm.example.com",))
    https = {**GATEWAY, "spec": {"gatewayClassName": GATEWAY["spec"]["gatewayClassName"], "listeners": [
        {"name": "https", "port": 8443, "protocol": "HTTPS",
         "tls": {"certificateRefs": [{"name": "llm-cert"}]}}]}}
    await cluster.apply(https)
    release = {"name": "release", "namespace": "default"}  # not read: no listener's kind of Secret
    await cluster.apply({"apiVersion": "v1", "kind": "Secret", "metadata": release,
                         "type": "helm.sh/release.v1", "data": {"release": "eA=="}})
    provider = KubernetesProvider(
        await KubeClient.connect(host=cluster.url), namespace="default",
        options=ValidationOptions(require_picker_service=False),
    )
    try:
        first = await provider.first()
        assert first.config.gateways == ()  # its only listener has no certificate yet
        updates = provider.updates()
        assert await _next(updates) is first
        pems = (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem))
        encoded = {k: base64.b64encode(v).decode() for k, v in pems}
        await cluster.apply({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                             "metadata": {"name": "llm-cert", "namespace": "default"}, "data": encoded})
        second = await _next(updates)
        [gateway] = second.config.gateways
        certificate = gateway.listeners[0].certificate
        assert certificate is not None
        assert certificate.certificate_chain == pair.cert_pem.decode()
        secret_requests = [r for r in cluster.requests if "/secrets" in r]
        assert secret_requests
        assert all("fieldSelector=type%3Dkubernetes.io/tls" in r for r in secret_requests), secret_requests
    finally:
        await provider.stop()


async def test_only_the_config_maps_a_backend_tls_policy_names_make_a_new_configuration(
    cluster: FakeApiServer,
) -> None:
    ca = self_signed(("vllm.models.svc",)).cert_pem.decode()
    target = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llm"}
    policy = {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
        "metadata": {"name": "llm-tls"},
        "spec": {"targetRefs": [target],
                 "validation": {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "llm-ca"}],
                                "hostname": "vllm.models.svc"}},
    }
    await cluster.apply(policy)
    provider = KubernetesProvider(await KubeClient.connect(host=cluster.url), namespace="default",
                                  options=ValidationOptions(require_picker_service=False))
    try:
        first = await provider.first()
        assert first.config.pools == ()  # (its CA not there yet: the pool is not used in clear)
        updates = provider.updates()
        assert await _next(updates) is first
        pending = asyncio.ensure_future(updates.__anext__())
        for round_ in range(3):  # another controller's ConfigMap, changing: nothing to rebuild
            await cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "leader-election", "namespace": "default"},
                                 "data": {"holder": f"pod-{round_}"}})
        done, _ = await asyncio.wait({pending}, timeout=1.0)
        assert not done
        await cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "llm-ca", "namespace": "default"}, "data": {"ca.crt": ca}})
        second = await asyncio.wait_for(pending, 5.0)
        [pool] = second.config.pools
        assert pool.backend_tls is not None
        assert pool.backend_tls.ca_pem == ca
    finally:
        await provider.stop()


def _objective(group: str, name: str, priority: int) -> dict[str, Any]:
    # (the poolRef as the API server stores it: each CRD defaults its group, llm-d's to llm-d.ai)
    pool_ref = {"group": group.removeprefix("inference.networking.x-k8s.io") or "inference.networking.k8s.io",
                "kind": "InferencePool", "name": "llm"}
    return {"apiVersion": f"{group}/v1alpha2", "kind": "InferenceObjective", "metadata": {"name": name},
            "spec": {"priority": priority, "poolRef": pool_ref}}


async def test_llm_ds_objectives_are_read_and_win_over_the_inference_extensions(
    cluster: FakeApiServer,
) -> None:
    """llm-d's router (v0.9 on) serves InferenceObjective and InferenceModelRewrite in its own group,
    llm-d.ai: kvgate reads both groups; where both hold one name, as during a migration, llm-d's wins."""
    await cluster.apply(_objective("llm-d.ai", "premium", 100))
    await cluster.apply(_objective("inference.networking.x-k8s.io", "batch", -1))
    await cluster.apply(_objective("inference.networking.x-k8s.io", "standard", 5))
    await cluster.apply(_objective("llm-d.ai", "standard", 0))
    provider = KubernetesProvider(
        await KubeClient.connect(host=cluster.url), namespace="default",
        options=ValidationOptions(require_picker_service=False),
    )
    try:
        snapshot = await provider.first()
        priorities = {o.key.name: o.priority for o in snapshot.config.objectives}
        assert priorities == {"premium": 100, "batch": -1, "standard": 0}
        assert any("llm-d.ai's is used" in note for note in snapshot.resources.notes)
        assert provider.status().last_error is None
    finally:
        await provider.stop()
