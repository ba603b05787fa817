"""Routing-quality benchmark: kvgate against Envoy, real peer routers and an oracle on the simulated fleet.

Run: ``python -m kvgate.bench.routing --quick`` (or ``kvgate bench --quick``); see ``--help`` and
bench/results/README.md. For every workload, offered rate and contender it starts a fresh simulated
fleet (cold, equal caches), starts the contender in front of it, plays the same open-loop Poisson plan
(same seed) through it with a streaming client, reads the fleet's prefix-cache counters and event-loop
lag, checks the contender's policy really ran, and stops both. Results go to
``bench/results/<workload>.{json,md,png}``; rates are fractions of a capacity estimate
(``bench.workloads.capacity_estimate``), times are simulated (real / ``--time-scale``).

Duration on 2 cores: ``--quick`` 7.7 min (3 workloads × 4 contenders at 0.9 ×); the full mode about
40 hours (5 workloads × 4 rates × 9 contenders, 1,500 requests of 256 output tokens at time scale 40:
12-17 min per run), so run it per workload or on a larger machine (bench/results/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import shlex
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.bench.contenders import Contender, contender_for_profile_path, make_contender, missing_tools
from kvgate.bench.datapath.procs import TreeCpu, picker_processes
from kvgate.bench.loadgen import RequestResult, run_open_loop
from kvgate.bench.routing_report import goals, plot, summary, tables
from kvgate.bench.run_stats import LAG_LIMIT_SIM_MS, RouterCpu, RunFigures, figures_from_json, summarize
from kvgate.bench.sim_fleet import SimFleet
from kvgate.bench.workloads import (
    SIM_MODEL,
    WARMUP_FRACTION,
    WORKLOADS,
    FleetSpec,
    PlannedRequest,
    WorkloadSpec,
    capacity_estimate,
    offered_rate,
    run_plan,
)


def _default_results() -> Path:
    """bench/results in a source checkout; ./kvgate-bench-results where kvgate is installed."""
    here = Path(__file__).resolve().parent
    return here / "results" if (here.parent / "pyproject.toml").exists() else Path("kvgate-bench-results")


RESULTS = _default_results()
FULL_CONTENDERS = ("envoy-rr", "envoy-lr", "kvgate-default", "kvgate-gie-default", "vllm-router-cache_aware",
                   "vllm-router-round_robin", "sglang-router-cache_aware", "oracle", "oracle-spill")
QUICK_CONTENDERS = ("envoy-rr", "kvgate-default", "vllm-router-cache_aware", "oracle")
FULL_FRACTIONS = (0.3, 0.6, 0.9, 1.2)
QUICK_FRACTIONS = (0.9,)
QUICK_WORKLOADS = ("shared-prefix-fit", "lora-mix", "shared-prefix-exceed")
FULL_TIME_SCALE = 40.0
QUICK_TIME_SCALE = 20.0
"""Real seconds per simulated second. Quick mode runs the fleet twice as fast as the full mode (real
request rates of 4-16 req/s instead of 2-8) to finish in under 10 minutes; the lag check still
guards every run (the quick runs at 20 in bench/results/quick/ lagged 0.06-0.27 simulated ms p99,
limit 1.0)."""
REQUEST_TIMEOUT_SIM_S = 4.0  # a request not finished by then counts as an error


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvgate bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 workloads x 4 contenders at 0.9 x capacity, "
                   "300 requests, time scale 20 (under 10 min on 2 cores; bench/results/quick/)")
    p.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=None)
    p.add_argument("--hetero", action="store_true", help="heterogeneous fleet: replica 0 half the KV "
                   "cache, replica 1 1.5x slower (results named <workload>-hetero)")
    p.add_argument("--contenders", nargs="+", default=None, help="names: " + " ".join(FULL_CONTENDERS))
    p.add_argument("--profile", action="append", type=Path, default=[],
                   help="extra kvgate contender with this profile YAML (repeatable)")
    p.add_argument("--fractions", nargs="+", type=float, default=None,
                   help="offered rates as fractions of the capacity estimate")
    p.add_argument("--requests", type=int, default=None,
                   help="planned requests of a run at 1.0 x capacity (same arrival window at every rate)")
    p.add_argument("--output-tokens", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=None, help="real seconds per simulated second")
    p.add_argument("--replicas", type=int, default=None,
                   help="simulated replicas (default: the workload's, 8); results named <workload>-r<N>")
    p.add_argument("--scale-groups", action="store_true",
                   help="with --replicas: the prompt groups scaled with the fleet, so the working set keeps "
                        "its ratio to the caches; results named <workload>-r<N>-scaled")
    p.add_argument("--stream-interval", type=int, default=1, metavar="TOKENS",
                   help="tokens per SSE chunk from the simulator (default 1); results named <workload>-si<K>")
    p.add_argument("--kv-events", action="store_true",
                   help="the fleet publishes vLLM's KV events and tokenizes with the simulated model's "
                   "tokenizer; kvgate routes on them (kvgate-<profile>-approx: without); results "
                   "named <workload>-kv")
    p.add_argument("--bypass", type=float, default=0.0, metavar="FRACTION",
                   help="this fraction of the requests goes to a replica directly (another router's "
                   "traffic, the same for every contender; not counted); results <workload>-bypass<pct>")
    p.add_argument("--restart-at", type=float, default=None, metavar="FRACTION",
                   help="replica 0 restarts (its KV cache empty) at this fraction of the arrival window; "
                   "results named <workload>-restart<pct>")
    p.add_argument("--sim-processes", type=int, default=1, metavar="K",
                   help="simulator processes the replicas are split over (a big fleet at real time)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--report-only", action="store_true", help="rewrite .md/.png from the .json files")
    return p


@dataclasses.dataclass(frozen=True, slots=True)
class Played:
    """One contender's run of one plan on a fresh fleet: every request's result and what was measured."""

    results: list[RequestResult]
    wall_s: float
    cpu: RouterCpu
    stats: dict[str, Any]
    """The fleet's ``/stats`` over the run (``totals``, per replica, ``loop_lag``)."""
    check: str


