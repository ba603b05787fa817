"""The simulator's realtime transcription API (vLLM's ``/v1/realtime`` WebSocket) over loopback:
the session's events in vLLM's order and shapes, each transcription run through the engine, and the
errors that leave the session open."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp

from kvgate.simulator import tokenizer
from kvgate.simulator.audio_api import PCM_BYTES_PER_SECOND, TOKENS_PER_SECOND
from tests.simulator.conftest import MODEL, FleetFactory


def append(seconds: int) -> dict[str, Any]:
    audio = bytes(range(256)) * (seconds * PCM_BYTES_PER_SECOND // 256)
    return {"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()}


async def events_until(socket: aiohttp.ClientWebSocketResponse, last: str) -> list[dict[str, Any]]:
    events = []
    while True:
        event = await socket.receive_json(timeout=10)
        events.append(event)
        if event["type"] in (last, "error"):
            return events


async def test_a_session_transcribes_each_commit_through_the_engine(
        make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    async with http.ws_connect(fleet.urls[0] + "/v1/realtime") as socket:
        created = await socket.receive_json(timeout=5)
        assert created["type"] == "session.created"
        assert created["id"].startswith("sess-")
        await socket.send_json({"type": "session.update", "model": MODEL})
        for seconds in (2, 1):
            await socket.send_json(append(seconds))
            await socket.send_json({"type": "input_audio_buffer.commit"})
            events = await events_until(socket, "transcription.done")
            *deltas, done = events
            tokens = seconds * TOKENS_PER_SECOND
            assert [e["type"] for e in deltas] == ["transcription.delta"] * tokens
            assert done["text"] == "".join(e["delta"] for e in deltas) == "".join(
                tokenizer.output_text(i) for i in range(tokens))
            assert done["usage"]["completion_tokens"] == tokens
            assert done["usage"]["prompt_tokens"] > 0
    async with http.get(fleet.urls[0] + "/sim/stats") as response:
        stats = await response.json()
    assert (stats["realtime_sessions"], stats["realtime_transcriptions"]) == (1, 2)
    assert stats["request_success"] == 2  # (as any request the engine ran)


async def test_errors_are_events_and_the_session_stays_open(
        make_fleet: FleetFactory, http: aiohttp.ClientSession) -> None:
    fleet = await make_fleet()
    async with http.ws_connect(fleet.urls[0] + "/v1/realtime") as socket:
        await socket.receive_json(timeout=5)
        await socket.send_json({"type": "input_audio_buffer.commit"})
        assert (await socket.receive_json(timeout=5))["code"] == "model_not_validated"
        await socket.send_json({"type": "session.update", "model": "no-such-model"})
        assert (await socket.receive_json(timeout=5))["code"] == "model_not_found"
        await socket.send_str("{not json")
        assert (await socket.receive_json(timeout=5))["code"] == "invalid_json"
        await socket.send_json({"type": "response.create"})
        assert (await socket.receive_json(timeout=5))["code"] == "unknown_event"
        await socket.send_json({"type": "input_audio_buffer.append", "audio": "%%%"})
        assert (await socket.receive_json(timeout=5))["code"] == "invalid_audio"
        await socket.send_json({"type": "session.update", "model": MODEL})
        await socket.send_json(append(1))
        await socket.send_json({"type": "input_audio_buffer.commit"})
        assert (await events_until(socket, "transcription.done"))[-1]["type"] == "transcription.done"
