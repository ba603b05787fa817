"""Disaggregated prefill/decode benchmark: P/D kvgate against aggregated kvgate on the same GPUs, and
vllm-router's P/D mode, on the simulated fleet (the routing benchmark's machinery: ``bench.routing``).

Run: ``python -m kvgate.bench.pd`` (see ``--help``; results in bench/results/pd.md and pd.json).

A contender is a router and a fleet shape, ``NAME@<P>p<D>d``: ``P`` prefill and ``D`` decode
instances; without ``@`` the fleet is the workload's ``N`` replicas serving both (aggregated).
``kvgate-pd@3p5d`` is kvgate with profile ``pd`` over 3 prefill and 5 decode instances;
``kvgate-default`` aggregated kvgate over 8; ``kvgate-default@0p5d`` aggregated kvgate over the 5
decode instances alone; ``vllm-router-pd@3p5d`` vllm-router's vLLM P/D mode; ``kvgate-NAME``
with ``bench/profiles/NAME.yaml`` a profile of this repository (``pd-always``: the decider off).

Per run: TTFT and TPOT p50/p90/p99 (simulated ms), and goodput: requests per simulated second that
finished within the SLO (TTFT ≤ ``--slo-ttft-ms`` and TPOT ≤ ``--slo-tpot-ms``, DistServe's
definition), with the fleet's count of prefills run for a remote decode (the check that a P/D
contender really split its requests).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvgate.bench.contenders import Contender, contender_for_profile_path, make_contender, missing_tools
from kvgate.bench.loadgen import RequestResult
from kvgate.bench.pd_report import SHAPE, PdFigures, plot, report
from kvgate.bench.routing import RESULTS, play
from kvgate.bench.run_stats import LAG_LIMIT_SIM_MS, RouterCpu, percentile
from kvgate.bench.workloads import PD_WORKLOADS, FleetSpec, WorkloadSpec, offered_rate, run_plan

DEFAULT_RUNS = {
    "pd-long": ("kvgate-default", "kvgate-pd@3p5d", "kvgate-pd@4p4d", "kvgate-pd@5p3d",
                "vllm-router-pd@4p4d", "vllm-router-pd@5p3d"),
    "pd-short": ("kvgate-default@0p5d", "kvgate-pd@3p5d", "kvgate-pd-always@3p5d"),
    "pd-docs": ("kvgate-default", "kvgate-pd@4p4d", "kvgate-pd-always@4p4d", "vllm-router-pd@4p4d"),
}
PROFILES = Path(__file__).resolve().parent / "profiles"



def contender_and_fleet(name: str, fleet: FleetSpec) -> tuple[Contender, FleetSpec]:
    """The contender a name gives and the fleet it runs on (module docstring)."""
    match = SHAPE.match(name)
    base = match.group("name") if match else name
    if match:
        fleet = fleet.split(int(match.group("p")), int(match.group("d")))
    profile = PROFILES / f"{base.removeprefix('kvgate-')}.yaml"
    contender = contender_for_profile_path(profile) if base.startswith("kvgate-") and profile.exists() else (
        make_contender(base))
    contender.name = name
    contender.roles = fleet.roles
    return contender, fleet


def figures(spec: WorkloadSpec, name: str, fleet: FleetSpec, rate: float, fraction: float,
            results: Sequence[RequestResult], warmup: int, time_scale: float, wall_s: float,
            stats: dict[str, Any], check: str, slo_ttft_ms: float, slo_tpot_ms: float,
            cpu: RouterCpu | None = None) -> PdFigures:
    """The run's figures over the requests after warm-up (pure)."""
    k = time_scale
    measured = [r for r in results if r.index >= warmup]
    good = [r for r in measured if r.ok]
    ttft = {r.index: r.ttft_s / k * 1000 for r in good}
    tpot = {r.index: (r.e2e_s - r.ttft_s) / k / (r.completion_tokens - 1) * 1000
            for r in good if r.completion_tokens > 1}
    within = [i for i in ttft if ttft[i] <= slo_ttft_ms and tpot.get(i, 0.0) <= slo_tpot_ms]
    window = wall_s / k * (len(measured) / max(1, len(results)))  # the measured share of the run
    lag = float((stats.get("loop_lag") or {}).get("p99_ms") or 0.0) / k
    roles = {"prefill": fleet.prefill, "decode": fleet.decode,
             "both": fleet.replicas - fleet.prefill - fleet.decode}
    errors = [r for r in measured if not r.ok]
    sent = max(1, len(results))
    return PdFigures(
        workload=spec.name, contender=name,
        fleet=" + ".join(f"{n} {role}" for role, n in roles.items() if n), rate=rate, load_fraction=fraction,
        measured=len(measured), ok=len(good), errors=len(errors),
        ttft_ms=tuple(percentile(list(ttft.values()), q) for q in (50, 90, 99)),  # type: ignore[arg-type]
        tpot_ms=tuple(percentile(list(tpot.values()), q) for q in (50, 90, 99)),  # type: ignore[arg-type]
        goodput=len(within) / window if window > 0 else 0.0,
        slo_met=len(within) / max(1, len(measured)),
        remote_prefills=int(stats["totals"].get("remote_prefills", 0)),
        remote_decodes=int(stats["totals"].get("remote_decodes", 0)) - int(stats["totals"].get(
            "kv_transfers_failed", 0)),
        lag_p99_sim_ms=lag, valid=lag <= LAG_LIMIT_SIM_MS, check=check,
        first_error=errors[0].error[:120] if errors else "",
        router_cpu_us=cpu.router_s / sent * 1e6 if cpu and cpu.router_processes else math.nan,
        envoy_cpu_us=cpu.envoy_s / sent * 1e6 if cpu and cpu.envoy_s is not None else math.nan,
    )


