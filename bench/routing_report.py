"""Markdown tables and PNG plots of a workload's routing runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from bench.run_stats import RunFigures

_COLUMNS = ("contender", "ok", "err", "shed", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "TPOT p50 ms",
            "TPOT p90 ms", "e2e p50 s", "e2e p90 s", "e2e p99 s", "out tok/s", "prefix hit %",
            "sim lag p99 ms", "valid", "policy check")


def _f(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def _row(f: RunFigures) -> str:
    cells = [f.contender, str(f.ok), str(f.errors), str(f.sheds), _f(f.ttft_p50_ms), _f(f.ttft_p90_ms),
             _f(f.ttft_p99_ms), _f(f.tpot_p50_ms, 2), _f(f.tpot_p90_ms, 2), _f(f.e2e_p50_s, 2),
             _f(f.e2e_p90_s, 2), _f(f.e2e_p99_s, 2), _f(f.output_tok_s, 0), _f(f.hit_rate * 100),
             _f(f.lag_p99_sim_ms, 3), "yes" if f.valid else "**INVALID**", f.policy_check]
    if not f.valid:  # an invalid run is reported, never quoted
        cells[4:13] = ["(invalid)"] * 9
    return "| " + " | ".join(cells) + " |"


def tables(figures: Sequence[RunFigures]) -> str:
    out: list[str] = []
    for rate in sorted({f.rate for f in figures}):
        runs = [f for f in figures if f.rate == rate]
        fraction = runs[0].load_fraction
        out.append(f"### Offered {rate:,.0f} req/s (simulated; {fraction:.2f} × capacity estimate)\n")
        out.append("| " + " | ".join(_COLUMNS) + " |")
        out.append("|" + "---|" * len(_COLUMNS))
        out.extend(_row(f) for f in runs)
        errors = [f"{f.contender}: {f.first_error}" for f in runs if f.first_error]
        if errors:
            out.append("\nFirst error per contender: " + "; ".join(errors))
        out.append("")
    return "\n".join(out)


def _ratio(a: float, b: float) -> str:
    return "-" if math.isnan(a) or math.isnan(b) or b <= 0 else f"{a / b:.2f}"


def goals(figures: Sequence[RunFigures], subject: str = "kvgate-default") -> str:
    """Per rate: ``subject``'s p90 TTFT and throughput against the best peer, Envoy RR and the oracle.

    The best peer is the valid run with the lowest p90 TTFT among contenders that are neither kvgate
    nor an oracle (Envoy RR/LR, vllm-router, sglang-router); the oracle column uses the better of
    ``oracle`` and ``oracle-spill`` where both ran."""
    out = ["| offered req/s | best peer | p90 TTFT / best peer | p90 TTFT / envoy-rr | p90 TTFT / oracle "
           "| tok/s / best peer's |", "|---|---|---|---|---|---|"]
    for rate in sorted({f.rate for f in figures}):
        runs = {f.contender: f for f in figures if f.rate == rate and f.valid}
        me = runs.get(subject)
        if me is None:
            out.append(f"| {rate:,.0f} | - | ({subject} missing or invalid) | | | |")
            continue
        peers = [f for name, f in runs.items() if not name.startswith(("kvgate", "oracle"))
                 and not math.isnan(f.ttft_p90_ms)]
        best = min(peers, key=lambda f: f.ttft_p90_ms, default=None)
        oracles = [f for name, f in runs.items()
                   if name.startswith("oracle") and not math.isnan(f.ttft_p90_ms)]
        rr, oracle = runs.get("envoy-rr"), min(oracles, key=lambda f: f.ttft_p90_ms, default=None)
        nan = float("nan")
        out.append(" | ".join([
            f"| {rate:,.0f}", best.contender if best else "-",
            _ratio(me.ttft_p90_ms, best.ttft_p90_ms if best else nan),
            _ratio(me.ttft_p90_ms, rr.ttft_p90_ms if rr else nan),
            _ratio(me.ttft_p90_ms, oracle.ttft_p90_ms if oracle else nan),
            _ratio(me.output_tok_s, best.output_tok_s if best else nan)]) + " |")
    return "\n".join(out) + "\n"


def plot(figures: Sequence[RunFigures], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ttft, ax_tput) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in dict.fromkeys(f.contender for f in figures):
        runs = sorted((f for f in figures if f.contender == name and f.valid), key=lambda f: f.rate)
        if not runs:
            continue
        rates = [f.rate for f in runs]
        ax_ttft.plot(rates, [f.ttft_p90_ms for f in runs], marker="o", label=name)
        ax_tput.plot(rates, [f.output_tok_s for f in runs], marker="o", label=name)
    ax_ttft.set_xlabel("offered rate (simulated req/s)")
    ax_ttft.set_ylabel("p90 TTFT (simulated ms)")
    ax_ttft.set_yscale("log")
    ax_ttft.grid(True, which="both", alpha=0.3)
    ax_tput.set_xlabel("offered rate (simulated req/s)")
    ax_tput.set_ylabel("output tokens/s (simulated)")
    ax_tput.grid(True, alpha=0.3)
    ax_ttft.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
