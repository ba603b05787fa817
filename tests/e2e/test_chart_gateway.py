"""deploy/charts/kvgate as a cluster would run it: the chart's GatewayClass and Gateway applied to the
API server, `kvgate up` started with the chart's own command line, traffic through real Envoy.

The cluster is the FAKE API server of tests/kube_api_fake.py (no real one can run here) and the
model servers are the simulator on loopback addresses playing Pod IPs. What the test changes in the
chart's command line is only what a Pod has and a test does not: ``$(POD_NAMESPACE)`` is expanded as
the kubelet would, Envoy and the admin server bind loopback on free ports instead of 0.0.0.0:8080 and
:9090, the API server is the fake's URL instead of the in-cluster service account, and Redis is a
real redis-server on loopback instead of the chart's Service name.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_cli import build_parser, options_from_args
from tests.deploy.charts import NAMESPACE, container, one, render
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json, wait_until
from tests.kube_api_fake import FakeApiServer
from tests.redis_server import RedisServer

pytestmark = pytest.mark.e2e
FIRST_IP = "127.0.7."


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of container args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def _user_objects(port: int, gateway: str) -> list[dict[str, Any]]:
    """What a user applies beside the chart: a pool of two Pods and a route to it."""
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "llm", "namespace": NAMESPACE},
            "spec": {"selector": {"matchLabels": {"app": "llm"}}, "targetPorts": [{"number": port}],
                     "endpointPickerRef": {"name": "kvgate", "port": {"number": 9002}}}}
    route = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
             "metadata": {"name": "llm", "namespace": NAMESPACE},
             "spec": {"parentRefs": [{"name": gateway}], "rules": [{"backendRefs": [
                 {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llm"}]}]}}
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"llm-{i}", "namespace": NAMESPACE, "labels": {"app": "llm"}},
             "status": {"phase": "Running", "podIP": f"{FIRST_IP}{i + 31}",
                        "conditions": [{"type": "Ready", "status": "True"}]}} for i in range(2)]
    return [pool, route, *pods]


async def test_kvgate_up_runs_the_gateway_chart_as_rendered(
    cluster: FakeApiServer, start_fleet: Callable[..., Awaitable[SimFleet]],
    start_redis: Callable[[], Awaitable[RedisServer]], http: aiohttp.ClientSession,
) -> None:
    docs = render("kvgate", {})
    chart_objects = [one(docs, "GatewayClass"), one(docs, "Gateway")]
    gateway_name = chart_objects[1]["metadata"]["name"]
    deployment = one(docs, "Deployment", "llama")  # the release name; the other is Redis
    args = [_expand(a, {"POD_NAMESPACE": NAMESPACE}) for a in container(deployment)["args"]]
    assert args[0] == "up"

    port = free_port()
    fleet = await start_fleet(replicas=2, time_scale=0.01, extra_args=[
        "--port", str(port), "--hosts-from", f"{FIRST_IP}31", "--admin-port", "0", "--model", "base"])
    redis = await start_redis()
    for obj in (*chart_objects, *_user_objects(port, gateway_name)):
        await cluster.apply(obj)

    listen = free_port()
    parsed = build_parser().parse_args([
        *args[1:], "--host", "127.0.0.1", "--port", str(listen), "--admin-port", "0",
        "--kube-api", cluster.url, "--redis", redis.url,
    ])
    up = KvgateUp(options_from_args(parsed))
    try:
        await up.start()
        body = {"model": "base", "prompt": "hello", "max_tokens": 2}

        async def served() -> bool:
            return (await post_json(http, up.url, body)).status == 200

        await wait_until(served, "traffic through the chart's Gateway", timeout_s=15.0)
        replies = await asyncio.gather(*(post_json(http, up.url, body) for _ in range(20)))
        assert [r.status for r in replies if r.status != 200] == []
        received = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        assert all(count > 0 for count in received), received  # both Pods of the pool serve

        # the chart's Gateway reports the chart's Service, and the Lease is in the release's namespace
        async def gateway_status() -> bool:
            gateway = cluster.get_object("gateways", gateway_name, namespace=NAMESPACE)
            return bool(gateway and gateway.get("status", {}).get("addresses"))

        await wait_until(gateway_status, "the Gateway's status written back", timeout_s=10.0)
        gateway = cluster.get_object("gateways", gateway_name, namespace=NAMESPACE)
        assert gateway is not None
        service = one(docs, "Service", deployment["metadata"]["name"])
        assert gateway["status"]["addresses"] == [
            {"type": "Hostname", "value": f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"}]
        conditions = {c["type"]: c["status"] for c in gateway["status"]["conditions"]}
        assert conditions == {"Accepted": "True", "Programmed": "True"}
        assert cluster.get_object("leases", "kvgate-status-writer", namespace=NAMESPACE) is not None
        assert cluster.get_object("leases", "kvgate-status-writer") is None  # not in "default"
    finally:
        await up.stop()
