"""Scraping a large pool (issue 35): idle pickers in front of many endpoints, one alone or several
sharing their scrapes through Redis (each scrapes its share), their CPU and how fresh their views are.

``python -m kvgate.bench.scrape_scale [--endpoints 1000] [--pickers 1,4] [--upstreams 4]
[--seconds 10] [--output FILE]``

The endpoints are served by ``--upstreams`` processes of ``bench.datapath.upstream`` (the data
path benchmark's vLLM metrics page: cheap to serve, so the pickers are what is measured). For each
picker count N: N ``kvgate picker`` processes on one pools file (one pool of every endpoint) and,
for N > 1, one private ``redis-server`` they share (shared scrapes on, the default). After a settle,
over ``--seconds``: each picker's cores, the scrapes each made (its ``kvgate_endpoint_scrapes_total``),
CPU per scrape (all pickers' CPU over all scrapes, adopting others' batches included), and the age
of every view each picker holds, sampled from ``/debug/pools`` a few times (p50, p99, max).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import resource
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench.datapath.procs import Child, cpu_seconds, pools_yaml, start_picker, start_upstream
from kvgate.gateway.picker.workers import PrivateRedis

SETTLE_S = 3.0
SAMPLES = 8


@dataclass
class Run:
    pickers: int
    cores: list[float] = field(default_factory=list)
    scrapes: list[int] = field(default_factory=list)
    ages_ms: list[float] = field(default_factory=list)
    unscraped: int = 0
    """Views without metrics at a sample (never scraped nor adopted)."""
    upstream_cores: float = 0.0
    wall_s: float = 0.0

    @property
    def us_per_scrape(self) -> float:
        total = sum(self.scrapes)
        return sum(self.cores) * self.wall_s / total * 1e6 if total else float("nan")


async def scrape_count(http: aiohttp.ClientSession, admin: str) -> int:
    async with http.get(f"{admin}/metrics") as response:
        page = await response.text()
    total = 0.0
    for family in text_string_to_metric_families(page):
        if family.name == "kvgate_endpoint_scrapes":
            total += sum(s.value for s in family.samples
                         if s.name.endswith("_total") and s.labels.get("result") == "success")
    return int(total)


async def view_ages(http: aiohttp.ClientSession, admin: str) -> tuple[list[float], int]:
    async with http.get(f"{admin}/debug/pools") as response:
        report = await response.json()
    ages, missing = [], 0
    for pool in report["pools"]:
        for endpoint in pool["endpoints"]:
            age = endpoint.get("metrics_age_s")
            if age is None:
                missing += 1
            else:
                ages.append(age * 1000)
    return ages, missing


async def measure(count: int, pools: Path, upstreams: list[Child], seconds: float, workdir: Path) -> Run:
    run = Run(count)
    async with contextlib.AsyncExitStack() as stack:
        extra: list[str] = []
        if count > 1:
            redis = PrivateRedis(PrivateRedis.find())
            await redis.start()
            stack.push_async_callback(redis.stop)
            extra = ["--redis", redis.url]
        pickers: list[tuple[Child, str]] = []
        for index in range(count):
            log = workdir / f"picker-{index}.log"
            child, _, admin = await start_picker(f"picker-{index}", pools, log, extra)
            stack.push_async_callback(child.stop)
            pickers.append((child, admin))
        async with aiohttp.ClientSession() as http:
            await asyncio.sleep(SETTLE_S)
            counts = [await scrape_count(http, admin) for _, admin in pickers]
            cpu = [cpu_seconds(child.pid) for child, _ in pickers]
            upstream_cpu = sum(cpu_seconds(u.pid) for u in upstreams)
            started = time.monotonic()
            for _ in range(SAMPLES):
                await asyncio.sleep(seconds / SAMPLES)
                for _, admin in pickers:
                    ages, missing = await view_ages(http, admin)
                    run.ages_ms += ages
                    run.unscraped += missing
            run.wall_s = time.monotonic() - started
            run.cores = [(cpu_seconds(child.pid) - before) / run.wall_s
                         for (child, _), before in zip(pickers, cpu, strict=True)]
            run.upstream_cores = (sum(cpu_seconds(u.pid) for u in upstreams) - upstream_cpu) / run.wall_s
            run.scrapes = [await scrape_count(http, admin) - before
                           for (_, admin), before in zip(pickers, counts, strict=True)]
    return run


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(runs: list[Run], args: argparse.Namespace) -> str:
    lines = ["# Scraping a large pool: idle pickers, alone and sharing their scrapes", "",
             f"`python -m kvgate.bench.scrape_scale {' '.join(sys.argv[1:])}`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
             f"{args.endpoints} endpoints served by {args.upstreams} upstream processes; scrape interval "
             "50 ms (20 a second per endpoint); each picker's cores over "
             f"{args.seconds:g} s after a {SETTLE_S:g} s settle; view ages sampled {SAMPLES} times "
             "from each picker's /debug/pools.", "",
             "| pickers | cores per picker | all pickers' cores | scrapes/s (all) | µs CPU per scrape "
             "| view age p50 ms | p99 ms | max ms | views never scraped | upstream cores |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        lines.append(
            f"| {run.pickers} | {', '.join(f'{c:.2f}' for c in run.cores)} | {sum(run.cores):.2f} | "
            f"{sum(run.scrapes) / run.wall_s:,.0f} | {run.us_per_scrape:.0f} | "
            f"{quantile(run.ages_ms, 0.5):.0f} | {quantile(run.ages_ms, 0.99):.0f} | "
            f"{max(run.ages_ms, default=float('nan')):.0f} | {run.unscraped} | {run.upstream_cores:.2f} |")
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a connection per endpoint and picker
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    counts = [int(n) for n in args.pickers.split(",")]
    upstreams: list[Child] = []
    addresses: list[str] = []
    per = -(-args.endpoints // args.upstreams)
    try:
        for _ in range(args.upstreams):
            child, served = await start_upstream(min(per, args.endpoints - len(addresses)))
            upstreams.append(child)
            addresses += served
        with tempfile.TemporaryDirectory(prefix="kvgate-scrape-scale-") as tmp:
            pools = Path(tmp) / "pools.yaml"
            pools.write_text(pools_yaml(addresses, "big", "default"))
            runs = []
            for count in counts:
                run = await measure(count, pools, upstreams, args.seconds, Path(tmp))
                print(f"{count} picker(s): cores {sum(run.cores):.2f}, {run.us_per_scrape:.0f} us/scrape, "
                      f"age p99 {quantile(run.ages_ms, 0.99):.0f} ms", flush=True)
                runs.append(run)
    finally:
        for child in upstreams:
            await child.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return report(runs, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.scrape_scale",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--pickers", default="1,4", help="picker counts to run, comma-separated")
    parser.add_argument("--upstreams", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    text = asyncio.run(main_async(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