async def run_contender(spec: WorkloadSpec, name: str, fraction: float, requests: int, time_scale: float,
                        seed: int, workdir: Path, slo: tuple[float, float]) -> PdFigures:
    contender, fleet = contender_and_fleet(name, spec.fleet)
    contender.time_scale = time_scale
    rate = offered_rate(spec, fraction)
    planned, warmup = run_plan(spec, rate, fraction, requests, seed)
    run = await play(fleet, contender, planned, time_scale, seed, workdir, timeout_sim_s=30.0)
    return figures(spec, name, fleet, rate, fraction, run.results, warmup, time_scale, run.wall_s,
                   run.stats, run.check, *slo, cpu=run.cpu)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvgate.bench.pd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", choices=sorted(PD_WORKLOADS), default=list(DEFAULT_RUNS))
    p.add_argument("--contenders", nargs="+", default=None,
                   help="names (module docstring); default per workload: " + json.dumps(DEFAULT_RUNS))
    p.add_argument("--fractions", nargs="+", type=float, default=[0.3, 0.5],
                   help="offered rates as fractions of the aggregated capacity estimate")
    p.add_argument("--requests", type=int, default=200, help="planned requests at 1.0 x capacity")
    p.add_argument("--time-scale", type=float, default=15.0)
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kv-bandwidth-gbs", type=float, default=None,
                   help="the fleet's KV transfer bandwidth (default: the simulator's, 40 GB/s); give the "
                        "conditional decider the same figure (bench/profiles/pd-conditional-100g.yaml)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--report-only", action="store_true", help="rewrite pd.md from pd.json")
    return p


async def _run(args: argparse.Namespace, command: str) -> list[PdFigures]:
    started = time.perf_counter()
    cores = len(os.sched_getaffinity(0))
    meta = {"command": command, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.node()} ({platform.machine()}, {cores} cores)", "seed": args.seed,
            "time_scale": args.time_scale, "kv_bandwidth_gbs": args.kv_bandwidth_gbs,
            "slo_ttft_ms": args.slo_ttft_ms, "slo_tpot_ms": args.slo_tpot_ms, "wall_s": 0.0}
    runs: list[PdFigures] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-pd-") as tmp:
        for workload in args.workloads:
            spec = PD_WORKLOADS[workload]
            if args.kv_bandwidth_gbs is not None:
                spec = dataclasses.replace(spec, fleet=dataclasses.replace(
                    spec.fleet, kv_bandwidth_gbs=args.kv_bandwidth_gbs))
            for fraction in args.fractions:
                for name in args.contenders or DEFAULT_RUNS[workload]:
                    print(f"[{workload}] {fraction:g} x {name} ...", flush=True)
                    try:
                        slo = (args.slo_ttft_ms, args.slo_tpot_ms)
                        run = await run_contender(spec, name, fraction, args.requests, args.time_scale,
                                                  args.seed, Path(tmp), slo)
                    except Exception as exc:  # one broken contender must not end the run
                        print(f"  FAILED: {type(exc).__name__}: {exc}"[:600], flush=True)
                        continue
                    print(f"  TTFT p90 {run.ttft_ms[1]:.0f} ms, TPOT p90 {run.tpot_ms[1]:.2f} ms, goodput "
                          f"{run.goodput:.2f}, split {run.remote_prefills}/{run.remote_decodes}, "
                          f"err {run.errors}, "
                          f"lag {run.lag_p99_sim_ms:.3f}", flush=True)
                    runs.append(run)
                    meta["wall_s"] = time.perf_counter() - started
                    args.results.mkdir(parents=True, exist_ok=True)
                    (args.results / "pd.json").write_text(json.dumps(
                        {"meta": meta, "runs": [asdict(r) for r in runs]}, indent=1))
                    (args.results / "pd.md").write_text(report(meta, runs))
    if runs:
        plot(runs, args.results / "pd.png")
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(given)
    if args.report_only:
        data = json.loads((args.results / "pd.json").read_text())
        runs = [PdFigures(**{**r, "ttft_ms": tuple(r["ttft_ms"]), "tpot_ms": tuple(r["tpot_ms"])})
                for r in data["runs"]]
        (args.results / "pd.md").write_text(report(data["meta"], runs))
        plot(runs, args.results / "pd.png")
        return 0
    names = args.contenders or [n for w in args.workloads for n in DEFAULT_RUNS[w]]
    missing = missing_tools([SHAPE.sub(r"\g<name>", n) for n in names])
    if missing:
        print(f"{', '.join(missing)} missing: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    asyncio.run(_run(args, "python -m kvgate.bench.pd " + shlex.join(given)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