def bypassing(planned: Sequence[PlannedRequest], fraction: float, replicas: int, seed: int) -> dict[int, int]:
    """Plan index → replica for the requests another router sends (``--bypass``): each request with
    probability ``fraction``, to a replica drawn at random; the same draw for every contender."""
    if fraction <= 0:
        return {}
    rng = random.Random(seed * 7919 + 17)
    return {r.index: rng.randrange(replicas) for r in planned if rng.random() < fraction}


async def play(fleet_spec: FleetSpec, contender: Contender, planned: Sequence[PlannedRequest],
               time_scale: float, seed: int, workdir: Path, sim_processes: int = 1,
               timeout_sim_s: float = REQUEST_TIMEOUT_SIM_S,
               bypass: Mapping[int, int] | None = None, restart_at_s: float | None = None) -> Played:
    """Start a fresh fleet and ``contender`` in front of it, play ``planned``, stop both.
    ``bypass``: requests sent to a replica directly (``bypassing``); left out of the results.
    ``restart_at_s``: replica 0 restarts (an empty cache) at that simulated second of the plan."""
    fleet = SimFleet(fleet_spec, time_scale, workdir / f"sim-{contender.name}.log", seed, sim_processes)
    if fleet.events is not None:
        contender.kv_events = {"port": fleet.events.events_port, "tokenizer": str(SIM_MODEL)}
    urls = await fleet.start()
    try:
        base = await contender.start(urls, workdir)
        await asyncio.sleep(1.0)  # first scrapes / health checks
        meter = CpuMeter(contender.router_pids(), contender.envoy_pid())
        start = time.perf_counter()
        direct = {index: urls[replica] for index, replica in (bypass or {}).items()}
        restart = (asyncio.create_task(_restart_replica(fleet.admin_urls[0], 0.2 + restart_at_s * time_scale))
                   if restart_at_s is not None else None)
        results = await run_open_loop(base, planned, time_scale, timeout_s=timeout_sim_s * time_scale,
                                      direct=direct)
        if restart is not None:
            await restart
        results = [r for r in results if r.index not in direct]
        wall = time.perf_counter() - start
        cpu = meter.read()
        stats = await fleet.stats(window_s=wall)
        check = await contender.check()
    finally:
        await contender.stop()
        await fleet.stop()
    return Played(results, wall, cpu, stats, check)


async def _restart_replica(admin_url: str, after_s: float) -> None:
    """``POST /replicas/0/restart`` on the simulator's admin server after ``after_s`` real seconds."""
    await asyncio.sleep(after_s)
    async with aiohttp.ClientSession() as session, session.post(f"{admin_url}/replicas/0/restart") as resp:
        if resp.status != 200:
            raise RuntimeError(f"restarting replica 0: HTTP {resp.status} {await resp.text()}")


