"""Issue 4 acceptance on real Envoy through the composition ``kvgate up`` runs (``gateway.up.KvgateUp``):
manifests in a directory → control plane → ADS → Envoy, the in-process picker, simulator fleets as Pods.

1 weighted split 70/30 · 2 header routing · 3 model routing (body-based router) · 4 live weight change
· 5 invalid pool reference · 6 several rules / several routes · 7 weighted model rewrite 90/10.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import UpOptions
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json, received, wait_until

pytestmark = pytest.mark.e2e

TIME_SCALE = "0.002"
StartUp = Callable[[Path], Awaitable[KvgateUp]]


def gateway_yaml() -> str:
    return """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: kvgate
  listeners: [{name: http, port: 8080, protocol: HTTP}]
"""


def pool_yaml(name: str, port: int) -> str:
    return f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: {name}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
"""


def pods_yaml(app: str, fleet: SimFleet) -> str:
    docs = []
    for index, address in enumerate(fleet.addresses):
        ip = address.rpartition(":")[0]
        docs.append(
            f"""
apiVersion: v1
kind: Pod
metadata: {{name: {app}-{index}, labels: {{app: {app}}}}}
status: {{phase: Running, podIP: {ip}}}
"""
        )
    return "---".join(docs)


def pool_ref(name: str, weight: int | None = None) -> str:
    extra = f", weight: {weight}" if weight is not None else ""
    return f"{{group: inference.networking.k8s.io, kind: InferencePool, name: {name}{extra}}}"


@pytest.fixture
async def start_up() -> AsyncIterator[StartUp]:
    started: list[KvgateUp] = []

    async def start(directory: Path) -> KvgateUp:
        up = KvgateUp(
            UpOptions(
                directory=directory, port=free_port(), admin_port=0, sim=0, quiet_ms=50, max_batch_ms=200
            )
        )
        started.append(up)
        await up.start()
        return up

    yield start
    for up in reversed(started):
        await up.stop()


async def sim_fleet(
    start_fleet: Callable[..., Awaitable[SimFleet]], first_ip: str, port: int, *args: str
) -> SimFleet:
    """Two replicas at ``first_ip`` and the next address, both on ``port`` (one "pod IP" each)."""
    extra = ["--port", str(port), "--hosts-from", first_ip, "--admin-port", "0", *args]
    return await start_fleet(replicas=2, time_scale=float(TIME_SCALE), extra_args=extra)


async def wait_ready(http: aiohttp.ClientSession, up: KvgateUp, pools: Sequence[str]) -> None:
    async def ready() -> bool:
        async with http.get(f"{up.admin_url}/readyz") as response:
            return response.status == 200

    await wait_until(ready, f"picker ready for {pools}", timeout_s=15.0)


async def send_many(
    http: aiohttp.ClientSession, url: str, count: int, *, path: str = "/v1/completions",
    model: str = "base", headers: dict[str, str] | None = None, concurrency: int = 24,
) -> list[tuple[int, str]]:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tuple[int, str]:
        async with gate:
            body = {"model": model, "max_tokens": 1}
            if path.endswith("chat/completions"):
                body["messages"] = [{"role": "user", "content": f"hi {i}"}]
            else:
                body["prompt"] = f"request {i}"
            reply = await post_json(http, url, body, path=path, headers=headers)
            return reply.status, reply.text

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def totals(http: aiohttp.ClientSession, fleet: SimFleet) -> int:
    return sum(r["requests_received"] for r in await fleet_stats(http, fleet))


