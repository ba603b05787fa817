"""The benchmark's oracle: a tiny HTTP router that asks every simulated replica before each pick.

For each inference request it posts the body to every replica's ``POST /sim/peek`` (the simulator's
true prefix-cache match and running batch for exactly this request, no state change) and forwards
the request to the replica with the least estimated TTFT (random among equals), streaming the answer
back. The estimate is the simulator's step model over exact inputs: the uncached tokens of this
prompt there (from the peek), the prefill work queued ahead of it (the oracle's own requests still
before their first token: it is the only router, so this is the whole queue), the replica's
slowdown (calibrated at start from idle peeks) and, for adapters, whether one of its requests there
holds the adapter or a slot is free (``--max-loras``). The peek's own ``estimated_wait_s`` is not
used: it counts queued prompts before their cache hits, which makes a hot prefix's replica look
busy and scatters the prefix (one early trial, itself lag-invalid, gave a worse p90 than kvgate). Limits: no
KV-pressure or preemption term, LoRA residency inferred from its own traffic, peek round trips.

``oracle`` is greedy: each request takes its own least TTFT, whatever a spill costs later. With
``--miss-penalty-factor F`` (the ``oracle-spill`` contender, F = 1) leaving the best-cached replica
also pays ``F ×`` the prefill it gives up there, as kvgate's ``default`` does with estimated caches:
on long documents the greedy oracle spreads each document over the fleet and re-reads it everywhere
(bench/results/long-prompts.md), so it is no upper bound there; the spill-aware one is the same
cost model as kvgate's with the true cache contents.

Why a standalone router and not a kvgate profile: ``policies/`` plugins must not do IO and scoring
is synchronous, so a peek-based scorer would need an asynchronous peek cache in the picker process;
a standalone router gets fresh peeks per request at the cost of one extra Python hop (comparable to
Envoy + the picker's streamed response path).

Run: ``python -m kvgate.bench.oracle_router --port P --replicas http://127.0.0.1:8000 …``; prints
``kvgate-oracle ready http://127.0.0.1:P`` when serving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

STEP_S = 0.0057527  # docs/simulator.md (BLIS Llama-3.1-8B / H100)
PREFILL_S_PER_TOKEN = 17.25e-6
DECODE_S_PER_TOKEN = 6.0e-6
MAX_BATCHED_TOKENS = 8192
LORA_LOAD_S = 0.025
LORA_NO_SLOT_S = 1.0


@dataclass
class _Outstanding:
    uncached: int
    adapter: str | None
    prefilling: bool = True


@dataclass
class _ReplicaView:
    """What the oracle knows of one replica: its speed and the requests it sent there."""

    slowdown: float = 1.0
    outstanding: dict[int, _Outstanding] = field(default_factory=dict)

    def pending_prefill(self) -> int:
        return sum(o.uncached for o in self.outstanding.values() if o.prefilling)

    def adapters(self) -> set[str]:
        return {o.adapter for o in self.outstanding.values() if o.adapter is not None}


def estimate_ttft(
    view: _ReplicaView, uncached: int, running: int, adapter: str | None, max_loras: int
) -> float:
    """Simulated seconds to this request's first token: the simulator's step model over the exact
    prefill work queued ahead (the oracle's own outstanding requests, the only traffic) plus the
    uncached part of this prompt, slowed by the replica's slowdown, plus the adapter's cost."""
    work = view.pending_prefill() + max(uncached, 1)
    steps = 1 + -(-work // MAX_BATCHED_TOKENS)
    ttft = ((STEP_S + DECODE_S_PER_TOKEN * running) * steps + PREFILL_S_PER_TOKEN * work) * view.slowdown
    if adapter is not None:
        resident = view.adapters()
        if adapter not in resident:
            ttft += LORA_LOAD_S if len(resident) < max_loras else LORA_NO_SLOT_S
    return ttft


class OracleRouter:
    def __init__(self, replicas: Sequence[str], seed: int = 0, max_loras: int = 4,
                 miss_penalty_factor: float = 0.0) -> None:
        self.replicas = list(replicas)
        self.miss_penalty_s = miss_penalty_factor * PREFILL_S_PER_TOKEN
        self.views = [_ReplicaView() for _ in self.replicas]
        self.rng = random.Random(seed)
        self.max_loras = max_loras
        self.session: aiohttp.ClientSession | None = None
        self.picks = [0] * len(self.replicas)
        self._next_id = 0

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        await self.calibrate()

    async def calibrate(self) -> None:
        """Each replica's slowdown: an idle replica's estimated wait for a 1-token prompt, relative."""
        probe = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
        peeks = await asyncio.gather(*(self._peek(url, probe) for url in self.replicas))
        waits = [float(p["estimated_wait_s"]) if p else 1.0 for p in peeks]
        fastest = min(waits)
        for view, wait in zip(self.views, waits, strict=True):
            view.slowdown = wait / fastest if fastest > 0 else 1.0

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def _peek(self, url: str, body: bytes) -> dict[str, Any] | None:
        assert self.session is not None
        try:
            async with self.session.post(url + "/sim/peek", data=body,
                                         headers={"content-type": "application/json"}) as resp:
                if resp.status != 200:
                    return None
                data: dict[str, Any] = await resp.json()
                return data
        except (aiohttp.ClientError, ValueError):
            return None

    async def choose(self, body: bytes, adapter: str | None) -> tuple[int, int]:
        """(replica index, uncached tokens there) of the least estimated TTFT (random among equals)."""
        peeks = await asyncio.gather(*(self._peek(url, body) for url in self.replicas))
        estimates: list[float] = []
        uncached: list[int] = []
        for view, peek in zip(self.views, peeks, strict=True):
            if peek is None:
                estimates.append(float("inf"))
                uncached.append(0)
                continue
            missing = int(peek["prompt_tokens"]) - int(peek["cached_tokens"])
            uncached.append(missing)
            estimates.append(estimate_ttft(view, missing, int(peek["running"]), adapter, self.max_loras))
        if self.miss_penalty_s:
            reachable = [u for u, t in zip(uncached, estimates, strict=True) if t != float("inf")]
            least = min(reachable, default=0)
            penalty = self.miss_penalty_s
            estimates = [t + penalty * (u - least) for t, u in zip(estimates, uncached, strict=True)]
        best = min(estimates)
        ties = [i for i, t in enumerate(estimates) if t <= best * 1.0001 + 1e-9]
        index = self.rng.choice(ties)
        self.picks[index] += 1
        return index, uncached[index]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        body = await request.read()
        try:
            model = json.loads(body).get("model")
        except ValueError:
            model = None
        adapter = model if isinstance(model, str) and model.startswith("lora-") else None
        index, uncached = await self.choose(body, adapter)
        request_id = self._next_id
        self._next_id += 1
        view = self.views[index]
        view.outstanding[request_id] = entry = _Outstanding(uncached, adapter)
        target = self.replicas[index] + request.path
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        try:
            async with self.session.post(target, data=body, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=None)) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    "content-type": upstream.headers.get("content-type", "application/json")})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    entry.prefilling = False
                    await response.write(chunk)
                await response.write_eof()
                return response
        finally:
            view.outstanding.pop(request_id, None)

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"replicas": self.replicas, "picks": self.picks,
                                  "slowdown": [v.slowdown for v in self.views]})


async def _serve(
    port: int, replicas: Sequence[str], seed: int, max_loras: int, miss_penalty_factor: float
) -> None:
    router = OracleRouter(replicas, seed, max_loras, miss_penalty_factor)
    await router.start()
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/completions", router.handle)
    app.router.add_post("/v1/chat/completions", router.handle)
    app.router.add_get("/oracle/stats", router.stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"kvgate-oracle ready http://127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        print(json.dumps({"oracle_picks": router.picks}), flush=True)
        await runner.cleanup()
        await router.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.oracle_router", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--replicas", nargs="+", required=True, help="replica base URLs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-loras", type=int, default=4, help="the fleet's adapter slots per replica")
    parser.add_argument("--miss-penalty-factor", type=float, default=0.0,
                        help="leaving the best-cached replica also pays F x the prefill lost (0: greedy)")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.replicas, args.seed, args.max_loras, args.miss_penalty_factor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