async def run_one(spec: WorkloadSpec, contender: Contender, rate: float, fraction: float, requests: int,
                  time_scale: float, seed: int, workdir: Path, sim_processes: int = 1,
                  bypass_fraction: float = 0.0, restart_at: float | None = None) -> RunFigures:
    planned, warmup = run_plan(spec, rate, fraction, requests, seed)
    bypass = bypassing(planned, bypass_fraction, spec.fleet.replicas, seed)
    restart_at_s = restart_at * planned[-1].at_s if restart_at is not None and planned else None
    run = await play(spec.fleet, contender, planned, time_scale, seed, workdir, sim_processes,
                     bypass=bypass, restart_at_s=restart_at_s)
    totals = run.stats["totals"]
    lag = run.stats.get("loop_lag") or {}
    hits, queries = float(totals["prefix_cache_hits"]), float(totals["prefix_cache_queries"])
    if bypass:  # the contender's own requests' hits (the fleet's counters include the others')
        prompt_tokens = {r.index: r.prompt_tokens for r in planned}
        hits = float(sum(r.cached_tokens for r in run.results if r.ok))
        queries = float(sum(prompt_tokens[r.index] for r in run.results if r.ok))
    return summarize(workload=spec.name, contender=contender.name, rate=rate, load_fraction=fraction,
                     results=run.results, warmup=warmup, time_scale=time_scale, wall_s=run.wall_s,
                     prefix_hits=hits, prefix_queries=queries,
                     lag_p99_real_ms=float(lag.get("p99_ms") or 0.0), policy_check=run.check, cpu=run.cpu)


class CpuMeter:
    """CPU seconds of the router's process trees and of Envoy since it was made."""

    def __init__(self, routers: list[int], envoy: int | None) -> None:
        self.routers, self.envoy = routers, envoy
        trees = {f"router{i}": pid for i, pid in enumerate(routers)}
        self.meter = TreeCpu(trees if envoy is None else {**trees, "envoy": envoy})

    def read(self) -> RouterCpu:
        seconds, _ = self.meter.used()
        workers = sum(len(picker_processes(root)[0]) for root in self.routers)
        return RouterCpu(
            router_s=sum(v for name, v in seconds.items() if name.startswith("router")),
            router_processes=workers,
            envoy_s=seconds.get("envoy"),
        )


def write_report(path_stem: Path, meta: dict[str, Any], figures: Sequence[RunFigures]) -> None:
    path_stem.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "runs": [f.to_json() for f in figures]}, indent=1, default=str))
    plot(figures, path_stem.with_suffix(".png"), f"{meta['workload']} ({meta['mode']})")
    header = [
        f"# Routing benchmark: {meta['workload']}",
        "",
        f"{meta['description']}",
        "",
        f"- Command: `{meta['command']}` ({meta['mode']} mode), {meta['date']}, {meta['machine']}.",
        f"- Fleet: `python -m kvgate.simulator {meta['fleet_args']}` (BLIS Llama-3.1-8B/H100 step model), "
        f"restarted cold for every contender and rate.",
        f"- Time scale {meta['time_scale']} real s per simulated s; all figures are simulated time. "
        f"Capacity estimate {meta['capacity']:.0f} req/s; arrival window {meta['requests']} / capacity "
        f"simulated s per run (Poisson, seed {meta['seed']}, same plan for every contender), the first "
        f"{int(WARMUP_FRACTION * 100)} % of the arrival window are warm-up (sent, not counted); "
        f"{meta['output_tokens']} output tokens per request.",
        f"- A request not finished {REQUEST_TIMEOUT_SIM_S:.0f} simulated s after its send counts as an error "
        "(timeout).",
        f"- Valid run: simulator event-loop lag p99 over the run ≤ {LAG_LIMIT_SIM_MS} simulated ms (~17 % of "
        "one 5.75 ms engine step); invalid runs are marked and not quoted.",
        f"- Wall time of this report's runs: {meta['wall_s'] / 60:.1f} min.",
        "",
        f"![p90 TTFT and throughput]({path_stem.name}.png)",
        "",
    ]
    summary = ["## kvgate-default against the issue's goals", "", goals(figures), "## Runs", ""]
    path_stem.with_suffix(".md").write_text("\n".join(header + summary) + tables(figures) + "\n")


