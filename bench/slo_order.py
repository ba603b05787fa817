"""Requests' own TTFT objectives in a full pool: flow control's ``fcfs`` order against
``slo-deadline`` (``kvgate.io/queue-order``), one tenant.

``python -m kvgate.bench.slo_order [--replicas 2] [--max-num-seqs 16] [--load 1.3] [--interactive 0.25]
[--objective-ms 1500] [--duration 40] [--output FILE]``

The overload benchmark's fleet and traffic (``bench/overload.py``: simulated replicas, ``kvgate up``
with flow control and an in-flight limit of ``--max-num-seqs`` per replica, open-loop Poisson, unique
prompts, streamed), one tenant at ``--load`` × the pool's model-estimated capacity: a share
``--interactive`` of its requests state ``x-slo-ttft-ms: --objective-ms``, the rest none. Each order
runs the same plan on a fresh fleet. Reported per class: requests, served, timed out in the queue,
TTFT p50/p90, and the share of the interactive ones whose first token came within the objective
(what ``kvgate_request_slo_total`` counts, read from the picker too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from kvgate.bench.datapath.procs import cpu_share, cpu_snapshot, kvgate_command, start_child
from kvgate.bench.loadgen import RequestResult, run_open_loop
from kvgate.bench.overload import QUEUE_TIMEOUT_S, SIM_READY, UP_READY, envoy_of, estimate, manifests
from kvgate.bench.overload_plan import MODEL, TENANT_HEADER, percentile
from kvgate.bench.workloads import PlannedRequest, text_of
from kvgate.gateway.processes.envoy_process import free_port

ORDERS = ("fcfs", "slo-deadline")
SLO_HEADER = "x-slo-ttft-ms"


def plan(args: argparse.Namespace, capacity: float) -> tuple[list[PlannedRequest], set[int]]:
    """The requests, and which of them are interactive (state the objective)."""
    rng = random.Random(args.seed)
    rate = args.load * capacity
    requests: list[PlannedRequest] = []
    interactive: set[int] = set()
    t = rng.expovariate(rate)
    while t < args.duration:
        index = len(requests)
        output = rng.randint(max(1, args.output_tokens // 4), args.output_tokens * 7 // 4)
        body = json.dumps({"model": MODEL, "prompt": text_of(rng, args.prompt_tokens), "max_tokens": output,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()
        headers: tuple[tuple[str, str], ...] = ((TENANT_HEADER, "team"),)
        if rng.random() < args.interactive:
            interactive.add(index)
            headers = (*headers, (SLO_HEADER, f"{args.objective_ms:g}"))
        requests.append(PlannedRequest(index, t, "/v1/completions", body, MODEL, args.prompt_tokens,
                                       output, headers))
        t += rng.expovariate(rate)
    return requests, interactive


async def run_order(order: str, requests: list[PlannedRequest], args: argparse.Namespace,
                    workdir: Path) -> tuple[list[RequestResult], dict[str, float], dict[str, float]]:
    """One order on a fresh fleet: the results, each process's cores, the picker's SLO counts."""
    config = workdir / order
    sim_port = free_port()
    manifests(config, args, sim_port, flow_control=True)
    pool = config / "pool.yaml"
    pool.write_text(pool.read_text().replace("    kvgate.io/flow-control: \"true\"\n",
                                             f"    kvgate.io/flow-control: \"true\"\n"
                                             f"    kvgate.io/queue-order: {order}\n"))
    async with contextlib.AsyncExitStack() as stack:
        sim = await start_child("simulator", [
            sys.executable, "-m", "kvgate.simulator", "--replicas", str(args.replicas),
            "--port", str(sim_port), "--hosts-from", f"{args.sim_net}.1",
            "--time-scale", str(args.time_scale), "--max-num-seqs", str(args.max_num_seqs),
            "--stream-interval", str(args.stream_interval)], SIM_READY, config / "sim.log")
        stack.push_async_callback(sim.stop)
        port, admin = free_port(), free_port()
        up = await start_child("kvgate_up", [*kvgate_command(), "up", "-f", str(config), "--port", str(port),
                                             "--admin-port", str(admin)], UP_READY, config / "up.log")
        stack.push_async_callback(up.stop)
        await asyncio.sleep(1.0)  # a few scrapes
        pids = {"simulator": sim.pid, "kvgate up": up.pid, **envoy_of(up)}
        before, started = cpu_snapshot(pids), time.monotonic()
        url = f"http://127.0.0.1:{port}"
        results = await run_open_loop(url, requests, 1.0, timeout_s=args.client_timeout)
        cores = cpu_share(before, cpu_snapshot(pids), time.monotonic() - started)
        slo = await slo_counts(f"http://127.0.0.1:{admin}/metrics")
    return results, cores, slo


async def slo_counts(url: str) -> dict[str, float]:
    """``kvgate_request_slo_total`` by outcome (the TTFT objective's)."""
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        page = await response.text()
    counts: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("kvgate_request_slo_total{") and 'objective="ttft"' in line:
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = counts.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def rows(order: str, results: list[RequestResult], requests: list[PlannedRequest], interactive: set[int],
         args: argparse.Namespace) -> list[str]:
    window = args.duration / 6  # (the first sixth: the queue forming)
    at = {r.index: r.at_s for r in requests}
    out = []
    rest = {r.index for r in requests} - interactive
    for name, members in (("interactive", interactive), ("no objective", rest)):
        chosen = [r for r in results if r.index in members and at[r.index] >= window]
        served = [r for r in chosen if r.ok]
        ttfts = [r.ttft_s for r in served]
        timeouts = sum(1 for r in chosen if r.status == 503)
        met = "" if name != "interactive" else (
            f"{sum(1 for t in ttfts if t * 1000 <= args.objective_ms) / max(1, len(chosen)):.0%}")
        out.append(f"| {order} | {name} | {len(chosen)} | {len(served)} | {timeouts} | "
                   f"{percentile(ttfts, 0.5) * 1000:.0f} | {percentile(ttfts, 0.9) * 1000:.0f} | {met} |")
    return out


async def main_async(args: argparse.Namespace) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-slo-order-"))
    capacity = estimate(args)
    requests, interactive = plan(args, capacity)
    lines = ["# Requests' TTFT objectives in a full pool: `fcfs` against `slo-deadline`", "",
             f"`python -m kvgate.bench.slo_order {' '.join(sys.argv[1:])}`", "",
             f"Machine: {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} cores. "
             f"Fleet: {args.replicas} simulated replicas, max-num-seqs {args.max_num_seqs} (the in-flight "
             f"limit), time scale {args.time_scale:g}; prompts {args.prompt_tokens} tokens, output "
             f"{args.output_tokens // 4}-{args.output_tokens * 7 // 4}; one tenant at {args.load:g} × the "
             f"model-estimated capacity ({capacity:.1f} requests/s), {args.interactive:.0%} of its requests "
             f"stating `x-slo-ttft-ms: {args.objective_ms:g}`; queue timeout {QUEUE_TIMEOUT_S:g} s; "
             f"requests sent in the first sixth of each run left out. Within objective: the interactive "
             f"requests whose first token came within it, of all sent (timed out ones count as missed).", "",
             "| order | requests | sent | served | 503 timeout | TTFT p50 ms | p90 ms | within objective |",
             "|---|---|---|---|---|---|---|---|"]
    notes = []
    for order in ORDERS:
        results, cores, slo = await run_order(order, requests, args, workdir)
        lines += rows(order, results, requests, interactive, args)
        notes.append(f"- {order}: the picker counted TTFT objectives met {slo.get('met', 0):.0f}, missed "
                     f"{slo.get('missed', 0):.0f} (the whole run); cores " +
                     ", ".join(f"{k} {v:.2f}" for k, v in sorted(cores.items())))
        print(f"{order}: done", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return "\n".join([*lines, "", *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.slo_order",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--stream-interval", type=int, default=16)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--load", type=float, default=1.3, help="x the model-estimated capacity")
    parser.add_argument("--interactive", type=float, default=0.25, help="share stating the objective")
    parser.add_argument("--objective-ms", type=float, default=1500.0)
    parser.add_argument("--client-timeout", type=float, default=120.0)
    parser.add_argument("--sim-net", default="127.0.4")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    args.inflight_limit, args.reserved = 0, 0  # (manifests: the in-flight limit is max-num-seqs)
    text = asyncio.run(main_async(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
