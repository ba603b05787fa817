"""``kvgate up --kubernetes`` following a cluster, through real Envoy and the simulated fleet.

The cluster is the FAKE API server of tests/kube_api_fake.py (no real one can run here); the
fleet's replicas play the Pods (one loopback address each, as Pod IPs). Manifests applied to the
server become traffic; a Pod turning not-ready stops getting requests within a second of the watch
event; scaling from 4 to 8 Pods sends requests to the new ones within a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.picker.tls import self_signed
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import UpOptions
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json, wait_until
from tests.gateway.controlplane.kubernetes.test_provider import GATEWAY, GATEWAY_CLASS, POOL, ROUTE
from tests.kube_api_fake import FakeApiServer

pytestmark = pytest.mark.e2e
FIRST_IP = "127.0.7."


def _pod(index: int, ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"llm-{index}", "labels": {"app": "llm"}},
        "status": {"phase": "Running", "podIP": f"{FIRST_IP}{index + 1}",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


async def _received(http: aiohttp.ClientSession, fleet: SimFleet) -> list[int]:
    return [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]


async def test_the_gateway_follows_the_cluster(
    cluster: FakeApiServer, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    fleet = await start_fleet(
        replicas=8, time_scale=0.01,
        extra_args=["--port", str(port), "--hosts-from", f"{FIRST_IP}1", "--admin-port", "0",
                    "--model", "base"],
    )
    pool = {**POOL, "spec": {**POOL["spec"], "targetPorts": [{"number": port}]}}
    for obj in (GATEWAY_CLASS, GATEWAY, pool, ROUTE, *(_pod(i) for i in range(4))):
        await cluster.apply(dict(obj))
    up = KvgateUp(UpOptions(kubernetes=True, kube_api=cluster.url, namespace="default", port=free_port(),
                            admin_port=0, sim=0))
    try:
        await up.start()
        body = {"model": "base", "prompt": "hello", "max_tokens": 2}

        async def served() -> bool:
            return (await post_json(http, up.url, body)).status == 200

        await wait_until(served, "traffic through the cluster's configuration", timeout_s=15.0)

        async def send(count: int) -> None:
            replies = await asyncio.gather(*(post_json(http, up.url, body) for _ in range(count)))
            assert [r.status for r in replies if r.status != 200] == []

        # Pod 0 turns not-ready: within a second of the event it gets nothing more.
        await cluster.apply(_pod(0, ready=False))
        await asyncio.sleep(1.0)
        before = await _received(http, fleet)
        await send(40)
        after = await _received(http, fleet)
        assert after[0] == before[0], (before, after)
        assert sum(after) - sum(before) == 40

        # Scaling from 4 to 8 Pods: the new ones get requests within a second.
        for index in range(4, 8):
            await cluster.apply(_pod(index))

        async def new_pods_used() -> bool:
            await send(16)
            return all(count > 0 for count in (await _received(http, fleet))[4:])

        await wait_until(new_pods_used, "the new Pods receive requests", timeout_s=5.0)
        async with http.get(f"{up.admin_url}/status") as response:
            status = await response.json()
        assert status["config"]["directory"] == "kubernetes:default"

        # this replica holds the status Lease and writes what kubectl shows
        async def route_status() -> bool:
            route = cluster.get_object("httproutes", "r")
            return bool(route and route.get("status", {}).get("parents"))

        await wait_until(route_status, "the HTTPRoute's status written back", timeout_s=10.0)
        gateway = cluster.get_object("gateways", "gw")
        assert gateway is not None
        assert {c["type"]: c["status"] for c in gateway["status"]["conditions"]}["Programmed"] == "True"
        lease = cluster.get_object("leases", "kvgate-status-writer")
        assert lease is not None
        gateway_class = cluster.get_object("gatewayclasses", "kvgate", namespace="")
        assert gateway_class is not None
        assert gateway_class["status"]["conditions"][0]["type"] == "Accepted"
        features = [feature["name"] for feature in gateway_class["status"]["supportedFeatures"]]
        assert features == sorted(features)
        assert {"Gateway", "HTTPRoute", "BackendTLSPolicy", "HTTPRouteBackendProtocolH2C"} <= set(features)

        # a route with an invalid backendRef: ResolvedRefs=False in its status; the others still serve
        broken = {**ROUTE, "metadata": {"name": "broken"}, "spec": {**ROUTE["spec"], "rules": [{
            "matches": [{"path": {"type": "PathPrefix", "value": "/broken/"}}],
            "backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                             "name": "no-such-pool"}]}]}}
        await cluster.apply(broken)

        async def broken_reported() -> bool:
            route = cluster.get_object("httproutes", "broken")
            parents = (route or {}).get("status", {}).get("parents", [])
            states = {(c["type"], c["status"], c["reason"]) for p in parents for c in p["conditions"]}
            return ("ResolvedRefs", "False", "BackendNotFound") in states

        await wait_until(broken_reported, "ResolvedRefs=False on the broken route", timeout_s=5.0)

        # a BackendTLSPolicy on a Service a route reaches, its CA in a ConfigMap: followed, and its
        # status written per ancestor Gateway
        ca = self_signed(("api.internal",)).cert_pem.decode()
        for obj in (
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "api-ca"}, "data": {"ca.crt": ca}},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "api", "annotations": {"kvgate.io/endpoints": "127.0.0.1:9"}},
             "spec": {"ports": [{"port": 443}]}},
            {**ROUTE, "metadata": {"name": "api"}, "spec": {**ROUTE["spec"], "rules": [{
                "matches": [{"path": {"type": "PathPrefix", "value": "/api/"}}],
                "backendRefs": [{"name": "api", "port": 443}]}]}},
            {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "BackendTLSPolicy",
             "metadata": {"name": "api-tls"},
             "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "api"}], "validation": {
                 "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "api-ca"}],
                 "hostname": "api.internal"}}},
        ):
            await cluster.apply(obj)

        async def policy_reported() -> bool:
            policy = cluster.get_object("backendtlspolicies", "api-tls")
            ancestors = (policy or {}).get("status", {}).get("ancestors", [])
            wanted = {"Accepted": "True", "ResolvedRefs": "True"}
            states = [(a["ancestorRef"]["name"], {c["type"]: c["status"] for c in a["conditions"]})
                      for a in ancestors]
            return ("gw", wanted) in states

        await wait_until(policy_reported, "the BackendTLSPolicy's status written", timeout_s=10.0)
        await send(8)
    finally:
        await up.stop()


async def test_two_replicas_serve_one_writes_status_and_the_other_takes_over(
    cluster: FakeApiServer, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    """Both replicas follow the cluster and serve; the Lease holder writes status; when it stops,
    the other takes the Lease over and writes what changes next. A weight change on the HTTPRoute
    applies live on both, without a failed request."""
    port = free_port()
    fleet = await start_fleet(
        replicas=2, time_scale=0.01,
        extra_args=["--port", str(port), "--hosts-from", "127.0.7.21", "--admin-port", "0",
                    "--model", "base"],
    )
    pools = [
        {**POOL, "metadata": {"name": name}, "spec": {**POOL["spec"], "targetPorts": [{"number": port}],
                                                       "selector": {"matchLabels": {"app": name}}}}
        for name in ("pool-a", "pool-b")
    ]
    pods = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
         "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}
        for name, ip in (("pool-a", "127.0.7.21"), ("pool-b", "127.0.7.22"))
    ]

    def route(weight_a: int, weight_b: int) -> dict[str, Any]:
        refs = [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name, "weight": w}
                for name, w in (("pool-a", weight_a), ("pool-b", weight_b))]
        return {**ROUTE, "spec": {**ROUTE["spec"], "rules": [{"backendRefs": refs}]}}

    for obj in (GATEWAY_CLASS, GATEWAY, *pools, *pods, route(100, 0)):
        await cluster.apply(dict(obj))
    replicas = [
        KvgateUp(UpOptions(kubernetes=True, kube_api=cluster.url, namespace="default", port=free_port(),
                           admin_port=0, sim=0, status_lease_s=1.0))
        for _ in range(2)
    ]
    try:
        for up in replicas:
            await up.start()
        body = {"model": "base", "prompt": "hello", "max_tokens": 2}
        for up in replicas:
            async def served(url: str = up.url) -> bool:
                return (await post_json(http, url, body)).status == 200

            await wait_until(served, "both replicas serve", timeout_s=15.0)

        async def holder() -> str | None:
            lease = cluster.get_object("leases", "kvgate-status-writer")
            return lease["spec"]["holderIdentity"] if lease else None

        async def held() -> bool:
            return await holder() is not None

        await wait_until(held, "a Lease holder", timeout_s=15.0)
        first = await holder()

        # weights move to pool-b live: no request fails on either replica while the change applies
        # (probed one request at a time until each replica sends to pool-b: no fixed sleep, which a
        # busy machine can outrun), then every request goes to pool-b
        await cluster.apply(route(0, 100))
        for up in replicas:
            async def moved(url: str = up.url) -> bool:
                before = await _received(http, fleet)
                assert (await post_json(http, url, body)).status == 200
                after = await _received(http, fleet)
                return after[1] > before[1]

            await wait_until(moved, "the new weights applied", timeout_s=15.0)
        before = await _received(http, fleet)
        for up in replicas:
            replies = await asyncio.gather(*(post_json(http, up.url, body) for _ in range(10)))
            assert [r.status for r in replies] == [200] * 10
        after = await _received(http, fleet)
        assert after[0] == before[0]
        assert after[1] - before[1] >= 20

        # the holder stops: the other takes the Lease over and writes the next change's status
        leader = next(up for up in replicas if up.status_identity == first)
        other = next(up for up in replicas if up is not leader)
        await leader.stop()

        async def taken_over() -> bool:
            return await holder() not in (None, first)

        await wait_until(taken_over, "the other replica holds the Lease", timeout_s=15.0)
        await cluster.apply({**route(0, 100), "spec": {**route(0, 100)["spec"], "parentRefs": [
            {"name": "gw"}, {"name": "missing-gateway"}]}})

        async def written() -> bool:
            route_now = cluster.get_object("httproutes", "r")
            parents = (route_now or {}).get("status", {}).get("parents", [])
            return any(p["parentRef"]["name"] == "missing-gateway" for p in parents)

        await wait_until(written, "status written by the new holder", timeout_s=15.0)
        assert (await post_json(http, other.url, body)).status == 200
    finally:
        for up in replicas:
            await up.stop()