async def run_workload(spec: WorkloadSpec, contenders: Sequence[str], profiles: Sequence[Path],
                       fractions: Sequence[float], requests: int, time_scale: float, seed: int,
                       results_dir: Path, mode: str, command: str,
                       sim_processes: int = 1, bypass: float = 0.0,
                       restart_at: float | None = None) -> list[RunFigures]:
    capacity = capacity_estimate(spec)
    figures: list[RunFigures] = []
    meta: dict[str, Any] = {
        "workload": spec.name, "description": spec.description, "mode": mode, "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {platform.python_version()}, {os.cpu_count()} cores",
        "fleet_args": shlex.join(spec.fleet.args()), "time_scale": time_scale, "capacity": capacity,
        "requests": requests, "seed": seed, "output_tokens": spec.output_tokens, "wall_s": 0.0,
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"kvgate-bench-{spec.name}-") as tmp:
        for fraction in fractions:
            rate = offered_rate(spec, fraction)
            runners = [make_contender(name) for name in contenders]
            runners += [contender_for_profile_path(path) for path in profiles]
            for contender in runners:
                contender.time_scale = time_scale
                contender.max_loras = spec.fleet.max_loras
                print(f"[{spec.name}] rate {rate} ({fraction}) {contender.name} ...", flush=True)
                try:
                    fig = await run_one(spec, contender, rate, fraction, requests, time_scale, seed,
                                        Path(tmp), sim_processes, bypass, restart_at)
                except Exception as exc:  # one broken contender must not end the run
                    where = traceback.extract_tb(exc.__traceback__)[-3:]
                    print(f"  FAILED: {type(exc).__name__}: {exc}"[:600], flush=True)
                    print("  at " + " <- ".join(f"{f.name} ({Path(f.filename).name}:{f.lineno})"
                                               for f in reversed(where)), flush=True)
                    continue
                print(f"  ttft p50/p90 {fig.ttft_p50_ms:.1f}/{fig.ttft_p90_ms:.1f} ms, tok/s "
                      f"{fig.output_tok_s:.0f}, hit {fig.hit_rate:.2f}, err {fig.errors}, lag p99 "
                      f"{fig.lag_p99_sim_ms:.3f} sim ms, {fig.policy_check}", flush=True)
                figures.append(fig)
                meta["wall_s"] = time.perf_counter() - started
                write_report(results_dir / spec.name, meta, figures)
                write_summary(results_dir)
    return figures


def _reports(results_dir: Path) -> list[tuple[Path, dict[str, Any], list[RunFigures]]]:
    """The routing reports' JSON files in ``results_dir`` (other JSON files are skipped)."""
    out: list[tuple[Path, dict[str, Any], list[RunFigures]]] = []
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text())
        if not (isinstance(data, dict) and "runs" in data and "meta" in data):
            continue
        try:
            out.append((path, data["meta"], [figures_from_json(r) for r in data["runs"]]))
        except TypeError:  # another benchmark's runs (bench.pd's pd.json): not a routing report
            continue
    return out


def write_summary(results_dir: Path) -> None:
    """``SUMMARY.md``: every report in ``results_dir`` in one table (see ``routing_report.summary``)."""
    reports = _reports(results_dir)
    if not reports:
        return
    lines = [
        "# Routing benchmark: every report in this folder",
        "",
        "p90 TTFT in simulated ms (output tokens/s) per contender and run; **bold** is kvgate-default. "
        "Each row is one same-run comparison (same fleet, plan and seed for every contender in it); rows "
        "from different commands are not comparable with each other. The last four columns are "
        "kvgate-default's ratios against the issue's goals: the best peer is the lowest valid p90 among "
        "Envoy, vllm-router and sglang-router, the oracle the better of `oracle` and `oracle-spill`. An "
        "empty cell: the contender was not in that run. Written by `python -m kvgate.bench.routing` after "
        "every run and by `--report-only`.",
        "",
        summary([(meta["workload"], figures) for _, meta, figures in reports]),
        "Commands (each report's `.md` has its fleet, plan, wall time and every figure):",
        "",
    ]
    lines += [f"- [{meta['workload']}]({path.stem}.md): `{meta['command']}`" for path, meta, _ in reports]
    (results_dir / "SUMMARY.md").write_text("\n".join(lines) + "\n")


def _report_only(results_dir: Path) -> int:
    for path, meta, figures in _reports(results_dir):
        write_report(path.with_suffix(""), meta, figures)
    write_summary(results_dir)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # asyncio.run cancels the run; finally blocks stop the children


