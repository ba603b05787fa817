"""A realtime session (vLLM's ``/v1/realtime`` WebSocket) through ``kvgate picker`` behind an Envoy
configured as the Inference Extension configures its gateways: full-duplex bodies and no
``mode_override``, so Envoy hands the session's frames to the picker, which passes each back as it
came (``extproc.lifecycle``'s TUNNEL state): the session works, as through ``kvgate up``."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import (
    MODEL,
    StartGateway,
    StartPicker,
    fleet_stats,
    start_gateway,
    start_picker,
)

__all__ = ["start_gateway", "start_picker"]  # fixtures by name

pytestmark = pytest.mark.e2e


async def test_a_realtime_session_through_a_full_duplex_gateway(
    start_fleet: Callable[..., Awaitable[SimFleet]], start_picker: StartPicker, start_gateway: StartGateway,
    http: aiohttp.ClientSession,
) -> None:
    fleet = await start_fleet(2, 0.1, ["--admin-port", "0"])
    picker = await start_picker([{"name": "llama", "endpoints": fleet.addresses}])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")])  # (full duplex, no override)
    async with http.ws_connect(f"{gateway}/v1/realtime") as socket:
        assert (await socket.receive_json(timeout=5))["type"] == "session.created"
        await socket.send_json({"type": "session.update", "model": MODEL})
        audio = base64.b64encode(bytes(32_000)).decode()  # one second
        await socket.send_json({"type": "input_audio_buffer.append", "audio": audio})
        await socket.send_json({"type": "input_audio_buffer.commit"})
        events: list[dict[str, object]] = []
        while not events or events[-1]["type"] not in ("transcription.done", "error"):
            events.append(await socket.receive_json(timeout=10))
        assert [e["type"] for e in events] == ["transcription.delta"] * 3 + ["transcription.done"]
    assert sum(s["realtime_transcriptions"] for s in await fleet_stats(http, fleet)) == 1
