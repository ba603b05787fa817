"""Fairness across pickers (issue 34): two kvgate gateways in front of one full pool, sharing state
through Redis, with the tenants' traffic split unevenly between them.

``python -m kvgate.bench.overload_gateways [--replicas 2] [--max-num-seqs 128] [--time-scale 20]
[--duration 60] [--load 2.0] [--output FILE]``

Each pair of gateways is two ``kvgate up -f DIR --redis URL`` (each its own Envoy and picker) on one
simulated fleet and one ``redis-server``; the pool has flow control with the in-flight limit of
``bench/overload.py``. The heavy tenant's requests alternate between the two gateways; the light
tenants send to the first only. So the first picker alone sees the light tenants, and each picker
alone sees half the heavy tenant: a picker fair among its own requests gives the light tenants a
third of its half of the pool (less than they ask) while the second gives the heavy tenant all of
its half.

Phases: **capacity** and **unloaded** as ``bench/overload.py`` (one gateway); then the three
tenants (8:1:1) at ``--load`` x capacity for ``--duration`` s through the pair, with each tenant's
work **not shared** (``--no-shared-fairness``) and **shared** (the default). The report gives per
tenant what ``bench/overload.py`` gives, and which gateway served what.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from kvgate.bench.datapath.procs import cpu_share, cpu_snapshot, kvgate_command, start_child
from kvgate.bench.loadgen import RequestResult, run_open_loop
from kvgate.bench.overload import (
    QUEUE_TIMEOUT_S,
    SIM_READY,
    UP_READY,
    WARMUP_SHARE,
    Phase,
    completions_per_s,
    envoy_of,
    estimate,
    manifests,
    run_phase,
)
from kvgate.bench.overload_plan import (
    Stream,
    StreamStats,
    account,
    max_min_shares,
    percentile,
    plan,
    streams,
)
from kvgate.gateway.picker.workers import PrivateRedis
from kvgate.gateway.processes.envoy_process import free_port


async def run_pair(phase: Phase, capacity: float, args: argparse.Namespace, workdir: Path,
                   shared: bool) -> list[RequestResult]:
    """``phase`` through two gateways sharing one Redis (``shared``: their tenants' work too)."""
    config = workdir / phase.name.replace(" ", "-")
    sim_port = free_port()
    manifests(config, args, sim_port, flow_control=True)
    async with contextlib.AsyncExitStack() as stack:
        redis = PrivateRedis(PrivateRedis.find())
        await redis.start()
        stack.push_async_callback(redis.stop)
        sim = await start_child("simulator", [
            sys.executable, "-m", "kvgate.simulator", "--replicas", str(args.replicas),
            "--port", str(sim_port), "--hosts-from", f"{args.sim_net}.1",
            "--time-scale", str(args.time_scale), "--max-num-seqs", str(args.max_num_seqs),
            "--stream-interval", str(args.stream_interval)], SIM_READY, config / "sim.log")
        stack.push_async_callback(sim.stop)
        ports, pids = [], {"simulator": sim.pid}
        for name in ("gateway-1", "gateway-2"):
            port, admin = free_port(), free_port()
            up = await start_child(name, [
                *kvgate_command(), "up", "-f", str(config), "--port", str(port), "--admin-port", str(admin),
                "--redis", redis.url, *(() if shared else ("--no-shared-fairness",))],
                UP_READY, config / f"{name}.log")
            stack.push_async_callback(up.stop)
            ports.append(port)
            pids[name] = up.pid
            pids.update({f"envoy ({name})": pid for pid in envoy_of(up).values()})
        await asyncio.sleep(1.0)  # a few scrapes and sync rounds
        requests, owner = plan(phase.streams, capacity, phase.duration_s, args.prompt_tokens,
                               args.output_tokens, args.seed)
        second = f"http://127.0.0.1:{ports[1]}"
        heavy = [r.index for r in requests if owner[r.index] == "heavy"]
        direct = dict.fromkeys(heavy[1::2], second)
        before, started = cpu_snapshot(pids), time.monotonic()
        results = await run_open_loop(f"http://127.0.0.1:{ports[0]}", requests, 1.0,
                                      timeout_s=args.client_timeout, direct=direct)
        wall = time.monotonic() - started
        phase.cores = cpu_share(before, cpu_snapshot(pids), wall)
        window = (phase.duration_s * WARMUP_SHARE, phase.duration_s)
        phase.stats = account(results, requests, owner, window, QUEUE_TIMEOUT_S)
        phase.throughput = completions_per_s(results, requests, (phase.duration_s * 0.4, phase.duration_s))
    return results


def plot(phases: list[Phase], path: Path) -> None:
    """Each tenant's TTFT p90 (log scale), fairness not shared beside shared."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unloaded = phases[1].stats or {}
    reference = percentile([t for n in ("light-a", "light-b") for t in (unloaded[n].ttft_s or [])], 0.9)
    names = ["heavy", "light-a", "light-b"]
    figure, axis = plt.subplots(figsize=(6, 4))
    width = 0.38
    for offset, phase in ((-width / 2, phases[2]), (width / 2, phases[3])):
        stats = phase.stats or {}
        axis.bar([i + offset for i in range(len(names))],
                 [percentile(stats[n].ttft_s or [], 0.9) for n in names], width, label=phase.name)
    axis.axhline(reference, color="gray", linestyle="--", label="light tenants unloaded")
    axis.set_yscale("log")
    axis.set_ylabel("TTFT p90 (s)")
    axis.set_xticks(range(len(names)), names)
    axis.legend(fontsize=7)
    axis.set_title("two gateways, one pool at 2x: heavy on both, light on the first")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(phases: list[Phase], capacity: float, args: argparse.Namespace) -> str:
    unloaded = phases[1].stats or {}
    reference = percentile([t for name in ("light-a", "light-b") for t in (unloaded[name].ttft_s or [])], 0.9)
    lines = ["# Fairness across pickers: two gateways, one full pool", "",
             f"`python -m kvgate.bench.overload_gateways {' '.join(sys.argv[1:])}`", "",
             f"Machine: {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} cores. "
             f"Fleet: {args.replicas} simulated replicas, max-num-seqs {args.max_num_seqs}, time scale "
             f"{args.time_scale:g}; prompts {args.prompt_tokens} tokens (unique), output "
             f"{args.output_tokens // 4}-{args.output_tokens * 7 // 4} tokens. Two `kvgate up --redis URL` "
             "on one redis-server: the heavy tenant's requests alternate between them, the light "
             "tenants' go to the first only.", "",
             f"Capacity (one gateway, heavy alone at 3x): **{capacity:.1f} requests/s** (model estimate "
             f"{estimate(args):.1f}). Light tenants' unloaded TTFT p90: **{reference * 1000:.0f} ms**. "
             f"Load {args.load:g}x capacity (8:1:1) for {args.duration:g} s; queue timeout "
             f"{QUEUE_TIMEOUT_S:g} s; in-flight limit {args.inflight_limit or args.max_num_seqs} per "
             f"replica (both pickers' requests counted). Window: requests sent after the first "
             f"{WARMUP_SHARE:.0%} of each run."
             + (f" {args.reserved} more slots per replica reserved for tenants with nothing waiting."
                if args.reserved else ""), ""]
    if args.output is not None:
        lines += [f"![TTFT p90 per tenant]({args.output.with_suffix('.png').name})", ""]
    for phase in phases[2:]:
        stats = phase.stats or {}
        fair = max_min_shares(sum(s.served_work for s in stats.values()),
                              {name: s.offered_work for name, s in stats.items()})
        lines += [f"## {phase.name}", "",
                  f"Served {phase.throughput:.1f} requests/s. Cores: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in sorted((phase.cores or {}).items())), "",
                  "| tenant | sent | served | 429 | 503 timeout | other failures | TTFT p50 ms | p90 ms "
                  "| p90 / unloaded | served work s | fair share s | served / fair |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name in [s.name for s in phase.streams]:
            s = stats.get(name, StreamStats(ttft_s=[]))
            p50, p90 = percentile(s.ttft_s or [], 0.5), percentile(s.ttft_s or [], 0.9)
            share = fair.get(name)
            lines.append(
                f"| {name} | {s.sent} | {s.ok} | {s.shed_429} | {s.timeout_503} | {s.other_failures} | "
                f"{p50 * 1000:.0f} | {p90 * 1000:.0f} | {p90 / reference:.2f} | {s.served_work:.2f} | "
                f"{'' if share is None else f'{share:.2f}'} | "
                f"{'' if not share else f'{s.served_work / share:.2f}'} |")
        lines.append("")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-overload-gateways-"))
    guess = estimate(args)
    calibration = Phase("capacity", True, (Stream("heavy", 3.0),), args.reference_s, limit=False)
    await run_phase(calibration, guess, args, workdir)
    capacity = calibration.throughput
    print(f"capacity {capacity:.1f} requests/s (estimate {guess:.1f})", flush=True)
    unloaded = Phase("unloaded", False, (Stream("light-a", 0.1), Stream("light-b", 0.1)), args.reference_s)
    await run_phase(unloaded, capacity, args, workdir)
    phases = [calibration, unloaded]
    for shared in (False, True):
        name = "shared fairness" if shared else "fairness not shared (--no-shared-fairness)"
        phase = Phase(name, True, streams(args.load, 0.0), args.duration)
        await run_pair(phase, capacity, args, workdir, shared)
        phases.append(phase)
        print(f"{name}: served {phase.throughput:.1f} requests/s", flush=True)
    if args.output is not None:
        plot(phases, args.output.with_suffix(".png"))
    return report(phases, capacity, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.overload_gateways",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--inflight-limit", type=int, default=0, help="per replica (0: --max-num-seqs)")
    parser.add_argument("--reserved", type=int, default=0,
                        help="slots per replica beyond the limit for tenants with nothing waiting")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--stream-interval", type=int, default=16)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--load", type=float, default=2.0, help="the three tenants together, x capacity")
    parser.add_argument("--reference-s", type=float, default=45.0,
                        help="length of the capacity and unloaded phases")
    parser.add_argument("--client-timeout", type=float, default=300.0)
    parser.add_argument("--sim-net", default="127.0.4")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    args.workers = 1  # what bench.overload's phases read
    text = asyncio.run(main_async(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