def report_command(given: Sequence[str], fractions: Sequence[float], time_scale: float) -> str:
    """The command a report records: the arguments given, plus the rates and time scale where
    defaults chose them, so it reproduces the report after a default changes (one did: quick mode
    ran 0.5 and 0.9 × at time scale 40 before session 5)."""
    args = build_parser().parse_args(list(given))
    resolved = ([] if args.fractions else ["--fractions", *(f"{f:g}" for f in fractions)]) + (
        [] if args.time_scale else ["--time-scale", f"{time_scale:g}"])
    return "python -m kvgate.bench.routing " + shlex.join([*given, *resolved])


USER_RESULTS = Path("kvgate-bench-results")
"""Where ``kvgate bench`` writes unless told (``--results``): a directory of the user's, never the
checked-in ``bench/results`` of a checkout."""


def kvgate_bench(argv: Sequence[str]) -> int:
    """``kvgate bench``: this benchmark for users, writing to :data:`USER_RESULTS` by default."""
    given = list(argv)
    if not any(arg == "--results" or arg.startswith("--results=") for arg in given):
        given += ["--results", str(USER_RESULTS)]
    return main(given)


def workload_spec(name: str, args: argparse.Namespace, output_tokens: int) -> WorkloadSpec:
    """The workload ``name`` as the command line shapes it (fleet size, KV events, bypass, ...),
    named after what changed."""
    spec = WORKLOADS[name].with_output_tokens(output_tokens)
    if args.hetero:
        spec = spec.with_fleet(spec.fleet.heterogeneous(), f"{name}-hetero")
    if args.replicas:
        fleet = dataclasses.replace(spec.fleet, replicas=args.replicas)
        spec = spec.with_fleet(fleet, f"{spec.name}-r{args.replicas}")
        base = WORKLOADS[name].fleet.replicas  # the description's sizes are the workload's fleet's
        if args.scale_groups:  # as many prompt groups per replica: the working set keeps its ratio
            groups = max(1, round(spec.groups * args.replicas / base))
            spec = dataclasses.replace(spec, name=f"{spec.name}-scaled", groups=groups, description=(
                f"{spec.description} (sizes for {base} replicas; at {args.replicas}, {groups:,} groups "
                f"and caches of {args.replicas * fleet.num_gpu_blocks:,} blocks)"))
        else:
            spec = dataclasses.replace(spec, description=(
                f"{spec.description} (sizes for {base} replicas; at {args.replicas} the caches hold "
                f"{args.replicas * fleet.num_gpu_blocks:,} blocks)"))
    if args.kv_events:
        spec = spec.with_fleet(dataclasses.replace(spec.fleet, kv_events=True), f"{spec.name}-kv")
    if args.bypass > 0:
        spec = spec.with_fleet(spec.fleet, f"{spec.name}-bypass{round(args.bypass * 100)}")
    if args.restart_at is not None:
        spec = spec.with_fleet(spec.fleet, f"{spec.name}-restart{round(args.restart_at * 100)}")
    if args.stream_interval != 1:
        fleet = dataclasses.replace(spec.fleet, stream_interval=args.stream_interval)
        spec = spec.with_fleet(fleet, f"{spec.name}-si{args.stream_interval}")
    return spec


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.report_only:
        return _report_only(args.results)
    chosen = args.contenders or list(QUICK_CONTENDERS if args.quick else FULL_CONTENDERS)
    missing = missing_tools(chosen)
    if missing:
        print(f"kvgate bench: {', '.join(missing)} missing: pip install 'kvgate[bench]' "
              "(in a checkout: pip install -e '.[bench]')", file=sys.stderr)
        return 2
    quick = bool(args.quick)
    names = args.workloads or list(QUICK_WORKLOADS if quick else sorted(WORKLOADS))
    contenders = args.contenders or list(QUICK_CONTENDERS if quick else FULL_CONTENDERS)
    fractions = args.fractions or list(QUICK_FRACTIONS if quick else FULL_FRACTIONS)
    requests = args.requests or (300 if quick else 1500)
    time_scale = args.time_scale or (QUICK_TIME_SCALE if quick else FULL_TIME_SCALE)
    output_tokens = args.output_tokens or (64 if quick else 256)
    command = report_command(list(sys.argv[1:] if argv is None else argv), fractions, time_scale)
    args.results.mkdir(parents=True, exist_ok=True)
    for name in names:
        spec = workload_spec(name, args, output_tokens)
        asyncio.run(run_workload(spec, contenders, args.profile, fractions, requests, time_scale, args.seed,
                                 args.results, "quick" if quick else "full", command, args.sim_processes,
                                 args.bypass, args.restart_at))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
