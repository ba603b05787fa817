"""Figures of one benchmark run (pure): percentiles in simulated time, throughput, validity.

Real seconds measured by the client are divided by the time scale (real seconds per simulated
second) to give simulated time. A run is valid when the simulator kept real time: its event-loop lag
p99 over the run, in simulated time, stays under ``LAG_LIMIT_SIM_MS``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvgate.bench.loadgen import RequestResult

LAG_LIMIT_SIM_MS = 1.0
"""Lag p99 (simulated ms) a valid run stays under: ~17 % of one 5.75 ms engine step. (The capacity
benchmark, bench/results/sim_capacity.md, accepted 5 ms at time scale 1: most of a step.)"""


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    data = sorted(v for v in values if not math.isnan(v))
    if not data:
        return float("nan")
    rank = max(1, math.ceil(q / 100.0 * len(data)))
    return data[min(rank, len(data)) - 1]


@dataclass(frozen=True, slots=True)
class RunFigures:
    workload: str
    contender: str
    rate: float  # offered, simulated requests/s
    load_fraction: float
    measured: int  # requests counted (after warm-up)
    ok: int
    errors: int
    sheds: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    output_tok_s: float  # simulated output tokens/s over the whole run
    hit_rate: float  # fleet prefix-cache hits / queries over the run
    lag_p99_sim_ms: float
    client_lag_p99_sim_ms: float
    valid: bool
    policy_check: str
    first_error: str
    router_cores: float = float("nan")
    """Cores the router's own processes used over the run (real time; workers included, Envoy apart)."""
    router_cpu_us: float = float("nan")
    """The router's CPU per request sent (real µs)."""
    router_processes: int = 0
    """The router's serving processes (kvgate's workers; a supervisor and its Redis are not counted)."""
    envoy_cores: float = float("nan")
    """Cores of the Envoy that a kvgate or plain-Envoy contender runs (NaN: none)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RouterCpu:
    """CPU seconds a contender's processes used during a run (real time)."""

    router_s: float
    router_processes: int
    envoy_s: float | None

    def figures(self, requests: int, wall_s: float) -> dict[str, Any]:
        wall = max(wall_s, 1e-9)
        nan = float("nan")
        return {
            "router_cores": self.router_s / wall if self.router_processes else nan,
            "router_cpu_us": self.router_s / max(1, requests) * 1e6 if self.router_processes else nan,
            "router_processes": self.router_processes,
            "envoy_cores": self.envoy_s / wall if self.envoy_s is not None else nan,
        }


def summarize(
    *,
    workload: str,
    contender: str,
    rate: float,
    load_fraction: float,
    results: Sequence[RequestResult],
    warmup: int,
    time_scale: float,
    wall_s: float,
    prefix_hits: float,
    prefix_queries: float,
    lag_p99_real_ms: float,
    policy_check: str,
    cpu: RouterCpu | None = None,
) -> RunFigures:
    """Figures over ``results[warmup:]`` (all results count for throughput)."""
    k = time_scale
    measured = [r for r in results if r.index >= warmup]
    good = [r for r in measured if r.ok]
    ttft = [r.ttft_s / k * 1000 for r in good]
    tpot = [(r.e2e_s - r.ttft_s) / k / (r.completion_tokens - 1) * 1000
            for r in good if r.completion_tokens > 1]
    e2e = [r.e2e_s / k for r in good]
    tokens = sum(r.completion_tokens for r in results if r.ok)
    lag_sim_ms = lag_p99_real_ms / k
    client_lag = percentile([r.send_lag_s for r in results], 99) / k * 1000
    errors = [r for r in measured if not r.ok]
    return RunFigures(
        workload=workload, contender=contender, rate=rate, load_fraction=load_fraction,
        measured=len(measured), ok=len(good), errors=sum(1 for r in errors if r.status != 429),
        sheds=sum(1 for r in errors if r.status == 429),
        ttft_p50_ms=percentile(ttft, 50), ttft_p90_ms=percentile(ttft, 90), ttft_p99_ms=percentile(ttft, 99),
        tpot_p50_ms=percentile(tpot, 50), tpot_p90_ms=percentile(tpot, 90),
        e2e_p50_s=percentile(e2e, 50), e2e_p90_s=percentile(e2e, 90), e2e_p99_s=percentile(e2e, 99),
        output_tok_s=tokens / (wall_s / k) if wall_s > 0 else 0.0,
        hit_rate=prefix_hits / prefix_queries if prefix_queries > 0 else float("nan"),
        lag_p99_sim_ms=lag_sim_ms, client_lag_p99_sim_ms=client_lag,
        valid=lag_sim_ms <= LAG_LIMIT_SIM_MS,
        policy_check=policy_check, first_error=errors[0].error[:120] if errors else "",
        **(cpu.figures(len(results), wall_s) if cpu is not None else {}),
    )


def figures_from_json(data: dict[str, Any]) -> RunFigures:
    return RunFigures(**data)
