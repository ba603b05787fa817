"""When the fleet is full: flow control on and off at 2x a simulated pool's capacity (issue 34).

``python -m kvgate.bench.overload [--replicas 2] [--max-num-seqs 16] [--time-scale 20] [--duration 60]
[--load 2.0] [--sheddable 0.2] [--output FILE]``

Each phase starts a fresh simulated fleet (``python -m kvgate.simulator``, ``--max-num-seqs`` per
replica, ``--time-scale``) and ``kvgate up -f DIR`` in front of it (the pool's Pods name the
replicas; its annotations turn flow control on: ``kvgate.io/flow-control``,
``kvgate.io/max-inflight-per-endpoint`` = ``--inflight-limit``, default the replicas'
``--max-num-seqs``, ``kvgate.io/queue-timeout``), then sends open-loop traffic
(``bench/overload_plan.py``):

1. **capacity**: the heavy tenant alone at 3x the model estimate, flow control on without the
   in-flight limit (the replicas always have a short queue of their own; the rest waits and times
   out in the picker, so no backlog outlives the run); the pool's capacity is the completions per
   second in the run's last 60 %.
2. **unloaded**: the light tenants alone at 0.2x capacity (their TTFT p90 is the reference).
3. **queue off** (today's behaviour) and 4. **queue on**: the three tenants at ``--load`` x capacity
   for ``--duration`` s, and the sheddable band.

The report (Markdown, ``--output``) gives per stream: requests sent in the window (after the first
sixth of the run), served, shed (429), timed out (503 after the queue timeout), other failures,
TTFT percentiles, served GPU work against the max-min fair share, and each process's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvgate.bench.datapath.procs import Child, cpu_share, cpu_snapshot, kvgate_command, start_child
from kvgate.bench.loadgen import RequestResult, run_open_loop
from kvgate.bench.overload_plan import (
    Stream,
    StreamStats,
    account,
    max_min_shares,
    percentile,
    plan,
    streams,
)
from kvgate.bench.workloads import PlannedRequest
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up_options import bundled_example

SIM_READY = "kvgate-sim ready"
UP_READY = "kvgate ready:"
QUEUE_TIMEOUT_S = 20.0
WARMUP_SHARE = 1 / 6


@dataclass
class Phase:
    name: str
    flow_control: bool
    streams: tuple[Stream, ...]
    duration_s: float
    limit: bool = True
    """With flow control: the in-flight limit per replica (False: the thresholds alone)."""
    waits: dict[str, float] | None = None
    """Tenant → p90 of its dispatched requests' waits in the picker (from its histogram)."""
    stats: dict[str, StreamStats] | None = None
    cores: dict[str, float] | None = None
    throughput: float = 0.0


def manifests(directory: Path, args: argparse.Namespace, sim_port: int, flow_control: bool,
              limit: bool = True) -> None:
    """The bundled example, its pool's Pods the simulated replicas, flow control as asked (``limit``
    False: without the in-flight limit, the replicas' own queues kept short by the thresholds)."""
    shutil.copytree(bundled_example(), directory)
    pool = directory / "pool.yaml"
    text = pool.read_text().replace("    - number: 8000", f"    - number: {sim_port}")
    if flow_control:
        inflight = args.inflight_limit or args.max_num_seqs
        text = text.replace("    kvgate.io/engine: vllm\n", (
            "    kvgate.io/engine: vllm\n    kvgate.io/flow-control: \"true\"\n"
            + (f"    kvgate.io/max-inflight-per-endpoint: \"{inflight}\"\n" if limit else "")
            + (f"    kvgate.io/reserved-inflight-per-endpoint: \"{args.reserved}\"\n"
               if limit and args.reserved else "")
            + f"    kvgate.io/queue-timeout: {QUEUE_TIMEOUT_S:g}s\n"))
    pods = "".join(
        f"---\napiVersion: v1\nkind: Pod\nmetadata: {{name: sim-{i}, namespace: default, labels: "
        f"{{app: vllm-llama}}}}\nstatus: {{podIP: {args.sim_net}.{i + 1}}}\n" for i in range(args.replicas))
    pool.write_text(text + pods)


