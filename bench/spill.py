"""Spill to a fallback pool through ``kvgate up`` (issue 34, acceptance 3).

``python -m kvgate.bench.spill [--replicas 2] [--max-num-seqs 128] [--time-scale 20] [--output FILE]``

One simulator process runs ``2 x --replicas`` replicas: the first half are the Pods of pool
``llama`` (the preferred pool, ``kvgate.io/spill-to: spot``), the second half those of pool
``spot``; both pools have flow control with the in-flight limit ``--max-num-seqs`` per replica; the
route sends everything to ``llama``. One continuous run of open-loop traffic
(``bench/overload_plan.py``'s requests, one tenant):

1. **unsaturated**: ``--low`` x the preferred pool's capacity (the model estimate) for
   ``--phase-s`` seconds: every request on ``llama``;
2. **saturated**: ``--high`` x for ``--phase-s``: ``llama`` full, its overflow on ``spot``;
3. **recovered**: ``--low`` x again.

Reported per phase (requests sent after its first quarter): requests, failures, TTFT p50/p90 and
the share spilled (``kvgate_spilled_requests_total``, polled every 50 ms); and, after the drop to
phase 3, when the last spill happened against when ``llama`` first had room again (its in-flight
requests below the limit, polled from ``/debug/pools``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from kvgate.bench.datapath.procs import kvgate_command, start_child
from kvgate.bench.loadgen import run_open_loop
from kvgate.bench.overload_plan import Stream, percentile, plan
from kvgate.bench.workloads import PlannedRequest
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up_options import bundled_example

POOL = """---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: {name}
  namespace: default
  annotations:
    kvgate.io/flow-control: "true"
    kvgate.io/max-inflight-per-endpoint: "{limit}"
{extra}spec:
  selector: {{matchLabels: {{app: {name}}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate-picker, port: {{number: 9002}}}}
"""
POD = ("---\napiVersion: v1\nkind: Pod\n"
       "metadata: {{name: {name}, namespace: default, labels: {{app: {pool}}}}}\nstatus: {{podIP: {ip}}}\n")


def manifests(directory: Path, args: argparse.Namespace, sim_port: int) -> None:
    directory.mkdir(parents=True)
    shutil.copy(bundled_example() / "gateway.yaml", directory / "gateway.yaml")
    spill = "    kvgate.io/spill-to: spot\n"
    text = POOL.format(name="llama", limit=args.max_num_seqs, port=sim_port, extra=spill)
    text += POOL.format(name="spot", limit=args.max_num_seqs, port=sim_port, extra="")
    for i in range(2 * args.replicas):
        pool = "llama" if i < args.replicas else "spot"
        text += POD.format(name=f"{pool}-{i}", pool=pool, ip=f"{args.sim_net}.{i + 1}")
    (directory / "pools.yaml").write_text(text)


def capacity(args: argparse.Namespace) -> float:
    """The preferred pool's requests/s (real) by the BLIS model (``bench/overload.py``'s estimate)."""
    busy = args.prompt_tokens * 17.25e-6 + args.output_tokens * (6e-6 + 0.0057527 / args.max_num_seqs)
    return float(args.replicas / busy / args.time_scale)


async def poll(admin: str, stop: asyncio.Event, samples: list[tuple[float, float, int]]) -> None:
    """(time, spilled so far, llama's in-flight requests) every 50 ms."""
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            spilled = 0.0
            async with http.get(f"{admin}/metrics") as response:
                for line in (await response.text()).splitlines():
                    if line.startswith("kvgate_spilled_requests_total{"):
                        spilled += float(line.rsplit(" ", 1)[1])
            async with http.get(f"{admin}/debug/pools") as response:
                pools = (await response.json())["pools"]
            llama = next(p for p in pools if p["name"] == "default/llama")
            inflight = sum(e["inflight_requests"] for e in llama["endpoints"])
            samples.append((time.monotonic(), spilled, inflight))
            await asyncio.sleep(0.05)


def phase_plan(args: argparse.Namespace, cap: float) -> list[PlannedRequest]:
    out: list[PlannedRequest] = []
    for number, load in enumerate((args.low, args.high, args.low)):
        part, _ = plan((Stream("tenant", load),), cap, args.phase_s, args.prompt_tokens, args.output_tokens,
                       args.seed + number)
        start = number * args.phase_s
        out += [PlannedRequest(len(out) + i, r.at_s + start, r.path, r.body, r.model, r.prompt_tokens,
                               r.output_tokens, r.headers) for i, r in enumerate(part)]
    return out


async def main_async(args: argparse.Namespace) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-spill-"))
    sim_port, port, admin_port = free_port(), free_port(), free_port()
    manifests(workdir / "config", args, sim_port)
    cap = capacity(args)
    requests = phase_plan(args, cap)
    samples: list[tuple[float, float, int]] = []
    async with contextlib.AsyncExitStack() as stack:
        sim = await start_child("simulator", [
            sys.executable, "-m", "kvgate.simulator", "--replicas", str(2 * args.replicas),
            "--port", str(sim_port), "--hosts-from", f"{args.sim_net}.1",
            "--time-scale", str(args.time_scale), "--max-num-seqs", str(args.max_num_seqs),
            "--stream-interval", "16"], "kvgate-sim ready",
            workdir / "sim.log")
        stack.push_async_callback(sim.stop)
        up = await start_child("kvgate_up", [*kvgate_command(), "up", "-f", str(workdir / "config"), "--port",
                                             str(port), "--admin-port", str(admin_port)], "kvgate ready:",
                               workdir / "up.log")
        stack.push_async_callback(up.stop)
        await asyncio.sleep(1.0)
        stop = asyncio.Event()
        poller = asyncio.create_task(poll(f"http://127.0.0.1:{admin_port}", stop, samples))
        started = time.monotonic() + 0.2  # run_open_loop's start
        results = await run_open_loop(f"http://127.0.0.1:{port}", requests, 1.0, timeout_s=120)
        stop.set()
        await poller
    shutil.rmtree(workdir, ignore_errors=True)
    at = {r.index: r.at_s for r in requests}
    rows = []
    bars: list[tuple[str, float]] = []
    for number, name in enumerate(("unsaturated", "saturated", "recovered")):
        begin, end = (number + 0.25) * args.phase_s, (number + 1) * args.phase_s
        mine = [r for r in results if begin <= at[r.index] < end]
        spilled = [s for t, s, _ in samples if begin <= t - started < end]
        share = (spilled[-1] - spilled[0]) / len(mine) if len(spilled) > 1 and mine else float("nan")
        for pool, served in (("llama", [r for r in mine if r.ok and int(r.served_by or 0) < args.replicas]),
                             ("spot", [r for r in mine if r.ok and int(r.served_by or 0) >= args.replicas])):
            ttfts = [r.ttft_s for r in served]
            if served:
                bars.append((f"{name}\n{pool}", percentile(ttfts, 0.9)))
            rows.append(f"| {name} | {(args.low, args.high, args.low)[number]:g}x | {pool} | {len(served)} | "
                        f"{sum(1 for r in mine if not r.ok) if pool == 'llama' else ''} | "
                        f"{percentile(ttfts, 0.5) * 1000:.0f} | {percentile(ttfts, 0.9) * 1000:.0f} | "
                        f"{share:.0%} |")
    drop = 2 * args.phase_s
    after = [(t - started, s, inflight) for t, s, inflight in samples if t - started >= drop]
    limit = args.replicas * args.max_num_seqs
    full = [t for t, _, inflight in after if inflight >= limit]  # llama at its limit: full
    room = next((t for t, _, _ in after if not full or t > full[-1]), float("nan"))  # room from then on
    final = after[-1][1] if after else 0.0
    last_spill = next((t for t, s, _ in after if s >= final), float("nan"))
    image = []
    if args.output is not None:
        plot(bars, args.output.with_suffix(".png"))
        image = [f"![TTFT p90 per phase and pool]({args.output.with_suffix('.png').name})", ""]
    return "\n".join([
        "# Spill to a fallback pool: the preferred pool full, its overflow on the next", "",
        f"`python -m kvgate.bench.spill {' '.join(sys.argv[1:])}`", "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} cores. "
        f"`kvgate up -f DIR`: pool `llama` ({args.replicas} simulated replicas, `kvgate.io/spill-to: spot`) "
        f"and pool `spot` ({args.replicas}), both with flow control (in-flight limit {args.max_num_seqs} per "
        f"replica = max-num-seqs); time scale {args.time_scale:g}; prompts {args.prompt_tokens} tokens, "
        f"output {args.output_tokens // 4}-{args.output_tokens * 7 // 4}; the preferred pool's capacity "
        f"{cap:.1f} requests/s (model estimate). Phases of {args.phase_s:g} s, counted from a quarter in.",
        "",
        "| phase | load (x llama's capacity) | served by | requests | failed (all) | TTFT p50 ms "
        "| TTFT p90 ms | spilled (counter) |",
        "|---|---|---|---|---|---|---|---|", *rows, "", *image,
        f"After the load dropped (at {drop:g} s): `llama` was below its in-flight limit for good from "
        f"{room - drop:+.2f} s, the last spill was seen at {last_spill - drop:+.2f} s (both polled every "
        "50 ms; the scrape interval is 50 ms).",
        ""])


def plot(bars: list[tuple[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.bar([label for label, _ in bars], [value * 1000 for _, value in bars],
             color=["tab:orange" if "spot" in label else "tab:blue" for label, _ in bars])
    axis.set_ylabel("TTFT p90 (ms)")
    axis.set_title("Preferred pool (llama) and its spill target (spot)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.spill",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--replicas", type=int, default=2, help="per pool")
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--low", type=float, default=0.6)
    parser.add_argument("--high", type=float, default=1.5)
    parser.add_argument("--phase-s", type=float, default=40.0)
    parser.add_argument("--sim-net", default="127.0.6")
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
