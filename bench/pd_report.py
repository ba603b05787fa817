"""The disaggregated-serving benchmark's results page (``bench.pd``): one table per workload and
offered rate, each P/D contender against aggregated kvgate and against vllm-router's P/D mode on the
same split (ratios of one run), and a plot of p90 TTFT and TPOT against the offered load."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate.bench.run_stats import LAG_LIMIT_SIM_MS
from kvgate.bench.workloads import PD_WORKLOADS

SHAPE = re.compile(r"^(?P<name>.+)@(?P<p>\d+)p(?P<d>\d+)d$")


@dataclass(frozen=True, slots=True)
class PdFigures:
    workload: str
    contender: str
    fleet: str  # "8 both" or "3 prefill + 5 decode"
    rate: float
    load_fraction: float
    measured: int
    ok: int
    errors: int
    ttft_ms: tuple[float, float, float]  # p50, p90, p99
    tpot_ms: tuple[float, float, float]
    goodput: float  # requests/s (simulated) within the SLO
    slo_met: float  # share of measured requests within the SLO
    remote_prefills: int  # prefills the fleet ran for a remote decode
    remote_decodes: int  # decodes that read a remote prefill's KV (fewer: prefills whose answer was lost)
    lag_p99_sim_ms: float
    valid: bool
    check: str
    first_error: str
    router_cpu_us: float = float("nan")
    """The router's CPU per request (real µs; kvgate: the picker, which runs the prefill calls)."""
    envoy_cpu_us: float = float("nan")
    """Envoy's CPU per request (real µs; kvgate only)."""


