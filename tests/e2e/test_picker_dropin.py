"""``kvgate picker`` as a drop-in for the Inference Extension's endpoint picker (issue 18): its
defaults serve the ext_proc port over TLS with a self-signed certificate (``--secure-serving``), and
real Envoy reaches it the two ways gateways do, each over TLS: the Inference Extension's reference
configuration (request body BUFFERED, response phases skipped) and full duplex both ways (Envoy
Gateway, kgateway). Completions, chat, streams and every error status with an OpenAI JSON body. A
certificate rotated on disk (``--cert-path``, ``--enable-cert-reload``) is served to new
connections without a restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.controlplane.envoy_config import ExtProcSettings, RouteSpec
from kvgate.gateway.picker.tls import CERT_FILE, KEY_FILE, self_signed
from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import EnvoyProcess, free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.pd_sidecar import Sidecar
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
from tests.gateway.controlplane.kubernetes.test_provider import POOL
from tests.kube_api_fake import FakeApiServer

pytestmark = pytest.mark.e2e

FULL_DUPLEX = ExtProcSettings(tls=True)
StartPicker = Callable[..., Awaitable[tuple[ChildProcess, int]]]


@pytest.fixture
async def start_picker_tls(tmp_path: Path) -> AsyncIterator[StartPicker]:
    started: list[ChildProcess] = []

    async def start(pools: list[dict[str, object]], *extra: str) -> tuple[ChildProcess, int]:
        pools_file = tmp_path / f"pools-{len(started)}.yaml"
        pools_file.write_text(yaml.safe_dump({"pools": pools}))
        child = ChildProcess([
            *KVGATE, "picker", "--pools", str(pools_file), "--grpc-port", "0", "--admin-port", "0",
            "--grpc-health-port", "0", "--log-level", "WARNING", *extra,
        ], name="kvgate picker")
        started.append(child)
        await child.start()
        ready = await child.wait_for_line(r"kvgate-picker ready grpc=\S+:(\d+) .*tls=(\w+) loop=(\w+)", 30)
        assert ready.group(2) == "true"  # the default, as the Inference Extension's picker
        assert ready.group(3) == ("asyncio" if "asyncio" in extra else "uvloop")  # --loop auto: uvloop
        return child, int(ready.group(1))

    yield start
    for child in reversed(started):
        await child.stop()


def _pools(fleet: SimFleet) -> list[dict[str, object]]:
    return [
        {"name": "llama", "endpoints": fleet.addresses, "models": [MODEL],
         "rateLimits": {"requestsPerMinute": 1}},
        {"name": "dead", "endpoints": ["127.0.0.1:1"]},
    ]


TWO_POOLS = ((PoolBackend("llama"), PoolBackend("dead")),
             (RouteSpec("dead", "dead", path_prefix="/dead/"), RouteSpec("llama", "llama")))


async def _gateway(
    start_envoy: Callable[..., Awaitable[EnvoyProcess]], picker_port: int, settings: ExtProcSettings,
    pools_and_routes: tuple[tuple[PoolBackend, ...], tuple[RouteSpec, ...]] = TWO_POOLS,
) -> str:
    """Envoy in front of the picker: ``llama``, and ``dead`` under /dead/ (unless told otherwise)."""
    return await envoy_in_front(start_envoy, picker_port, settings, pools_and_routes)


async def _stream(http: aiohttp.ClientSession, url: str) -> list[str]:
    body = {"model": MODEL, "prompt": "tell a story", "max_tokens": 12, "stream": True}
    async with http.post(f"{url}/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        text = (await response.read()).decode()
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


@pytest.mark.parametrize("settings", [GIE_REFERENCE, FULL_DUPLEX], ids=["gie-reference", "full-duplex"])
async def test_behind_envoy_over_tls_in_both_modes_gateways_configure(
    settings: ExtProcSettings,
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_picker_tls: StartPicker,
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    fleet = await start_fleet(3, 0.1, ["--model", MODEL])
    _, picker_port = await start_picker_tls(_pools(fleet))
    url = await _gateway(start_envoy, picker_port, settings)

    async def served() -> bool:
        reply = await post_json(http, url, {"model": MODEL, "prompt": "hi", "max_tokens": 2},
                                headers={"x-gateway-inference-fairness-id": "warm-up"})
        return reply.status == 200

    await wait_until(served, "the picker scraped the replicas", timeout_s=15.0)
    completion = await post_json(http, url, {"model": MODEL, "prompt": "hello", "max_tokens": 4})
    assert completion.status == 200, completion
    assert completion.json()["usage"]["completion_tokens"] == 4
    chat = await post_json(http, url, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                           path="/v1/chat/completions")
    assert chat.status == 200, chat
    assert chat.json()["object"] == "chat.completion"
    events = await _stream(http, url)
    assert events[-1] == "[DONE]"
    assert len([e for e in events if e != "[DONE]"]) >= 2

    errors = {
        400: await post_json(http, url, b"{not json"),
        404: await post_json(http, url, {"model": "no-such-model", "prompt": "x"}),
        503: await post_json(http, url, {"model": MODEL, "prompt": "x"}, path="/dead/v1/completions"),
    }
    tenant = {"x-gateway-inference-fairness-id": "tenant-a"}
    first = await post_json(http, url, {"model": MODEL, "prompt": "x", "max_tokens": 1}, headers=tenant)
    assert first.status == 200, first
    errors[429] = await post_json(http, url, {"model": MODEL, "prompt": "x", "max_tokens": 1}, headers=tenant)
    for status, reply in errors.items():
        assert reply.status == status, (status, reply)
        error = reply.json()["error"]
        assert error["message"]
        assert error["type"]
        assert error["code"]


def _fingerprint(port: int) -> str:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


async def test_a_certificate_rotated_on_disk_is_served_without_a_restart(
    tmp_path: Path,
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_picker_tls: StartPicker,
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()

    def write(pair_hosts: tuple[str, ...]) -> None:
        pair = self_signed(pair_hosts)
        staged = tmp_path / "staged"
        staged.mkdir(exist_ok=True)
        (staged / KEY_FILE).write_bytes(pair.key_pem)
        (staged / CERT_FILE).write_bytes(pair.cert_pem)
        for name in (KEY_FILE, CERT_FILE):  # as a Secret volume updates: whole files, renamed in
            (staged / name).replace(certs / name)

    write(("first.example",))
    fleet = await start_fleet(2, 0.1, ["--model", MODEL])
    child, picker_port = await start_picker_tls(  # asyncio's own loop: --loop keeps that path served
        _pools(fleet), "--cert-path", str(certs), "--enable-cert-reload", "--loop", "asyncio"
    )
    first = await asyncio.to_thread(_fingerprint, picker_port)
    url = await _gateway(start_envoy, picker_port, GIE_REFERENCE)

    async def served() -> bool:
        reply = await post_json(http, url, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
        return reply.status == 200

    await wait_until(served, "served through the first certificate", timeout_s=15.0)
    write(("second.example",))

    async def rotated() -> bool:
        return await asyncio.to_thread(_fingerprint, picker_port) != first

    await wait_until(rotated, "new connections get the rotated certificate", timeout_s=10.0)
    assert child.running  # no restart
    assert await served()


CHART_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins: [{type: queue-scorer}, {type: kv-cache-utilization-scorer}, {type: prefix-cache-scorer}]
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 5}
"""
"""The Inference Extension chart's default-plugins.yaml, as its ConfigMap gives the picker, with the
prefix scorer's weight raised (the chart's own default is kvgate's default profile: test_cli)."""