async def test_split_headers_models_rules_routes_and_invalid_ref(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    args = ("--model", "base", "--loras", "model-a,model-b", "--max-loras", "2")
    fleet_a = await sim_fleet(start_fleet, "127.0.2.1", port, *args)
    fleet_b = await sim_fleet(start_fleet, "127.0.3.1", port, *args)
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pools.yaml").write_text(pool_yaml("pool-a", port) + "---" + pool_yaml("pool-b", port))
    (tmp_path / "pods.yaml").write_text(pods_yaml("pool-a", fleet_a) + "---" + pods_yaml("pool-b", fleet_b))
    # Route "split" (several rules to different pools): canary header → pool-b, else 70/30.
    # Route "models" on the same listener: model-a → pool-a, model-b → pool-b (X-Gateway-Model-Name).
    # Route "broken": a missing pool.
    (tmp_path / "routes.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: split}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches:
        - path: {{type: Exact, value: /v1/completions}}
          headers: [{{name: x-model-version, value: canary}}]
      backendRefs: [{pool_ref("pool-b")}]
    - matches: [{{path: {{type: Exact, value: /v1/completions}}}}]
      backendRefs: [{pool_ref("pool-a", 70)}, {pool_ref("pool-b", 30)}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: models}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches:
        - path: {{type: Exact, value: /v1/chat/completions}}
          headers: [{{name: X-Gateway-Model-Name, value: model-a}}]
      backendRefs: [{pool_ref("pool-a")}]
    - matches:
        - path: {{type: Exact, value: /v1/chat/completions}}
          headers: [{{name: X-Gateway-Model-Name, value: model-b}}]
      backendRefs: [{pool_ref("pool-b")}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: broken}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - matches: [{{path: {{type: PathPrefix, value: /broken}}}}]
      backendRefs: [{pool_ref("missing")}]
""")
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool-a", "pool-b"])

    # (5) the missing pool: ResolvedRefs=False with a reason, its requests 500, the rest serves.
    async with http.get(f"{up.admin_url}/status") as response:
        status = await response.json()
    [broken] = [e for e in status["resources"] if e["kind"] == "HTTPRoute" and e["name"] == "broken"]
    resolved = {c["type"]: c for c in broken["conditions"]}["ResolvedRefs"]
    assert (resolved["status"], resolved["reason"]) == ("False", "BackendNotFound"), resolved
    assert "missing" in resolved["message"]
    reply = await post_json(http, up.url, {"model": "base", "prompt": "x"}, path="/broken")
    assert reply.status == 500
    assert reply.headers["content-type"].startswith("application/json")
    assert json.loads(reply.text)["error"]["code"] == "no_valid_backend"

    # (1) 70/30 over 1,500 requests, within ±4 points.
    a0, b0 = await totals(http, fleet_a), await totals(http, fleet_b)
    results = await send_many(http, up.url, 1500)
    assert [s for s, _ in results if s != 200] == [], results[:3]
    a1, b1 = await totals(http, fleet_a), await totals(http, fleet_b)
    share_a = (a1 - a0) / ((a1 - a0) + (b1 - b0))
    assert (a1 - a0) + (b1 - b0) == 1500
    assert abs(share_a - 0.70) <= 0.04, share_a

    # (2) + (6) the canary header selects pool-b (another rule of the same route).
    before = [await fleet_stats(http, fleet_a), await fleet_stats(http, fleet_b)]
    results = await send_many(http, up.url, 40, headers={"x-model-version": "canary"})
    assert {s for s, _ in results} == {200}
    after = [await fleet_stats(http, fleet_a), await fleet_stats(http, fleet_b)]
    assert sum(received(before[0], after[0])) == 0
    assert sum(received(before[1], after[1])) == 40

    # (3) + (6) model routing through X-Gateway-Model-Name, on a second route of the listener.
    for model, fleet, other in (("model-a", fleet_a, fleet_b), ("model-b", fleet_b, fleet_a)):
        hit0, miss0 = await totals(http, fleet), await totals(http, other)
        results = await send_many(http, up.url, 30, path="/v1/chat/completions", model=model)
        assert {s for s, _ in results} == {200}, results[:2]
        assert all(f'"model": "{model}"' in text or f'"model":"{model}"' in text for _, text in results)
        assert await totals(http, fleet) - hit0 == 30
        assert await totals(http, other) - miss0 == 0
    # An unknown model matches no route rule and reaches no replica: the endpoint-picker filter still
    # asks the picker, which sees no pool on the stream and answers 404 model_not_found (OpenAI's code).
    a0, b0 = await totals(http, fleet_a), await totals(http, fleet_b)
    unknown = await post_json(
        http, up.url, {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
        path="/v1/chat/completions",
    )
    assert unknown.status == 404, unknown
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert unknown.json()["error"]["message"] == "The model `nope` does not exist."
    assert (await totals(http, fleet_a), await totals(http, fleet_b)) == (a0, b0)


async def test_live_weight_change_without_restart_or_failures(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    """(4) Edit the weights 100/0 → 0/100 under a steady request loop: the split changes, Envoy
    keeps its pid, no request fails. The delay is printed (bench/results/translate.md has figures)."""
    port = free_port()
    fleet_a = await sim_fleet(start_fleet, "127.0.5.1", port)
    fleet_b = await sim_fleet(start_fleet, "127.0.6.1", port)
    model = "meta-llama/Llama-3.1-8B-Instruct"
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pools.yaml").write_text(pool_yaml("pool-a", port) + "---" + pool_yaml("pool-b", port))
    (tmp_path / "pods.yaml").write_text(pods_yaml("pool-a", fleet_a) + "---" + pods_yaml("pool-b", fleet_b))

    def route(weight_a: int, weight_b: int) -> str:
        return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: split}}
spec:
  parentRefs: [{{name: gw}}]
  rules:
    - backendRefs: [{pool_ref("pool-a", weight_a)}, {pool_ref("pool-b", weight_b)}]
"""

    route_file = tmp_path / "route.yaml"
    route_file.write_text(route(100, 0))
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool-a", "pool-b"])
    assert up.envoy is not None
    pid = up.envoy.pid
    statuses: list[int] = []
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            results = await send_many(http, up.url, 4, model=model, concurrency=4)
            statuses.extend(s for s, _ in results)

    b_before = await totals(http, fleet_b)
    traffic = asyncio.create_task(loop())
    try:
        await asyncio.sleep(0.5)
        assert await totals(http, fleet_b) == b_before  # weight 0: nothing reaches pool-b
        route_file.write_text(route(0, 100))

        async def moved() -> bool:
            return await totals(http, fleet_b) > b_before

        await wait_until(moved, "requests reach pool-b after the edit", timeout_s=10.0, interval_s=0.01)
        a_after = await totals(http, fleet_a)
        await asyncio.sleep(0.5)
        assert await totals(http, fleet_a) - a_after <= 4  # only requests already in flight
    finally:
        stop.set()
        await traffic
    assert statuses
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    assert up.envoy.pid == pid


async def test_weighted_model_rewrite(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    """(7) ``m`` → m-v1 90 / m-v2 10. The replicas serve only m-v1 and m-v2 (they answer 404 for
    ``m``), so every 200 proves the body reached them rewritten; the proportion is counted by the
    picker's ``inference_objective_request_total{model_name, target_model_name}``, and the client
    sees the name it asked for."""
    port = free_port()
    fleet = await sim_fleet(start_fleet, "127.0.7.1", port, "--model", "m-v1", "--loras", "m-v2")
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    (tmp_path / "pool.yaml").write_text(pool_yaml("pool-a", port))
    (tmp_path / "pods.yaml").write_text(pods_yaml("pool-a", fleet))
    (tmp_path / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{pool_ref("pool-a")}]}}]
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {{name: canary}}
spec:
  poolRef: {{name: pool-a}}
  rules:
    - matches: [{{model: {{value: m}}}}]
      targets: [{{modelRewrite: m-v1, weight: 90}}, {{modelRewrite: m-v2, weight: 10}}]
""")
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool-a"])
    direct = await post_json(http, fleet.urls[0], {"model": "m", "prompt": "x", "max_tokens": 1})
    assert direct.status == 404  # the replicas do not know "m"
    results = await send_many(http, up.url, 600, model="m")
    assert {s for s, _ in results} == {200}, results[:2]
    assert all(re.search(r'"model":\s*"m"', text) for _, text in results)
    async with http.get(f"{up.admin_url}/metrics") as response:
        metrics = await response.text()

    def count(target: str) -> float:
        pattern = (
            r'inference_objective_request_total\{[^}]*model_name="m"[^}]*target_model_name="'
            + re.escape(target) + r'"[^}]*\} ([0-9.e+]+)'
        )
        return sum(float(v) for v in re.findall(pattern, metrics))

    v1, v2 = count("m-v1"), count("m-v2")
    assert v1 + v2 == 600, (v1, v2)
    assert abs(v2 / 600 - 0.10) <= 0.04, (v1, v2)
