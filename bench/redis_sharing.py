"""Prefix-hit rate of one picker vs two pickers without Redis vs two pickers sharing Redis (issue 6).

Real Envoy (its ext_proc cluster round-robins between the pickers), the simulator fleet, a real
``redis-server``. The workload: ``groups`` system prompts of ~2k tokens, ``per_group`` requests
each, interleaved, sent one at a time (after each response the pickers are given time to share
what they learned, as a steady stream of requests would). The fleet's prefix-cache hit rate
(``/sim/stats``: hit tokens / queried tokens) is measured per configuration on fresh prompts.

    python -m kvgate.bench.redis_sharing [--replicas 4] [--groups 6] [--per-group 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.bench.processes import ManagedProcess
from kvgate.gateway.controlplane.envoy_clusters import EXT_PROC_CLUSTER, PoolBackend
from kvgate.gateway.controlplane.envoy_config import ExtProcSettings, GatewayConfig, static_bootstrap
from kvgate.gateway.picker.pools_file import parse_pools
from kvgate.gateway.picker.redis_link import RedisSettings
from kvgate.gateway.picker.service import PickerService, PickerSettings
from kvgate.gateway.picker.workers import PrivateRedis
from kvgate.gateway.processes.envoy_process import EnvoyProcess, free_port

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta", "lambda", "zeta"]


def system_prompt(rng: random.Random, chars: int = 8000) -> str:
    text = ""
    while len(text) < chars:
        text += rng.choice(WORDS) + " "
    return text[:chars]


async def fleet_stats(http: aiohttp.ClientSession, admin_url: str) -> list[dict[str, Any]]:
    async with http.get(f"{admin_url}/stats") as response:
        replicas: list[dict[str, Any]] = (await response.json())["replicas"]
        return replicas


def hit_rate(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> float:
    hits = sum(b["prefix_cache_hits"] - a["prefix_cache_hits"] for a, b in zip(before, after, strict=True))
    pairs = list(zip(before, after, strict=True))
    queried = sum(b["prefix_cache_queries"] - a["prefix_cache_queries"] for a, b in pairs)
    return hits / queried if queried else 0.0


async def settle(pickers: Sequence[PickerService], timeout_s: float = 5.0) -> None:
    """Waits until every picker has applied every event the others shared (no-op without Redis).

    Counts events since the pickers started: their namespace in Redis must be fresh (no replay)."""
    syncs = [p.sharing.sync for p in pickers]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if any(s is None for s in syncs):
            return
        sent = [s.counters.events_sent for s in syncs if s is not None]
        received = [s.counters.events_received for s in syncs if s is not None]
        queued = sum(m.outbox_size for s in syncs if s is not None for m in s.mirrors.values())
        queued += sum(s.counters.events_writing for s in syncs if s is not None)  # taken, not yet sent
        if queued == 0 and all(r == sum(sent) - own for r, own in zip(received, sent, strict=True)):
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("pickers did not converge")


async def shared_prefix_workload(
    http: aiohttp.ClientSession,
    gateway: str,
    pickers: Sequence[PickerService],
    *,
    groups: int,
    per_group: int,
    seed: int,
) -> list[int]:
    """Sends the workload; returns the HTTP statuses."""
    rng = random.Random(seed)
    prompts = [system_prompt(rng) for _ in range(groups)]
    statuses: list[int] = []
    for i in range(groups * per_group):
        prompt = prompts[i % groups] + f"\nuser {i}: question {seed}-{i}?"
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
        async with http.post(f"{gateway}/v1/completions", json=body) as response:
            await response.read()
            statuses.append(response.status)
        await settle(pickers)
    return statuses


def gateway_bootstrap(pickers: Sequence[PickerService], pool: str) -> tuple[dict[str, Any], int]:
    port = free_port()
    config = GatewayConfig(
        listen_port=port,
        admin_port=free_port(),
        picker_addresses=tuple(("127.0.0.1", p.grpc_port) for p in pickers),
        pools=(PoolBackend(pool),),
        settings=ExtProcSettings(),
    )
    bootstrap = static_bootstrap(config)
    for cluster in bootstrap["static_resources"]["clusters"]:
        if cluster["name"] == EXT_PROC_CLUSTER:
            cluster["lb_policy"] = "ROUND_ROBIN"
    return bootstrap, port


async def measure(
    addresses: Sequence[str],
    admin_url: str,
    pickers_count: int,
    redis_url: str | None,
    args: argparse.Namespace,
    seed: int,
) -> dict[str, Any]:
    pools = parse_pools(json.dumps({"pools": [{"name": "llama", "endpoints": list(addresses)}]}))
    pickers: list[PickerService] = []
    envoy: EnvoyProcess | None = None
    try:
        for _ in range(pickers_count):
            redis = None
            if redis_url:
                redis = RedisSettings(  # a fresh namespace: no replay of an earlier run's prefixes
                    url=redis_url, key_prefix=f"bench{seed}", sync_interval_s=0.02, read_block_s=0.05
                )
            service = PickerService(PickerSettings(grpc_address="127.0.0.1:0", admin_port=0, redis=redis))
            service.apply_pools(pools.pools, pools.effective_default)
            await service.start()
            pickers.append(service)
        await asyncio.sleep(0.3)  # first scrapes
        bootstrap, port = gateway_bootstrap(pickers, "llama")
        envoy = EnvoyProcess(bootstrap)
        await envoy.start()
        async with aiohttp.ClientSession() as http:
            before = await fleet_stats(http, admin_url)
            url = f"http://127.0.0.1:{port}"
            statuses = await shared_prefix_workload(
                http, url, pickers, groups=args.groups, per_group=args.per_group, seed=seed
            )
            after = await fleet_stats(http, admin_url)
        return {"hit_rate": hit_rate(before, after), "errors": sum(1 for s in statuses if s != 200)}
    finally:
        if envoy is not None:
            await envoy.stop()
        for service in pickers:
            await service.stop()


async def run(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-redis-sharing-"))
    fleet = ManagedProcess("simulator", [
        sys.executable, "-m", "kvgate.simulator", "--replicas", str(args.replicas), "--port", "0",
        "--admin-port", "0", "--time-scale", "0.1",
    ], workdir / "sim.log")
    await fleet.start()
    redis = PrivateRedis(PrivateRedis.find())
    try:
        urls = (await fleet.wait_for_log(r"^kvgate-sim ready (.+)$")).group(1).split()
        addresses = [url.removeprefix("http://") for url in urls]
        admin = (await fleet.wait_for_log(r"^kvgate-sim admin (\S+)$")).group(1)
        await redis.start()
    except BaseException:
        await fleet.stop()
        raise
    results: dict[str, dict[str, Any]] = {}
    try:
        for seed in range(args.repeats):
            for name, count, url in (("one picker", 1, None), ("two pickers, no Redis", 2, None),
                                     ("two pickers, shared Redis", 2, redis.url)):
                # a fresh prompt set per configuration and repeat: caches start cold for it
                result = await measure(addresses, admin, count, url, args, seed=100 * seed + count
                                       + (1000 if url else 0))
                entry = results.setdefault(name, {"hit_rates": [], "errors": 0})
                entry["hit_rates"].append(result["hit_rate"])
                entry["errors"] += result["errors"]
    finally:
        await redis.stop()
        await fleet.stop()
    return results


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# Prefix-hit rate: pickers sharing state through Redis (issue 6, acceptance 1)",
        "",
        f"`python -m kvgate.bench.redis_sharing --replicas {args.replicas} --groups {args.groups} "
        f"--per-group {args.per_group} --repeats {args.repeats}`: real Envoy (ext_proc cluster round robin "
        "over the pickers), simulator fleet (time scale 0.1), real redis-server, profile `default`. "
        f"{args.groups} system prompts of ~2k tokens × {args.per_group} requests, interleaved, "
        "one at a time. "
        "Hit rate = prefix-cache hit tokens / queried prompt tokens, summed over the fleet (/sim/stats).",
        "",
        "| configuration | hit rate (mean) | per run | failed requests |",
        "|---|---|---|---|",
    ]
    for name, entry in results.items():
        rates = entry["hit_rates"]
        mean = sum(rates) / len(rates)
        runs = ", ".join(f"{100 * r:.1f}" for r in rates)
        lines.append(f"| {name} | {100 * mean:.1f} % | {runs} | {entry['errors']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate.bench.redis_sharing", description=__doc__)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--groups", type=int, default=5, help="odd, so each group alternates pickers")
    parser.add_argument("--per-group", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    text = report(results, args)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
