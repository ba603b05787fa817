"""Markdown tables and PNG plots of a workload's routing runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.bench.run_stats import RunFigures

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
        out.extend(cpu_table(runs))
    return "\n".join(out)


def cpu_table(runs: Sequence[RunFigures]) -> list[str]:
    """The routers' CPU over each run (real time), for runs that measured it."""
    measured = [f for f in runs if f.router_processes or not math.isnan(f.envoy_cores)]
    if not measured:
        return []
    out = [
        "CPU over the run (real time; the router: all of its processes, a kvgate supervisor and its Redis "
        "included, Envoy apart; per worker: that total over the serving processes):\n",
        "| contender | router workers | router cores | router µs / request | per worker, cores "
        "| Envoy cores |",
        "|---|---|---|---|---|---|",
    ]
    for f in measured:
        per_process = f.router_cores / f.router_processes if f.router_processes else float("nan")
        out.append(
            f"| {f.contender} | {f.router_processes or '-'} | {_f(f.router_cores, 2)} | "
            f"{_f(f.router_cpu_us, 0)} | {_f(per_process, 2)} | {_f(f.envoy_cores, 2)} |"
        )
    out.append("")
    return out


def _ratio(a: float, b: float) -> str:
    return "-" if math.isnan(a) or math.isnan(b) or b <= 0 else f"{a / b:.2f}"


@dataclass(frozen=True, slots=True)
class GoalComparison:
    """One rate of one workload: the subject's run and the runs the issue's goals compare it with.

    The best peer is the valid run with the lowest p90 TTFT among contenders that are neither kvgate
    nor an oracle (Envoy RR/LR, vllm-router, sglang-router); the oracle is the better of ``oracle``
    and ``oracle-spill`` where both ran. Invalid runs take no part."""

    rate: float
    subject: RunFigures | None
    best_peer: RunFigures | None
    round_robin: RunFigures | None
    oracle: RunFigures | None

    def p90_ratio(self, other: RunFigures | None) -> str:
        if self.subject is None or other is None:
            return "-"
        return _ratio(self.subject.ttft_p90_ms, other.ttft_p90_ms)

    def throughput_ratio(self) -> str:
        if self.subject is None or self.best_peer is None:
            return "-"
        return _ratio(self.subject.output_tok_s, self.best_peer.output_tok_s)


def compare(figures: Sequence[RunFigures], subject: str = "kvgate-default") -> list[GoalComparison]:
    """One :class:`GoalComparison` per offered rate, in rate order."""
    out: list[GoalComparison] = []
    for rate in sorted({f.rate for f in figures}):
        runs = {f.contender: f for f in figures
                if f.rate == rate and f.valid and not math.isnan(f.ttft_p90_ms)}
        peers = [f for name, f in runs.items() if not name.startswith(("kvgate", "oracle"))]
        oracles = [f for name, f in runs.items() if name.startswith("oracle")]
        out.append(GoalComparison(
            rate=rate, subject=runs.get(subject),
            best_peer=min(peers, key=lambda f: f.ttft_p90_ms, default=None),
            round_robin=runs.get("envoy-rr"),
            oracle=min(oracles, key=lambda f: f.ttft_p90_ms, default=None)))
    return out


def goals(figures: Sequence[RunFigures], subject: str = "kvgate-default") -> str:
    """Per rate: ``subject``'s p90 TTFT and throughput against the best peer, Envoy RR and the oracle
    (see :class:`GoalComparison`)."""
    out = ["| offered req/s | best peer | p90 TTFT / best peer | p90 TTFT / envoy-rr | p90 TTFT / oracle "
           "| tok/s / best peer's |", "|---|---|---|---|---|---|"]
    for c in compare(figures, subject):
        if c.subject is None:
            out.append(f"| {c.rate:,.0f} | - | ({subject} missing or invalid) | | | |")
            continue
        out.append(" | ".join([
            f"| {c.rate:,.0f}", c.best_peer.contender if c.best_peer else "-", c.p90_ratio(c.best_peer),
            c.p90_ratio(c.round_robin), c.p90_ratio(c.oracle), c.throughput_ratio()]) + " |")
    return "\n".join(out) + "\n"


def summary(reports: Sequence[tuple[str, Sequence[RunFigures]]], subject: str = "kvgate-default") -> str:
    """Every workload's runs side by side: a row per workload and rate, p90 TTFT (and output tok/s)
    per contender, then ``subject``'s ratios against the issue's goals. ``reports``: (workload, runs)."""
    names = list(dict.fromkeys(f.contender for _, figures in reports for f in figures))
    head = ["workload", "req/s (× cap.)", *names,
            "/ best peer", "/ envoy-rr", "/ oracle", "tok/s / best peer's"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for workload, figures in reports:
        for c in compare(figures, subject):
            at_rate = {f.contender: f for f in figures if f.rate == c.rate}
            fraction = next(iter(at_rate.values())).load_fraction
            cells = [workload, f"{c.rate:,.0f} ({fraction:.1f})"]
            for name in names:
                f = at_rate.get(name)
                if f is None:
                    cells.append("")
                elif not f.valid:
                    cells.append("(invalid)")
                else:
                    p90 = _f(f.ttft_p90_ms)
                    cells.append(f"**{p90}**" if f is c.subject else p90)
                    cells[-1] += f" ({_f(f.output_tok_s, 0)})"
            cells += [c.p90_ratio(c.best_peer), c.p90_ratio(c.round_robin), c.p90_ratio(c.oracle),
                      c.throughput_ratio()]
            out.append("| " + " | ".join(cells) + " |")
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
