"""``kvgate up`` stopping on a signal drains first (a rolling update must not cut LLM streams):
Envoy takes no new connection, ``/readyz`` answers 503, and the streams in flight run to their end
before anything stops."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e

TOKENS = 300


async def test_a_drain_lets_the_streams_in_flight_finish_and_takes_no_new_connection(
    http: aiohttp.ClientSession,
) -> None:
    up = KvgateUp(UpOptions(port=free_port(), admin_port=0, sim=1, sim_hosts_from="127.0.9.131",
                            sim_time_scale=1.0))  # (H100 step times: the stream lasts ~2 s)
    try:
        await up.start()
        await wait_ready(http, up, ["llama"])
        first_chunk = asyncio.Event()

        async def stream() -> tuple[list[str], float]:
            body = {"model": EXAMPLE_MODEL, "prompt": "tell a long story", "max_tokens": TOKENS,
                    "stream": True, "stream_options": {"include_usage": True}}
            lines = []
            async with aiohttp.ClientSession() as own, own.post(f"{up.url}/v1/completions",
                                                                json=body) as response:
                assert response.status == 200
                async for raw in response.content:
                    line = raw.decode().strip()
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        first_chunk.set()
            return lines, time.monotonic()

        streaming = asyncio.create_task(stream())
        await asyncio.wait_for(first_chunk.wait(), 10.0)
        started = time.monotonic()
        assert not streaming.done()
        draining = asyncio.create_task(up.drain(30.0))
        await asyncio.sleep(0.3)
        async with http.get(f"{up.admin_url}/readyz") as response:
            assert response.status == 503
            assert "draining" in await response.text()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
            with pytest.raises(aiohttp.ClientConnectorError):  # no new connection is taken
                await fresh.get(f"{up.url}/v1/models")
        assert not streaming.done()  # (still under way while the gateway drains)
        left = await draining  # 0: Envoy counted no request in flight, the stream's included
        drained_at = time.monotonic()
        lines, _ = await streaming
        assert left == 0
        assert lines[-1] == "[DONE]"
        usage = [json.loads(line)["usage"] for line in lines[:-1] if json.loads(line).get("usage")]
        assert usage[-1]["completion_tokens"] == TOKENS  # the whole stream, not cut
        assert drained_at - started < 25.0
    finally:
        await up.stop()
