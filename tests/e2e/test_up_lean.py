"""``kvgate up --skip-unread-responses`` through real Envoy: requests whose response nothing reads
skip the response-headers round trip (a ``mode_override`` in the reply to the request headers,
which Envoy 1.40 honours), are served, and still end in the picker when Envoy closes the stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from gateway.processes.envoy_process import free_port
from gateway.up import KvgateUp, UpOptions
from tests.e2e.conftest import SimFleet
from tests.e2e.test_up_faults import _one, inflight_settles_at_zero, three_replicas_configured
from tests.e2e.test_up_routing import wait_ready

pytestmark = pytest.mark.e2e


def _sum(page: str, family: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(family))


@pytest.mark.parametrize("skip", [True, False], ids=["skipping", "reading"])
async def test_skipped_responses_are_served_and_end_in_the_picker(
    skip: bool, tmp_path: Path, start_fleet: Callable[..., Awaitable[SimFleet]], http: aiohttp.ClientSession,
) -> None:
    await three_replicas_configured(start_fleet, tmp_path, "127.0.4.41" if skip else "127.0.4.51")
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=0,
                            skip_unread_responses=skip))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        results = await asyncio.gather(*(_one(http, up.url, i) for i in range(40)))  # half streamed
        assert [r for r in results if r[0] != 200] == []
        assert await inflight_settles_at_zero(http, up)
        async with http.get(f"{up.admin_url}/metrics") as response:
            page = await response.text()
        assert _sum(page, "inference_objective_request_total") == 40
        # the first token of a non-streamed response is its headers: seen only when they come
        first_tokens = _sum(page, "inference_objective_request_ttft_seconds_count")
        assert first_tokens == (0 if skip else 20)
    finally:
        await up.stop()
