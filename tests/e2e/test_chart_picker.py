"""deploy/charts/kvgate-picker as a cluster would run it, behind Envoy configured as the Inference
Extension's reference gateway (TLS, request body BUFFERED): the chart's InferencePool and
InferenceObjectives applied to the API server, `kvgate picker` started with the chart's own command
line, its probes answered as the chart asks them.

The cluster is the FAKE API server of tests/kube_api_fake.py (no real one can run here); the model
servers are the simulator on loopback addresses playing Pod IPs. Of the chart's command line only
what a Pod has and a test does not is replaced: loopback and free ports instead of 0.0.0.0 and the
fixed ports, the fake's URL instead of the in-cluster service account.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import aiohttp
import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import EnvoyProcess, free_port
from tests.deploy.charts import NAMESPACE, container, one, render
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import (
    GIE_REFERENCE,
    KVGATE,
    MODEL,
    envoy_in_front,
    fleet_stats,
    post_json,
    wait_until,
)
from tests.gateway.controlplane.kubernetes.test_informer import pod
from tests.kube_api_fake import FakeApiServer

pytestmark = pytest.mark.e2e


async def test_the_picker_chart_serves_its_pool_behind_a_gie_reference_gateway(
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    fleet = await start_fleet(2, 0.1, ["--port", str(port), "--hosts-from", "127.0.12.1", "--model", MODEL,
                                       "--admin-port", "0"])
    docs = render("kvgate-picker", {
        "inferencePool": {"modelServers": {"matchLabels": {"app": "llm"}}, "targetPorts": [{"number": port}]},
        "inferenceObjectives": [{"name": "batch", "priority": -1}],
        "inferenceExtension": {"monitoring": {"prometheus": {"enabled": False}}},
    })
    cluster = FakeApiServer()
    await cluster.start()
    for obj in (one(docs, "InferencePool"), one(docs, "InferenceObjective")):
        await cluster.apply(obj)
    for index, address in enumerate(fleet.addresses):
        labelled = pod(f"llm-{index}", address.rpartition(":")[0])
        labelled["metadata"]["namespace"] = NAMESPACE
        await cluster.apply(labelled)
    deployment = one(docs, "Deployment")
    args = container(deployment)["args"]
    assert args[0] == "picker"
    child = ChildProcess([
        *KVGATE, *args, "--host", "127.0.0.1", "--grpc-port", "0", "--grpc-health-port", "0",
        "--metrics-port", "0", "--kube-api", cluster.url,
    ], name="kvgate picker (chart)")
    await child.start()
    try:
        ready = await child.wait_for_line(
            r"kvgate-picker ready grpc=\S+:(\d+) .*health=\S+:(\d+) tls=true", 30)
        picker_port, health_port = int(ready.group(1)), int(ready.group(2))
        url = await envoy_in_front(start_envoy, picker_port, GIE_REFERENCE,
                                   ((PoolBackend(f"{NAMESPACE}/llama"),), ()))

        async def served() -> bool:
            reply = await post_json(http, url, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
            return reply.status == 200

        await wait_until(served, "served through the chart's pool", timeout_s=15.0)

        # the chart's probes, as the kubelet asks them
        probes = container(deployment)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for probe in (probes["livenessProbe"], probes["readinessProbe"]):
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=probe["grpc"]["service"]))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, probe
    finally:
        await child.stop()
        await cluster.stop()


async def test_the_standalone_chart_serves_the_selected_pods_through_its_own_envoy(
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    """The chart with ``createInferencePool: false``: no InferencePool reaches the API server (the
    FAKE one refuses the Inference Extension's kinds here), `kvgate picker` runs the chart's command
    line and Envoy the chart's ConfigMap (its ports moved to free ones on loopback): a Pod the
    selector leaves out is never picked."""
    port = free_port()
    fleet = await start_fleet(3, 0.1, ["--port", str(port), "--hosts-from", "127.0.12.21", "--model", MODEL,
                                       "--admin-port", "0"])
    docs = render("kvgate-picker", {"inferenceExtension": {
        "endpointsServer": {"createInferencePool": False, "endpointSelector": "app=sampler,!draining",
                            "targetPorts": str(port)},
        "monitoring": {"prometheus": {"enabled": False}},
    }})
    assert not [d for d in docs if d["kind"] == "InferencePool"]
    cluster = FakeApiServer()
    for plural in ("inferencepools", "inferenceobjectives", "inferencemodelrewrites"):
        cluster.deny("GET", plural)
    await cluster.start()
    for index, address in enumerate(fleet.addresses):
        labelled = pod(f"sampler-{index}", address.rpartition(":")[0])
        labels = {"app": "sampler", **({"draining": "true"} if index == 2 else {})}
        labelled["metadata"] = {"name": f"sampler-{index}", "namespace": NAMESPACE, "labels": labels}
        await cluster.apply(labelled)
    deployment = one(docs, "Deployment")
    args = container(deployment, "epp")["args"]
    env = {**os.environ, "POD_NAME": "llama-epp-5d9f8b6c5d-x2x9k", "POD_NAMESPACE": NAMESPACE}
    child = ChildProcess([
        *KVGATE, *args, "--host", "127.0.0.1", "--grpc-port", "0", "--grpc-health-port", "0",
        "--metrics-port", "0", "--kube-api", cluster.url,
    ], name="kvgate picker (standalone chart)", env=env)
    await child.start()
    try:
        ready = await child.wait_for_line(
            rf"kvgate-picker ready grpc=\S+:(\d+) .*tls=true.* pool={NAMESPACE}/llama-epp", 30)
        boot = yaml.safe_load(one(docs, "ConfigMap", "llama-epp-envoy")["data"]["envoy.yaml"])
        listen = free_port()
        boot["admin"]["address"]["socket_address"]["port_value"] = free_port()
        [listener] = boot["static_resources"]["listeners"]
        listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": listen}
        [picker] = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "kvgate_ext_proc")[
            "load_assignment"]["endpoints"][0]["lb_endpoints"]
        picker["endpoint"]["address"]["socket_address"]["port_value"] = int(ready.group(1))
        await start_envoy(boot)
        url = f"http://127.0.0.1:{listen}"

        async def served() -> bool:
            reply = await post_json(http, url, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
            return reply.status == 200

        await wait_until(served, "served through the chart's own Envoy", timeout_s=15.0)
        for _ in range(9):
            assert await served()
        counts = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        assert counts[2] == 0, counts  # draining: not selected
        assert not any("inference" in line for line in cluster.requests)
    finally:
        await child.stop()
        await cluster.stop()
