"""Open-loop streaming load generator: send planned requests on time, time every response.

Each request is sent at ``start + at_s × time_scale`` (real seconds) whatever happened to earlier ones
(open loop). Per request it records real times from the send: the first body bytes (TTFT: the
simulator writes the first token as the first body chunk, for chat together with the role chunk),
the end of the stream, the completion tokens from the final ``usage`` chunk, and whether the answer
was an error (HTTP status, or an SSE ``error`` event). Only the last chunk is parsed as JSON, to keep
the client's CPU cost per token low on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from kvgate.bench.workloads import PlannedRequest


@dataclass(frozen=True, slots=True)
class RequestResult:
    index: int
    status: int  # HTTP status; 0 when the connection failed
    error: str  # "" on success
    send_lag_s: float  # real seconds the send was late against the plan
    ttft_s: float  # real seconds; NaN without a first chunk
    e2e_s: float
    completion_tokens: int
    cached_tokens: int
    served_by: str = ""
    """The simulated replica that streamed the answer (its ``x-kvgate-sim-replica``), if it said."""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


def _usage_from_tail(tail: bytes) -> tuple[int, int, str]:
    """(completion_tokens, cached_tokens, error) from the stream's last bytes."""
    completion = cached = 0
    error = ""
    for line in tail.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        if b'"usage"' not in line and b'"error"' not in line:
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            continue
        if isinstance(event, dict):
            if "error" in event:
                error = str(event["error"])[:200]
            usage = event.get("usage")
            if isinstance(usage, dict):  # (OpenAI's names, or Anthropic's: its message_delta)
                completion = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict):
                    cached = int(details.get("cached_tokens") or 0)
    return completion, cached, error


async def _one(session: aiohttp.ClientSession, base_url: str, req: PlannedRequest, due: float,
               timeout_s: float) -> RequestResult:
    sent = time.perf_counter()
    lag = max(0.0, sent - due)
    ttft = float("nan")
    status = 0
    try:
        async with session.post(base_url + req.path, data=req.body,
                                headers={"content-type": "application/json", **dict(req.headers)},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            status = resp.status
            served_by = resp.headers.get("x-kvgate-sim-replica", "")
            if status != 200:
                text = (await resp.read())[:200].decode(errors="replace")
                return RequestResult(req.index, status, text or f"HTTP {status}", lag, ttft,
                                     time.perf_counter() - sent, 0, 0)
            tail = b""
            async for chunk in resp.content.iter_any():
                if ttft != ttft:
                    ttft = time.perf_counter() - sent
                tail = (tail + chunk)[-4096:]
            end = time.perf_counter() - sent
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return RequestResult(req.index, status, f"{type(exc).__name__}: {exc}"[:200], lag, ttft,
                             time.perf_counter() - sent, 0, 0)
    completion, cached, error = _usage_from_tail(tail)
    if not error and completion == 0:
        error = "no usage in the stream"
    return RequestResult(req.index, status, error, lag, ttft, end, completion, cached, served_by)


async def run_open_loop(base_url: str, requests: Sequence[PlannedRequest], time_scale: float,
                        timeout_s: float = 600.0,
                        direct: Mapping[int, str] | None = None) -> list[RequestResult]:
    """Send ``requests`` open-loop (times in simulated seconds × ``time_scale``); wait for all.
    ``direct``: plan index → a replica's URL the request goes to instead of ``base_url``."""
    direct = direct or {}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter() + 0.2
        tasks: list[asyncio.Task[RequestResult]] = []
        for req in requests:
            due = start + req.at_s * time_scale
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            url = direct.get(req.index, base_url)
            tasks.append(asyncio.create_task(_one(session, url, req, due, timeout_s)))
        return list(await asyncio.gather(*tasks))