def _f(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def report(meta: dict[str, Any], runs: Sequence[PdFigures]) -> str:
    """The results page (markdown)."""
    lines = [
        "# Disaggregated prefill/decode: P/D kvgate against aggregated serving",
        "",
        f"- Command: `{meta['command']}`, {meta['date']}, {meta['machine']}; "
        f"wall {meta['wall_s'] / 60:.1f} min.",
        "- Fleet: `python -m kvgate.simulator` (BLIS Llama-3.1-8B/H100 step model; KV transfers at "
        + (f"{meta['kv_bandwidth_gbs']:g} GB/s, the simulator's other defaults"
           if meta.get("kv_bandwidth_gbs") else "the simulator's defaults")
        + ", docs/simulator.md), restarted cold for every run; the same Poisson plan "
        f"(seed {meta['seed']}) for every contender of a workload; time scale {meta['time_scale']}: "
        "all figures are simulated time.",
        f"- SLO: TTFT ≤ {meta['slo_ttft_ms']:g} ms and TPOT ≤ {meta['slo_tpot_ms']:g} ms; goodput = requests "
        "per simulated second within both. Valid run: simulator loop lag p99 ≤ "
        f"{LAG_LIMIT_SIM_MS} simulated ms.",
        "- Plot: pd.png (p90 TTFT and TPOT against the offered load).",
        "- `split`: prefills the fleet ran for a remote decode / decodes that read their KV (a P/D "
        "contender's split, checked; fewer decodes than prefills: prefills whose answer was not used).",
        "",
    ]
    for workload in dict.fromkeys(r.workload for r in runs):
        spec = PD_WORKLOADS[workload]
        lines += [f"## {workload}: {spec.description}", ""]
        for rate in sorted({r.rate for r in runs if r.workload == workload}):
            these = [r for r in runs if r.workload == workload and r.rate == rate]
            lines += [f"### Offered {rate:g} req/s ({these[0].load_fraction:g} × the aggregated capacity "
                      "estimate)", "",
                      "| contender | fleet | ok | err | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms "
                      "| goodput req/s | within SLO | split | router / Envoy CPU µs per request "
                      "| lag p99 ms | valid |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in these:
                ttft = " / ".join(_f(v, 0) for v in r.ttft_ms)
                tpot = " / ".join(_f(v, 2) for v in r.tpot_ms)
                lines.append(f"| {r.contender} | {r.fleet} | {r.ok} | {r.errors} | {ttft} | {tpot} | "
                             f"{r.goodput:.2f} | {r.slo_met * 100:.0f} % | "
                             f"{r.remote_prefills} / {r.remote_decodes} | "
                             f"{_f(r.router_cpu_us, 0)} / {_f(r.envoy_cpu_us, 0)} | "
                             f"{r.lag_p99_sim_ms:.3f} | {'yes' if r.valid else '**INVALID**'} |")
            errors = [f"{r.contender}: {r.first_error}" for r in these if r.first_error]
            if errors:
                lines += ["", "First error: " + "; ".join(errors)]
            lines += ["", "Policy checks: " + "; ".join(f"{r.contender}: {r.check}" for r in these), ""]
            lines += comparisons(these)
    return "\n".join(lines) + "\n"


def _shape(name: str) -> str:
    match = SHAPE.match(name)
    return f"{match.group('p')}p{match.group('d')}d" if match else ""


def comparisons(runs: Sequence[PdFigures]) -> list[str]:
    """Per P/D kvgate run: its p90 TTFT and TPOT and its goodput over aggregated kvgate's in the same
    workload and rate (``kvgate-default``, on the whole fleet or, ``@0pNd``, on the decode instances
    alone), and over vllm-router's P/D mode on the same split; markdown table lines."""
    base = next((r for r in runs if r.contender.partition("@")[0] == "kvgate-default"), None)
    rows = []
    for r in runs:
        shape = _shape(r.contender)
        if not shape or not r.contender.startswith("kvgate-") or r is base:
            continue
        router = next((v for v in runs if v.contender == f"vllm-router-pd@{shape}"), None)
        cells = []
        for other in (base, router):
            if other is None or not other.ok:
                cells.append("- | - | -")
                continue
            cells.append(" | ".join((
                _ratio(r.ttft_ms[1], other.ttft_ms[1]), _ratio(r.tpot_ms[1], other.tpot_ms[1]),
                _ratio(r.goodput, other.goodput))))
        rows.append(f"| {r.contender} | {cells[0]} | {cells[1]} |")
    if not rows:
        return []
    aggregated = base.contender if base else "-"
    return [f"Ratios (this run): P/D kvgate over aggregated kvgate (`{aggregated}`) and over vllm-router's "
            "P/D mode on the same split; below 1 is better for TTFT and TPOT, above 1 for goodput.", "",
            "| contender | TTFT p90 × agg. | TPOT p90 × agg. | goodput × agg. | TTFT p90 × vllm-router "
            "| TPOT p90 × vllm-router | goodput × vllm-router |",
            "|---|---|---|---|---|---|---|", *rows, ""]


def _ratio(a: float, b: float) -> str:
    return "-" if not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}"


def plot(runs: Sequence[PdFigures], path: Path) -> None:
    """p90 TTFT and p90 TPOT against the offered load, one row per workload, a line per contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in runs))
    fig, axes = plt.subplots(len(workloads), 2, figsize=(12, 3.8 * len(workloads)), squeeze=False)
    for (ax_ttft, ax_tpot), workload in zip(axes, workloads, strict=True):
        these = [r for r in runs if r.workload == workload and r.valid and r.ok]
        for name in dict.fromkeys(r.contender for r in these):
            mine = sorted((r for r in these if r.contender == name), key=lambda r: r.load_fraction)
            loads = [r.load_fraction for r in mine]
            style = "--" if name.startswith("vllm-router") else "-"
            ax_ttft.plot(loads, [r.ttft_ms[1] for r in mine], style, marker="o", label=name)
            ax_tpot.plot(loads, [r.tpot_ms[1] for r in mine], style, marker="o", label=name)
        ax_ttft.set_title(f"{workload}: p90 TTFT")
        ax_tpot.set_title(f"{workload}: p90 TPOT")
        for ax, unit in ((ax_ttft, "simulated ms"), (ax_tpot, "simulated ms per token")):
            ax.set_xlabel("offered load (× aggregated capacity estimate)")
            ax.set_ylabel(unit)
            ax.grid(True, alpha=0.3)
        ax_ttft.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
