"""vLLM's realtime transcription API (a WebSocket on ``/v1/realtime``) through ``kvgate up`` and real
Envoy to simulated replicas: the picker picks a replica on the upgrade's headers (the model in the
query, when named) and the session's frames pass without reaching it; what it refuses gets a JSON
error before any replica is asked."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_stats, post_json, wait_until
from tests.e2e.test_up_routing import (
    StartUp,
    gateway_yaml,
    pods_yaml,
    pool_ref,
    pool_yaml,
    sim_fleet,
    start_up,
    wait_ready,
)

pytestmark = pytest.mark.e2e
__all__ = ["start_up"]  # the fixture, imported for this module's tests

AUDIO = base64.b64encode(bytes(64_000)).decode()  # two seconds of 16 kHz PCM16


async def in_flight(http: aiohttp.ClientSession, admin_url: str) -> int:
    async with http.get(f"{admin_url}/debug/pools") as response:
        pools = (await response.json())["pools"]
    return sum(e["inflight_requests"] or 0 for pool in pools for e in pool["endpoints"])


async def test_a_realtime_session_through_kvgate_up(
    tmp_path: Path, start_up: StartUp, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    port = free_port()
    fleet = await sim_fleet(start_fleet, "127.0.6.41", port, "--model", "base")
    config = tmp_path / "config"
    config.mkdir()
    (config / "gateway.yaml").write_text(gateway_yaml())
    (config / "pool.yaml").write_text(pool_yaml("pool", port))
    (config / "pods.yaml").write_text(pods_yaml("pool", fleet))
    (config / "route.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{pool_ref("pool")}]}}]
""")
    up = await start_up(config)
    await wait_ready(http, up, ["pool"])
    async with http.ws_connect(f"{up.url}/v1/realtime?model=base") as socket:
        assert (await socket.receive_json(timeout=5))["type"] == "session.created"
        await socket.send_json({"type": "session.update", "model": "base"})
        await socket.send_json({"type": "input_audio_buffer.append", "audio": AUDIO})
        await socket.send_json({"type": "input_audio_buffer.commit"})
        events: list[dict[str, object]] = []
        while not events or events[-1]["type"] not in ("transcription.done", "error"):
            events.append(await socket.receive_json(timeout=10))
        assert [e["type"] for e in events] == ["transcription.delta"] * 6 + ["transcription.done"]

    async def ended() -> bool:
        return await in_flight(http, up.admin_url) == 0

    await wait_until(ended, "nothing left in flight", timeout_s=10.0)
    stats = await fleet_stats(http, fleet)
    assert sum(s["realtime_sessions"] for s in stats) == 1
    assert sum(s["realtime_transcriptions"] for s in stats) == 1

    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:  # (a model the pool does not
        await http.ws_connect(f"{up.url}/v1/chat/completions")  # serve: tests/extproc/test_upgrades.py)
    assert refused.value.status == 405
    async with http.get(f"{up.url}/v1/realtime") as response:  # (no upgrade asked)
        assert response.status == 400
        assert "WebSocket" in json.loads(await response.text())["error"]["message"]
    assert sum(s["realtime_sessions"] for s in await fleet_stats(http, fleet)) == 1
    for _ in range(12):  # sessions never count against their replica (none is ejected after them)
        async with http.ws_connect(f"{up.url}/v1/realtime") as socket:
            assert (await socket.receive_json(timeout=5))["type"] == "session.created"
    reply = await post_json(http, up.url, {"model": "base", "prompt": "hi", "max_tokens": 2})
    assert reply.status == 200, reply.text