async def run_phase(phase: Phase, capacity: float, args: argparse.Namespace,
                    workdir: Path) -> list[RequestResult]:
    config = workdir / phase.name.replace(" ", "-")
    sim_port = free_port()
    manifests(config, args, sim_port, phase.flow_control, phase.limit)
    async with contextlib.AsyncExitStack() as stack:
        sim = await start_child("simulator", [
            sys.executable, "-m", "kvgate.simulator", "--replicas", str(args.replicas),
            "--port", str(sim_port), "--hosts-from", f"{args.sim_net}.1",
            "--time-scale", str(args.time_scale), "--max-num-seqs", str(args.max_num_seqs),
            "--stream-interval", str(args.stream_interval)], SIM_READY, config / "sim.log")
        stack.push_async_callback(sim.stop)
        port, admin = free_port(), free_port()
        up = await start_child("kvgate_up", [*kvgate_command(), "up", "-f", str(config), "--port", str(port),
                                             "--admin-port", str(admin), "--workers", str(args.workers)],
                               UP_READY, config / "up.log")
        stack.push_async_callback(up.stop)
        await asyncio.sleep(1.0)  # a few scrapes
        requests, owner = plan(phase.streams, capacity, phase.duration_s, args.prompt_tokens,
                               args.output_tokens, args.seed)
        pids = {"simulator": sim.pid, "kvgate up": up.pid, **envoy_of(up)}
        before, started = cpu_snapshot(pids), time.monotonic()
        results = await run_open_loop(f"http://127.0.0.1:{port}", requests, 1.0,
                                      timeout_s=args.client_timeout)
        wall = time.monotonic() - started
        phase.cores = cpu_share(before, cpu_snapshot(pids), wall)
        window = (phase.duration_s * WARMUP_SHARE, phase.duration_s)
        phase.stats = account(results, requests, owner, window, QUEUE_TIMEOUT_S)
        # finished within the run's last 60 %: by then the first requests (seconds long at this
        # time scale) have ended and the replicas are as full as the traffic makes them
        phase.throughput = completions_per_s(results, requests, (phase.duration_s * 0.4, phase.duration_s))
        phase.waits = await picker_waits(f"http://127.0.0.1:{admin}/metrics")
    return results


async def picker_waits(url: str) -> dict[str, float]:
    """Each tenant's p90 wait in the picker before dispatch, from kvgate's histogram
    (``inference_extension_flow_control_request_queue_duration_seconds``, outcome Dispatched): the
    upper bound of the bucket holding the 90th percentile."""
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        page = await response.text()
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if (sample.name == "inference_extension_flow_control_request_queue_duration_seconds_bucket"
                    and sample.labels.get("outcome") == "Dispatched"):
                buckets.setdefault(sample.labels["fairness_id"], []).append(
                    (float(sample.labels["le"]), sample.value))
    waits = {}
    for tenant, counts in buckets.items():
        counts.sort()
        total = counts[-1][1]
        waits[tenant] = next((le for le, count in counts if total and count >= 0.9 * total), math.nan)
    return waits


def envoy_of(up: Child) -> dict[str, int]:
    from kvgate.bench.datapath.up import child_pids

    return {k: v for k, v in child_pids(up.pid).items() if k == "envoy"}


def completions_per_s(results: Sequence[RequestResult], requests: Sequence[PlannedRequest],
                      window: tuple[float, float]) -> float:
    """Successful requests finished per second within ``window`` (real seconds from the start)."""
    at = {r.index: r.at_s for r in requests}
    done = sum(1 for r in results if r.ok and window[0] <= at[r.index] + r.send_lag_s + r.e2e_s < window[1])
    return done / (window[1] - window[0])


def estimate(args: argparse.Namespace) -> float:
    """Requests/s (real) the pool can serve by the BLIS model at a full batch (a first guess): per
    request a replica's steps spend its prefill, and per output token 6 µs plus a share of the
    step's base at a batch of ``--max-num-seqs``."""
    busy = args.prompt_tokens * 17.25e-6 + args.output_tokens * (6e-6 + 0.0057527 / args.max_num_seqs)
    return float(args.replicas / busy / args.time_scale)


def wait_text(seconds: float | None) -> str:
    return "" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:.0f}"


