"""Issue 20: ``GET /v1/models`` answered by the gateway itself, through real Envoy and ``kvgate up``.

Two pools routed by ``X-Gateway-Model-Name`` (pool-a by a regular expression that lets its LoRA
adapter through, pool-b by an exact match), a third pool whose route arrives later, and a declared
model whose pool has no replica. The OpenAI SDK lists and retrieves models; unknown models answer
404 ``model_not_found`` on every path (retrieve, completion).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import openai
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json, wait_until
from tests.e2e.test_up_routing import StartUp, gateway_yaml, pods_yaml, pool_ref, pool_yaml, start_up

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests

StartFleet = Callable[..., Awaitable[SimFleet]]


def _route(name: str, rules: list[tuple[str, str, str]]) -> str:
    """An HTTPRoute whose rules match the model header: (match type, value, pool)."""
    lines = [
        "apiVersion: gateway.networking.k8s.io/v1", "kind: HTTPRoute", f"metadata: {{name: {name}}}",
        "spec:", "  parentRefs: [{name: gw}]", "  rules:",
    ]
    for kind, value, pool in rules:
        lines += [
            f"    - matches: [{{headers: [{{type: {kind}, name: X-Gateway-Model-Name, value: '{value}'}}]}}]",
            f"      backendRefs: [{pool_ref(pool)}]",
        ]
    return "\n".join(lines) + "\n"


async def _fleet(start_fleet: StartFleet, first_ip: str, model: str, *extra: str) -> SimFleet:
    return await start_fleet(
        replicas=1, time_scale=0.01,
        extra_args=["--port", str(free_port()), "--hosts-from", first_ip, "--admin-port", "0",
                    "--model", model, *extra],
    )


def _pool(name: str, fleet: SimFleet | None, port: int = 8000) -> str:
    if fleet is None:
        return pool_yaml(name, port)
    return pool_yaml(name, int(fleet.addresses[0].rpartition(":")[2])) + "---" + pods_yaml(name, fleet)


async def _ids(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, object]]:
    async with http.get(f"{url}/v1/models") as response:
        assert response.status == 200, await response.text()
        body = await response.json()
    assert body["object"] == "list"
    return {item["id"]: item for item in body["data"]}


async def test_the_gateway_lists_and_retrieves_the_models_its_routes_serve(
    tmp_path: Path, start_up: StartUp, start_fleet: StartFleet, http: aiohttp.ClientSession,
) -> None:
    fleet_a = await _fleet(start_fleet, "127.0.5.1", "model-a", "--loras", "sql-lora")
    fleet_b = await _fleet(start_fleet, "127.0.5.11", "model-b")
    fleet_c = await _fleet(start_fleet, "127.0.5.21", "model-c")
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    pools = [_pool("pool-a", fleet_a), _pool("pool-b", fleet_b), _pool("pool-c", fleet_c),
             _pool("pool-d", None)]
    (tmp_path / "pools.yaml").write_text("---".join(pools))
    (tmp_path / "route.yaml").write_text(_route("models", [
        ("RegularExpression", "model-a|sql-.*", "pool-a"),
        ("Exact", "model-b", "pool-b"),
        ("Exact", "model-d", "pool-d"),  # declared; its pool has no replica
    ]))
    up = await start_up(tmp_path)  # not ready in /readyz's sense: pool-d has no replica

    async def listed() -> bool:
        return {"model-a", "sql-lora", "model-b", "model-d"} <= set(await _ids(http, up.url))

    await wait_until(listed, "the models of both pools listed", timeout_s=10.0)
    models = await _ids(http, up.url)
    assert set(models) == {"model-a", "sql-lora", "model-b", "model-d"}
    # the adapter as the replica reports it (vLLM's fields), the declared model as the gateway's own
    assert models["sql-lora"]["parent"] == "model-a"
    assert models["sql-lora"]["root"] not in (None, "sql-lora")
    assert models["model-a"]["owned_by"] == "vllm"
    assert models["model-d"]["kvgate"] == {"ready": False, "pools": ["default/pool-d"]}
    assert models["model-b"]["kvgate"] == {"ready": True, "pools": ["default/pool-b"]}

    # The OpenAI SDK, as clients discover models.
    client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0)
    try:
        page = await client.models.list()
        assert {model.id for model in page.data} == set(models)
        assert (await client.models.retrieve("model-b")).id == "model-b"
        with pytest.raises(openai.NotFoundError) as missing:
            await client.models.retrieve("nope")
        assert missing.value.code == "model_not_found"
        # an id with a slash (Hugging Face names) is one id, not a path
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("meta-llama/nope")
    finally:
        await client.close()

    # An unknown model in a completion: the same 404, with OpenAI's code and vLLM's message.
    reply = await post_json(http, up.url, {"model": "nope", "prompt": "x"})
    assert reply.status == 404, reply
    assert reply.json()["error"]["code"] == "model_not_found"
    assert reply.json()["error"]["message"] == "The model `nope` does not exist."
    # Listing never reached the replicas' request path: they served no inference for it.
    for fleet in (fleet_a, fleet_b):
        assert [s["requests_received"] for s in await fleet_stats(http, fleet)] == [0]

    # A route change adds a third model: listed without a restart.
    (tmp_path / "route.yaml").write_text(_route("models", [
        ("RegularExpression", "model-a|sql-.*", "pool-a"),
        ("Exact", "model-b", "pool-b"),
        ("Exact", "model-c", "pool-c"),
    ]))

    async def third() -> bool:
        return "model-c" in await _ids(http, up.url)

    await wait_until(third, "model-c listed after the route change", timeout_s=10.0)
    assert "model-d" not in await _ids(http, up.url)  # its rule went away
    async with http.get(f"{up.url}/v1/models/model-c") as response:
        assert response.status == 200
        assert (await response.json())["id"] == "model-c"

