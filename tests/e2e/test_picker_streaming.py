"""Issue 3 acceptance 7 over real Envoy + the real picker + the simulator: SSE streams through the
gateway chunk by chunk, not buffered to the end."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest

from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import (
    MODEL,
    JsonDict,
    StartGateway,
    StartPicker,
    start_gateway,
    start_picker,
)

__all__ = ["start_gateway", "start_picker"]  # fixtures used by name

pytestmark = pytest.mark.e2e

StartFleet = Callable[..., Awaitable[SimFleet]]
TOKENS = 300


@dataclass
class StreamTrace:
    started: float
    arrivals: list[float]
    """Monotonic time of each read that brought at least one ``data:`` event."""
    events: list[str]

    @property
    def payloads(self) -> list[JsonDict]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]


async def _stream(http: aiohttp.ClientSession, url: str, path: str, body: JsonDict) -> StreamTrace:
    started = time.monotonic()
    arrivals: list[float] = []
    events: list[str] = []
    buffer = b""
    timeout = aiohttp.ClientTimeout(total=30)
    async with http.post(f"{url}{path}", json=body, timeout=timeout) as response:
        assert response.status == 200, await response.text()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for chunk in response.content.iter_any():
            buffer += chunk
            *complete, buffer = buffer.split(b"\n\n")
            new = [e.decode().removeprefix("data: ") for e in complete if e.startswith(b"data: ")]
            if new:
                arrivals.append(time.monotonic())
                events.extend(new)
    return StreamTrace(started, arrivals, events)


def _assert_incremental(trace: StreamTrace) -> None:
    """The events came in many separate reads, as they were generated, not buffered into one body
    at the end (a buffered response arrives in one or two reads); no wall-clock bound is asserted."""
    assert trace.events[-1] == "[DONE]"
    assert len(trace.arrivals) >= 10, f"only {len(trace.arrivals)} separate arrivals"


async def test_sse_chunks_reach_the_client_while_the_reply_is_generated(
    start_fleet: StartFleet,
    start_picker: StartPicker,
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
) -> None:
    # 300 tokens at time-scale 0.3: ~0.5 s of generation in ~300 decode steps.
    fleet = await start_fleet(1, 0.3)
    picker = await start_picker([{"name": "llama", "endpoints": fleet.addresses}])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")])

    body = {"model": MODEL, "prompt": "tell a story", "max_tokens": TOKENS, "stream": True}
    completion = await _stream(http, gateway, "/v1/completions", body)
    _assert_incremental(completion)
    texts = [p["choices"][0]["text"] for p in completion.payloads if p.get("choices")]
    assert len("".join(texts)) == 4 * TOKENS  # the simulator writes 4 characters per token
    # The picker adds stream_options.include_usage for its own accounting; this client did not ask
    # for usage, so it must not see the usage chunk.
    assert not any(p.get("usage") for p in completion.payloads)

    chat = await _stream(http, gateway, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS,
        "stream": True, "stream_options": {"include_usage": True},
    })
    _assert_incremental(chat)
    usage = [p["usage"] for p in chat.payloads if p.get("usage")]
    assert usage
    assert usage[-1]["completion_tokens"] == TOKENS


async def test_a_draining_picker_lets_the_streams_it_holds_finish_and_takes_no_new_one(
    start_fleet: StartFleet,
    start_picker: StartPicker,
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
) -> None:
    # kvgate picker on SIGTERM (a rolling update): the gateway holds an ext_proc stream per request
    # open for its whole response; those end whole, and the next request is refused by this picker
    fleet = await start_fleet(1, 1.0)  # (H100 step times: ~2 s for 300 tokens)
    picker = await start_picker([{"name": "llama", "endpoints": fleet.addresses}])
    gateway = await start_gateway(picker.grpc_port, [PoolBackend("llama")])
    body = {"model": MODEL, "prompt": "tell a story", "max_tokens": TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}
    streaming = asyncio.create_task(_stream(http, gateway, "/v1/completions", body))
    await asyncio.sleep(0.5)  # the stream is under way
    assert not streaming.done()
    draining = asyncio.create_task(picker.drain(20.0))
    await asyncio.sleep(0.2)
    async with http.get(f"http://127.0.0.1:{picker.admin.port}/readyz") as response:
        assert response.status == 503
    async with http.post(f"{gateway}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2},
                         ) as refused:
        assert refused.status != 200
    await draining
    trace = await streaming
    assert trace.events[-1] == "[DONE]"
    usage = [p["usage"] for p in trace.payloads if p.get("usage")]
    assert usage[-1]["completion_tokens"] == TOKENS