def plot(phases: list[Phase], path: Path) -> None:
    """Each stream's TTFT p90 (log scale) and served / fair share, queue off beside queue on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unloaded = phases[1].stats or {}
    reference = percentile([t for n in ("light-a", "light-b") for t in (unloaded[n].ttft_s or [])], 0.9)
    names = ["heavy", "light-a", "light-b"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.38
    for offset, phase in ((-width / 2, phases[2]), (width / 2, phases[3])):
        stats = phase.stats or {}
        p90 = [percentile(stats[n].ttft_s or [], 0.9) for n in names]
        left.bar([i + offset for i in range(len(names))], p90, width, label=phase.name)
        tenants = {n: stats[n] for n in names}
        fair = max_min_shares(sum(s.served_work for s in tenants.values()),
                              {n: s.offered_work for n, s in tenants.items()})
        right.bar([i + offset for i in range(len(names))], [tenants[n].served_work / fair[n] for n in names],
                  width, label=phase.name)
    left.axhline(reference, color="gray", linestyle="--", label="light tenants unloaded")
    left.axhline(2 * reference, color="gray", linestyle=":", label="2x unloaded")
    left.set_yscale("log")
    left.set_ylabel("TTFT p90 (s)")
    right.axhline(1.0, color="gray", linestyle="--")
    right.set_ylabel("served GPU work / max-min fair share")
    for axis in (left, right):
        axis.set_xticks(range(len(names)), names)
        axis.legend(fontsize=7)
    figure.suptitle("2x capacity, three tenants (8:1:1) and a sheddable band")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(phases: list[Phase], capacity: float, args: argparse.Namespace) -> str:
    unloaded = phases[1].stats or {}
    reference = percentile([t for name in ("light-a", "light-b") for t in (unloaded[name].ttft_s or [])], 0.9)
    lines = ["# When the fleet is full: flow control at 2x capacity", "",
             f"`python -m kvgate.bench.overload {' '.join(sys.argv[1:])}`", "",
             f"Machine: {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} cores. "
             f"Fleet: {args.replicas} simulated replicas, max-num-seqs "
             f"{args.max_num_seqs}, time scale {args.time_scale:g} (every simulated time x it); prompts "
             f"{args.prompt_tokens} tokens (unique), output "
             f"{args.output_tokens // 4}-{args.output_tokens * 7 // 4} tokens (uniform), streamed "
             f"{args.stream_interval} tokens a chunk. `kvgate up --workers {args.workers}`.", "",
             f"Capacity (phase 1, heavy tenant alone at 3x): **{capacity:.1f} requests/s** "
             f"(model estimate {estimate(args):.1f}). Light tenants' unloaded TTFT p90 (phase 2, 0.2x): "
             f"**{reference * 1000:.0f} ms**. Queue timeout {QUEUE_TIMEOUT_S:g} s; in-flight limit "
             f"{args.inflight_limit or args.max_num_seqs} per replica ({args.reserved} more reserved for "
             f"tenants with nothing waiting). Window: requests sent after the "
             f"first {WARMUP_SHARE:.0%} of each run.", ""]
    if args.output is not None:
        image = args.output.with_suffix(".png").name
        lines += [f"![TTFT p90 and served work against fair shares]({image})", ""]
    for phase in phases[2:]:
        stats = phase.stats or {}
        tenants = {name: s for name, s in stats.items() if name != "batch"}
        fair = max_min_shares(sum(s.served_work for s in tenants.values()),
                              {name: s.offered_work for name, s in tenants.items()})
        lines += [f"## {phase.name}", "",
                  f"Served {phase.throughput:.1f} requests/s. Cores: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in sorted((phase.cores or {}).items())), "",
                  "| stream | sent | served | 429 | 503 timeout | other failures | failed before timeout "
                  "| TTFT p50 ms | p90 ms | p90 / unloaded | picker wait p90 ≤ ms | served work s "
                  "| fair share s | served / fair |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name in [s.name for s in phase.streams]:
            s = stats.get(name, StreamStats(ttft_s=[]))
            p50, p90 = percentile(s.ttft_s or [], 0.5), percentile(s.ttft_s or [], 0.9)
            share = fair.get(name)
            lines.append(
                f"| {name} | {s.sent} | {s.ok} | {s.shed_429} | {s.timeout_503} | {s.other_failures} | "
                f"{s.early_failures} | {p50 * 1000:.0f} | {p90 * 1000:.0f} | {p90 / reference:.2f} | "
                f"{wait_text((phase.waits or {}).get(name))} | {s.served_work:.2f} | "
                f"{'' if share is None else f'{share:.2f}'} | "
                f"{'' if not share else f'{s.served_work / share:.2f}'} |")
        lines.append("")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-overload-"))
    guess = estimate(args)
    calibration = Phase("capacity", True, (Stream("heavy", 3.0),), args.reference_s, limit=False)
    await run_phase(calibration, guess, args, workdir)
    capacity = calibration.throughput
    print(f"capacity {capacity:.1f} requests/s (estimate {guess:.1f})", flush=True)
    unloaded = Phase("unloaded", False, (Stream("light-a", 0.1), Stream("light-b", 0.1)), args.reference_s)
    await run_phase(unloaded, capacity, args, workdir)
    phases = [calibration, unloaded]
    for flow_control in (False, True):
        name = "queue on (flow control)" if flow_control else "queue off (today's behaviour)"
        phase = Phase(name, flow_control, streams(args.load, args.sheddable), args.duration)
        await run_phase(phase, capacity, args, workdir)
        phases.append(phase)
        print(f"{name}: served {phase.throughput:.1f} requests/s", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    if args.output is not None:
        plot(phases, args.output.with_suffix(".png"))
    return report(phases, capacity, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.overload",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--inflight-limit", type=int, default=0, help="per replica (0: --max-num-seqs)")
    parser.add_argument("--workers", type=int, default=1,
                        help="kvgate up --workers: picker processes, each holding its own requests "
                        "(the picker-wait column then reads one of them)")
    parser.add_argument("--reserved", type=int, default=0,
                        help="slots per replica beyond the limit for tenants with nothing waiting")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--stream-interval", type=int, default=16,
                        help="tokens per streamed chunk after the first (CPU on 2 cores)")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--load", type=float, default=2.0, help="the three tenants together, x capacity")
    parser.add_argument("--sheddable", type=float, default=0.2, help="the sheddable band, x capacity")
    parser.add_argument("--reference-s", type=float, default=45.0,
                        help="length of the capacity and unloaded phases")
    parser.add_argument("--client-timeout", type=float, default=300.0)
    parser.add_argument("--sim-net", default="127.0.4", help="the replicas' addresses: NET.1, NET.2, ...")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    text = asyncio.run(main_async(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
