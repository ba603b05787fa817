"""``x-gateway-model-name-rewrite`` (llm-d's picker header) through ``kvgate up`` (real Envoy, a
simulated fleet serving ``m-v1`` alone): on a pool annotated ``kvgate.io/model-rewrite-header:
"true"`` a request naming ``auto`` (no replica knows it) with the header naming ``m-v1`` is served,
so its body reached the replica rewritten, and the client sees its own name; on a pool without the
annotation the header is refused, 400, and reaches no replica."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json
from tests.e2e.test_up_routing import (
    StartUp,
    gateway_yaml,
    pods_yaml,
    pool_ref,
    sim_fleet,
    start_up,
    wait_ready,
)

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests

HEADER = "x-gateway-model-name-rewrite"


def setup(directory: Path, port: int, fleet: SimFleet, *, honored: bool) -> None:
    annotations = '{kvgate.io/model-rewrite-header: "true"}' if honored else "{}"
    (directory / "gateway.yaml").write_text(gateway_yaml())
    (directory / "pool.yaml").write_text(f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: pool-a, annotations: {annotations}}}
spec:
  selector: {{matchLabels: {{app: pool-a}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
""")
    (directory / "pods.yaml").write_text(pods_yaml("pool-a", fleet))
    (directory / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{pool_ref("pool-a")}]}}]
""")


@pytest.mark.parametrize("honored", [True, False])
async def test_the_header_names_the_model_served_where_the_pool_takes_it(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession, honored: bool,
) -> None:
    port = free_port()
    fleet = await sim_fleet(start_fleet, "127.0.7.21" if honored else "127.0.7.31", port,
                            "--model", "m-v1")
    setup(tmp_path, port, fleet, honored=honored)
    up = await start_up(tmp_path)
    await wait_ready(http, up, ["pool-a"])
    body = {"model": "auto", "prompt": "x", "max_tokens": 2}
    direct = await post_json(http, fleet.urls[0], body)
    assert direct.status == 404  # the replicas do not know "auto"
    before = sum(s["requests_received"] for s in await fleet_stats(http, fleet))
    reply = await post_json(http, up.url, body, headers={HEADER: "m-v1"})
    if not honored:
        assert reply.status == 400, reply.text
        assert reply.json()["error"]["code"] == "bad_request"
        assert HEADER in reply.json()["error"]["message"]
        assert sum(s["requests_received"] for s in await fleet_stats(http, fleet)) == before
        return
    assert reply.status == 200, reply.text
    assert reply.json()["model"] == "auto"  # the client's own name
    unknown = await post_json(http, up.url, body, headers={HEADER: "no-such-model"})
    assert unknown.status == 404  # (the gateway's, or the replica's while the picker learns what they serve)
    plain = await post_json(http, up.url, {**body, "model": "m-v1"})
    assert plain.status == 200
    assert json.loads(plain.text)["model"] == "m-v1"
