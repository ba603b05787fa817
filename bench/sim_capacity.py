"""How many requests/s one simulator process sustains across 8 replicas with event-loop lag p99 < 5 ms.

Run: ``python -m kvgate.bench.sim_capacity`` (options: ``--rates``, ``--step-s``, ``--time-scale``,
``--max-tokens``, ``--no-stream``). It starts ``python -m kvgate.simulator --replicas 8 --port 0
--admin-port 0`` as a subprocess, then this process (the load generator, aiohttp) offers open-loop
Poisson arrivals at each rate of a ladder for ``--step-s`` seconds, round-robin over the replicas, and
reads the simulator's own loop-lag percentiles (``GET /stats?window_s=…`` on the admin server: a task
inside the simulator measuring how late ``sleep(5 ms)`` wakes). The ladder stops at the first rate
whose lag p99 exceeds the limit or whose completions fall below 95 % of the offered requests.

Requests: completions of ~512 prompt tokens (one of 32 shared 256-token system prefixes + a unique
tail), ``--max-tokens`` output tokens, streamed by default (one SSE chunk per token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvgate.gateway.processes.child_process import ChildProcess

LAG_LIMIT_MS = 5.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class StepResult:
    rate: float
    offered: int = 0
    completed: int = 0
    errors: int = 0
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    lag: dict[str, float] = field(default_factory=dict)

    def ok(self) -> bool:
        return self.lag.get("p99_ms", 1e9) < LAG_LIMIT_MS and self.completed >= 0.95 * self.offered

    def row(self, step_s: float) -> str:
        def pct(values: list[float], q: float) -> float:
            return (
                sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")
            )

        return (
            f"| {self.rate:.0f} | {self.completed / step_s:.1f} | {self.errors} | "
            f"{self.lag.get('p50_ms', float('nan')):.2f} | {self.lag.get('p99_ms', float('nan')):.2f} | "
            f"{self.lag.get('max_ms', float('nan')):.1f} | {pct(self.ttft_s, 0.5):.1f} | "
            f"{pct(self.ttft_s, 0.99):.1f} | {statistics.fmean(self.e2e_s) if self.e2e_s else 0:.2f} | "
            f"{'yes' if self.ok() else 'no'} |"
        )


async def start_simulator(time_scale: float, loop: str) -> tuple[ChildProcess, list[str], str]:
    """Eight replicas on free ports; the process, the replica URLs and the fleet admin URL."""
    proc = ChildProcess([
        sys.executable, "-m", "kvgate.simulator", "--replicas", "8", "--port", "0", "--admin-port", "0",
        "--time-scale", str(time_scale), "--loop", loop,
    ], name="the simulator")
    await proc.start()
    try:
        ready = await proc.wait_for_line(r"kvgate-sim ready (.*)$", 60)
        admin = await proc.wait_for_line(r"kvgate-sim admin (\S+)$", 10)
    except BaseException:
        await proc.stop()
        raise
    return proc, ready.group(1).split(), admin.group(1)


async def one_request(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], result: StepResult
) -> None:
    start = time.perf_counter()
    try:
        async with session.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                result.errors += 1
                await response.read()
                return
            first = None
            async for _ in response.content.iter_any():
                if first is None:
                    first = time.perf_counter() - start
            result.ttft_s.append(first if first is not None else 0.0)
            result.e2e_s.append(time.perf_counter() - start)
            result.completed += 1
    except aiohttp.ClientError:
        result.errors += 1


async def run_step(
    session: aiohttp.ClientSession,
    urls: list[str],
    admin: str,
    rate: float,
    step_s: float,
    max_tokens: int,
    stream: bool,
    rng: random.Random,
) -> StepResult:
    result = StepResult(rate)
    prefixes = ["".join(rng.choice("abcdefghij ") for _ in range(1024)) for _ in range(32)]
    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    next_at = 0.0
    i = 0
    while True:
        next_at += rng.expovariate(rate)
        if next_at >= step_s:
            break
        delay = start + next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        prompt = rng.choice(prefixes) + f" request {i} " + "x" * 1000
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
        tasks.append(asyncio.create_task(one_request(session, urls[i % len(urls)], body, result)))
        result.offered += 1
        i += 1
    remaining = step_s - (time.perf_counter() - start)
    if remaining > 0:
        await asyncio.sleep(remaining)
    async with session.get(f"{admin}/stats", params={"window_s": str(step_s)}) as response:
        result.lag = (await response.json())["loop_lag"]
    await asyncio.wait(tasks, timeout=60)
    return result


async def run(args: argparse.Namespace) -> int:
    proc, urls, admin = await start_simulator(args.time_scale, args.loop)
    rng = random.Random(args.seed)
    results: list[StepResult] = []
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=120)
        ) as session:
            await asyncio.sleep(1.0)
            for rate in args.rates:
                result = await run_step(
                    session, urls, admin, rate, args.step_s, args.max_tokens, not args.no_stream, rng
                )
                results.append(result)
                print(
                    json.dumps(
                        {
                            "rate": rate,
                            "offered": result.offered,
                            "completed": result.completed,
                            "errors": result.errors,
                            "lag": result.lag,
                        }
                    ),
                    flush=True,
                )
                if not result.ok():
                    break
                await asyncio.sleep(1.0)
    finally:
        await proc.stop(30)
    best = max((r.rate for r in results if r.ok()), default=0.0)
    print()
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, Python {platform.python_version()}, "
        f"loop={args.loop}, time_scale={args.time_scale}, max_tokens={args.max_tokens}, "
        f"stream={not args.no_stream}, "
        f"step={args.step_s}s"
    )
    print(
        "| offered req/s | completed req/s | errors | lag p50 ms | lag p99 ms | lag max ms | TTFT p50 ms | "
        "TTFT p99 ms | mean e2e s | p99 lag < 5 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        print(result.row(args.step_s))
    print(f"\nsustained: {best:.0f} requests/s across 8 replicas with loop-lag p99 < {LAG_LIMIT_MS} ms")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.sim_capacity",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[25, 50, 100, 150, 200, 300, 400])
    parser.add_argument("--step-s", type=float, default=15.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--no-stream", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--loop", choices=("auto", "asyncio", "uvloop"), default="asyncio", help="the simulator's event loop"
    )
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