async def test_following_one_inference_pool_in_a_cluster(
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    """``kvgate picker --kubernetes --pool-name llm``: the pool's Pods from the (FAKE: no real one can
    run here) API server; a Pod turning not-ready stops being picked; the metrics port wants a
    bearer token the API server accepts and authorizes (the Inference Extension's default); the
    chart's EndpointPickerConfig (``--config-file``), customised, becomes the pool's profile."""
    port = free_port()
    fleet = await start_fleet(3, 0.1, ["--port", str(port), "--hosts-from", "127.0.11.1", "--model", MODEL,
                                       "--admin-port", "0"])
    cluster = FakeApiServer()
    cluster.tokens.update({"scraper-token": "system:serviceaccount:monitoring:prometheus",
                           "other-token": "system:serviceaccount:default:someone"})
    cluster.metrics_readers.add("system:serviceaccount:monitoring:prometheus")
    await cluster.start()
    pool = {**POOL, "spec": {**POOL["spec"], "targetPorts": [{"number": port}]}}
    for obj in (pool, *(pod(f"llm-{i}", f"127.0.11.{i + 1}") for i in range(3))):
        await cluster.apply(dict(obj))
    child = ChildProcess([
        # the Inference Extension's picker command line as its image gets it (no subcommand: kvgate
        # runs it as `kvgate picker --kubernetes`), bound to loopback here
        *KVGATE, "--kube-api", cluster.url, "--host", "127.0.0.1", "--pool-name", "llm",
        "--pool-namespace", "default", "--grpc-port", "0", "--admin-port", "0", "--grpc-health-port", "0",
        "--log-level", "WARNING", "--config-text", CHART_CONFIG,
        # (what llm-d's chart passes every picker besides: kvgate's starts with them)
        "--zap-encoder", "json", "--ha-enable-leader-election", "--tracing=false",
        "--refresh-metrics-interval", "50ms",
    ], name="kvgate picker --kubernetes")
    await child.start()
    try:
        pattern = r"kvgate-picker ready grpc=\S+:(\d+) admin=(\S+) .*pool=default/llm"
        ready = await child.wait_for_line(pattern, 30)
        # the Inference Extension's reference configuration (TLS, BUFFERED), one pool
        one_pool = ((PoolBackend("default/llm"),), ())
        url = await _gateway(start_envoy, int(ready.group(1)), GIE_REFERENCE, one_pool)
        admin = ready.group(2)

        async def served() -> bool:
            reply = await post_json(http, url, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
            return reply.status == 200

        await wait_until(served, "served through the cluster's pool", timeout_s=15.0)
        await cluster.apply(pod("llm-0", "127.0.11.1", ready=False))

        async def left() -> bool:
            async with http.get(f"{admin}/debug/pools") as response:
                [served_pool] = (await response.json())["pools"]
            assert served_pool["profile"].endswith("/profile.yaml")  # (--config-text's, translated)
            return "127.0.11.1:" + str(port) not in [e["address"] for e in served_pool["endpoints"]]

        await wait_until(left, "the not-ready Pod left the pool", timeout_s=5.0)
        before = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        for _ in range(12):
            assert await served()
        after = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        assert after[0] == before[0]

        async def metrics(token: str | None) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with http.get(f"{admin}/metrics", headers=headers) as response:
                if response.status == 200:
                    assert "inference_objective_request_total" in await response.text()
                return response.status

        assert await metrics(None) == 401
        assert await metrics("other-token") == 403
        assert await metrics("scraper-token") == 200
    finally:
        await child.stop()
        await cluster.stop()


CHART_SIDECAR = Path(__file__).resolve().parents[2] / "deploy/charts/kvgate-picker/files/envoy-sidecar.yaml"


async def _chart_sidecar(start_envoy: Callable[..., Awaitable[EnvoyProcess]], picker_port: int) -> str:
    """The kvgate-picker chart's Envoy sidecar, its listener, admin and picker ports moved to free
    ones (and the listener to loopback); its URL."""
    boot = yaml.safe_load(CHART_SIDECAR.read_text(encoding="utf-8"))
    port = free_port()
    boot["admin"]["address"]["socket_address"]["port_value"] = free_port()
    [listener] = boot["static_resources"]["listeners"]
    listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": port}
    [picker] = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "kvgate_ext_proc")[
        "load_assignment"]["endpoints"][0]["lb_endpoints"]
    picker["endpoint"]["address"]["socket_address"]["port_value"] = picker_port
    await start_envoy(boot)
    return f"http://127.0.0.1:{port}"


async def test_the_mode_without_an_inference_pool_serves_the_pods_a_selector_selects(
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    """The Inference Extension's standalone mode, as its chart and llm-d's RL jobs start the picker:
    ``--endpoint-selector`` / ``--endpoint-target-ports``, no InferencePool (its CRD need not exist:
    the FAKE API server, no real one can run here, refuses every Inference Extension kind, as RBAC
    for Pods alone would), behind the kvgate-picker chart's own Envoy sidecar configuration (its
    ports moved to free ones). The pool is named after the Deployment (``POD_NAME``) in this Pod's
    namespace (``POD_NAMESPACE``); a Pod the selector leaves out (``!draining``) is never picked, and
    one labelled out while serving leaves the pool."""
    port = free_port()
    fleet = await start_fleet(3, 0.1, ["--port", str(port), "--hosts-from", "127.0.12.1", "--model", MODEL,
                                       "--admin-port", "0"])
    cluster = FakeApiServer()
    for plural in ("inferencepools", "inferenceobjectives", "inferencemodelrewrites"):
        cluster.deny("GET", plural)
    await cluster.start()

    def sampler(index: int, **labels: str) -> dict[str, object]:
        obj = pod(f"sampler-{index}", f"127.0.12.{index + 1}")
        obj["metadata"] = {"name": f"sampler-{index}", "namespace": "jobs",
                           "labels": {"app": "sampler", **labels}}
        return obj

    await cluster.apply(sampler(0))
    await cluster.apply(sampler(1))
    await cluster.apply(sampler(2, draining="true"))
    trainer = {"name": "trainer-0", "namespace": "jobs", "labels": {"app": "trainer"}}
    await cluster.apply({**pod("trainer-0", "127.0.12.9"), "metadata": trainer})
    env = {**os.environ, "POD_NAME": "rl-router-7d9f8b6c5d-x2x9k", "POD_NAMESPACE": "jobs"}
    child = ChildProcess([
        # the standalone chart's picker command line (no subcommand), bound to loopback here
        *KVGATE, "--kube-api", cluster.url, "--host", "127.0.0.1",
        "--endpoint-selector", "app=sampler,!draining", "--endpoint-target-ports", str(port),
        "--grpc-port", "0", "--admin-port", "0", "--grpc-health-port", "0", "--log-level", "WARNING",
        "--metrics-endpoint-auth=false", "--tracing=false", "--zap-encoder", "json",
    ], name="kvgate picker --endpoint-selector", env=env)
    await child.start()
    try:
        pattern = r"kvgate-picker ready grpc=\S+:(\d+) admin=(\S+) .*pool=jobs/rl-router"
        ready = await child.wait_for_line(pattern, 30)
        url = await _chart_sidecar(start_envoy, int(ready.group(1)))
        admin = ready.group(2)

        async def served() -> bool:
            reply = await post_json(http, url, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
            return reply.status == 200

        await wait_until(served, "served through the selected Pods", timeout_s=15.0)
        for _ in range(12):
            assert await served()
        counts = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        assert counts[2] == 0, counts  # draining: not selected
        assert counts[0] > 0 or counts[1] > 0
        await cluster.apply(sampler(0, draining="true"))

        async def left() -> bool:
            async with http.get(f"{admin}/debug/pools") as response:
                [served_pool] = (await response.json())["pools"]
            return [e["address"] for e in served_pool["endpoints"]] == [f"127.0.12.2:{port}"]

        await wait_until(left, "the Pod labelled out left the pool", timeout_s=5.0)
        before = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        for _ in range(6):
            assert await served()
        after = [int(s["requests_received"]) for s in await fleet_stats(http, fleet)]
        assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (0, 6, 0)
        assert not any("inference" in line for line in cluster.requests), cluster.requests
        # every path goes through the picker, which serves the inference API alone: the engines'
        # admin API stays out of reach (an OpenAI-style 404, no replica asked)
        adapter = {"lora_name": "x", "lora_path": "/x"}
        async with http.post(f"{url}/v1/load_lora_adapter", json=adapter) as reply:
            assert reply.status == 404
            assert (await reply.json())["error"]["type"]
        assert [int(s["requests_received"]) for s in await fleet_stats(http, fleet)] == after
    finally:
        await child.stop()
        await cluster.stop()


async def test_disaggregated_pool_names_the_prefiller_for_llm_ds_routing_sidecar(
    start_fleet: Callable[..., Awaitable[SimFleet]],
    start_picker_tls: StartPicker,
    start_envoy: Callable[..., Awaitable[EnvoyProcess]],
    http: aiohttp.ClientSession,
) -> None:
    """``pdExecution: sidecar``: the picker picks both halves and tells the decode side's sidecar the
    prefill endpoint in ``x-prefiller-host-port`` (llm-d's contract); the sidecar runs the two steps."""
    fleet = await start_fleet(0, 0.01, ["--prefill", "1", "--decode", "1", "--model", MODEL,
                                        "--admin-port", "0"])
    prefill, decode = fleet.addresses
    sidecar = Sidecar(f"http://{decode}")
    decode_pod = await sidecar.start()
    try:
        pools = [{"name": "llama", "endpoints": [prefill, decode_pod], "models": [MODEL], "profile": "pd",
                  "pdExecution": "sidecar", "roles": {prefill: "prefill", decode_pod: "decode"}}]
        _, picker_port = await start_picker_tls(pools)
        url = await _gateway(start_envoy, picker_port, GIE_REFERENCE,
                             ((PoolBackend("llama"),), (RouteSpec("llama", "llama"),)))

        async def served() -> bool:
            reply = await post_json(http, url, {"model": MODEL, "prompt": "hi", "max_tokens": 2})
            return reply.status == 200

        await wait_until(served, "the picker scraped the replicas", timeout_s=15.0)
        long = " ".join(f"w{i}" for i in range(2400))
        reply = await post_json(http, url, {"model": MODEL, "prompt": long, "max_tokens": 4})
        assert reply.status == 200, reply
        assert reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 1000  # KV received
        chat = await post_json(http, url, {"model": MODEL, "messages": [{"role": "user", "content": long}]},
                               path="/v1/chat/completions")
        assert chat.status == 200, chat
        assert sidecar.seen[-2:] == [prefill, prefill]
        assert sidecar.seen[0] is None  # the short warm-up prompt was not split
        stats = {s["role"]: s for s in await fleet_stats(http, fleet)}
        assert (stats["prefill"]["remote_prefills"], stats["decode"]["remote_decodes"]) == (2, 2)
    finally:
        await sidecar.stop()
