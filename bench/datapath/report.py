"""The data-path benchmark's figures as Markdown (tables, same-run ratios, targets, profile)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvgate.bench.datapath.load import WrkResult
from kvgate.bench.datapath.profile import ProfileSummary

ANALYSIS_HEADING = "## Analysis"
"""Everything from this heading on in an existing report is hand-written and kept on re-runs."""

ADDED_P50_TARGET_MS = {"1 KB": 1.0, "200 KB": 5.0}
PICKER_RPS_TARGET = 1000.0
PROCESSES = ("envoy", "upstream", "picker_a", "picker_b", "null_picker", "wrk")


@dataclass(frozen=True, slots=True)
class Measurement:
    path: str
    size: str
    result: WrkResult
    cpu: dict[str, float]
    """Cores used by each process during the run."""

    def line(self) -> str:
        r = self.result
        return (
            f"{self.path:11} {self.size:6} c={r.connections:<3} {r.rps:8.0f} req/s "
            f"p50 {r.p50_ms:.3f} ms p99 {r.p99_ms:.3f} ms errors {r.errors}"
        )

    @property
    def picker_cores(self) -> float:
        if self.path == "kvgate":
            return self.cpu.get("picker_a", 0.0)
        if self.path == "kvgate_pair":
            return self.cpu.get("picker_a", 0.0) + self.cpu.get("picker_b", 0.0)
        if self.path == "null_extproc":
            return self.cpu.get("null_picker", 0.0)
        return 0.0

    @property
    def picker_cpu_us_per_request(self) -> float | None:
        """Processor CPU per request (µs); None on the direct path."""
        if self.picker_cores <= 0 or not self.result.rps:
            return None
        return self.picker_cores / self.result.rps * 1e6


@dataclass
class Report:
    command: str
    machine: dict[str, str]
    versions: dict[str, str]
    settings: dict[str, str]
    latency: list[Measurement] = field(default_factory=list)
    saturation: list[Measurement] = field(default_factory=list)
    profiled: Measurement | None = None
    profile: ProfileSummary | None = None
    notes: list[str] = field(default_factory=list)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def _median(items: Sequence[Measurement], stat: Callable[[WrkResult], float]) -> float:
    return statistics.median(stat(m.result) for m in items)


def _cpu_per_request(items: Sequence[Measurement]) -> str:
    values = [v for v in (m.picker_cpu_us_per_request for m in items) if v is not None]
    return f"{statistics.median(values):.0f}" if values else "–"


def _latency_section(report: Report) -> list[str]:
    out = ["## Latency at concurrency 1", ""]
    if not report.latency:
        return [*out, "(not measured)", ""]
    rounds = max(1, sum(1 for m in report.latency if m.path == "direct" and m.size == report.latency[0].size))
    out.append(f"Median over {rounds} round(s) per row; wrk, 1 connection, closed loop.")
    out.append("")
    rows = []
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for m in report.latency:
        groups.setdefault((m.size, m.path), []).append(m)
    for (size, path), items in groups.items():
        rows.append([
            size, path,
            f"{_median(items, lambda r: r.p50_ms):.3f}",
            f"{_median(items, lambda r: r.p90_ms):.3f}",
            f"{_median(items, lambda r: r.p99_ms):.3f}",
            f"{_median(items, lambda r: r.rps):.0f}",
            _cpu_per_request(items),
            str(sum(m.result.errors for m in items)),
        ])
    header = ["body", "path", "p50 ms", "p90 ms", "p99 ms", "req/s", "processor CPU µs/req", "errors"]
    out += _table(header, rows)
    out += ["", "Added over direct (same run); the target applies to kvgate:", ""]
    rows = []
    for size, target in ADDED_P50_TARGET_MS.items():
        direct = groups.get((size, "direct"))
        for path in ("null_extproc", "kvgate"):
            other = groups.get((size, path))
            if not direct or not other:
                continue
            p50 = _median(other, lambda r: r.p50_ms) - _median(direct, lambda r: r.p50_ms)
            p99 = _median(other, lambda r: r.p99_ms) - _median(direct, lambda r: r.p99_ms)
            ratio = _median(other, lambda r: r.p50_ms) / _median(direct, lambda r: r.p50_ms)
            verdict = ("met" if p50 <= target else "MISSED") if path == "kvgate" else "(floor)"
            rows.append([size, path, f"{p50:+.3f}", f"{p99:+.3f}", f"{ratio:.2f}×",
                         f"≤ {target:g} ms: {verdict}"])
    out += _table(["body", "path", "added p50 ms", "added p99 ms", "p50 / direct p50", "target (p50)"], rows)
    return [*out, ""]


def _saturation_section(report: Report) -> list[str]:
    out = ["## Saturation throughput", ""]
    if not report.saturation:
        return [*out, "(not measured)", ""]
    out.append(
        "Closed loop (wrk, 1 thread). CPU columns: cores each process used during the run "
        "(1.00 = one core busy the whole time; the machine has "
        f"{report.machine.get('nproc', '?')}). req/s per processor core = req/s ÷ cores of the "
        "ext_proc processor(s) of that path."
    )
    out.append("")
    present = [p for p in PROCESSES if any(p in m.cpu for m in report.saturation)]
    rows = []
    for m in report.saturation:
        r = m.result
        per_core = f"{r.rps / m.picker_cores:.0f}" if m.picker_cores > 0.05 else "–"
        rows.append([
            m.size, m.path, str(r.connections), f"{r.rps:.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}",
            str(r.errors), *[f"{m.cpu.get(p, 0.0):.2f}" for p in present], per_core,
        ])
    header = [
        "body", "path", "conns", "req/s", "p50 ms", "p99 ms", "errors", *present, "req/s per processor core"
    ]
    out += _table(header, rows)
    out += ["", "Same-run ratios (best concurrency of each path):", ""]
    best: dict[tuple[str, str], Measurement] = {}
    for m in report.saturation:
        key = (m.size, m.path)
        if key not in best or m.result.rps > best[key].result.rps:
            best[key] = m
    rows = []
    for size in ADDED_P50_TARGET_MS:
        direct, one, pair, null = (
            best.get((size, p)) for p in ("direct", "kvgate", "kvgate_pair", "null_extproc")
        )
        if direct is None or one is None:
            continue
        row = [size, f"{direct.result.rps:.0f}", f"{null.result.rps:.0f}" if null else "–",
               f"{one.result.rps:.0f}", f"{one.result.rps / direct.result.rps:.2f}"]
        if pair is not None:
            row += [f"{pair.result.rps:.0f}", f"{pair.result.rps / one.result.rps:.2f}"]
        else:
            row += ["–", "–"]
        one_per_core = one.result.rps / one.picker_cores if one.picker_cores > 0.05 else 0.0
        verdict = "met" if one.result.rps >= PICKER_RPS_TARGET else "MISSED"
        row.append(f"{one.result.rps:.0f} measured ({verdict}), {one_per_core:.0f} per picker core")
        rows.append(row)
    out += _table(
        ["body", "direct req/s", "null_extproc req/s", "kvgate req/s", "kvgate/direct", "2 pickers req/s",
         "2 pickers / 1",
         f"per picker process (target ≥ {PICKER_RPS_TARGET:.0f})"],
        rows,
    )
    return [*out, ""]


def _profile_section(report: Report) -> list[str]:
    out = ["## Where one picker's time goes (py-spy, at saturation)", ""]
    summary = report.profile
    if summary is None or summary.samples == 0:
        return [*out, "(no profile)", ""]
    if report.profiled is not None:
        out.append(f"Profiled run (not used for the figures above): {report.profiled.line()}, "
                   f"picker_a {report.profiled.cpu.get('picker_a', 0.0):.2f} cores.")
    out.append(f"{summary.samples} samples of the picker's Python threads (py-spy --nonblocking; time in "
               "C code, e.g. upb protobuf or grpc core, counts for the Python frame that called it).")
    out += ["", "Self time by area:", ""]
    out += _table(["area", "share"], [[a, f"{s:.1%}"] for a, s in summary.self_by_area])
    out += ["", "Self time by function (top):", ""]
    out += _table(["function", "share"], [[f"`{f}`", f"{s:.1%}"] for f, s in summary.self_by_function])
    out += ["", "Inclusive time of kvgate's own code (ext_proc, policies, scraper parsing, telemetry):", ""]
    out += _table(["function", "share"], [[f"`{f}`", f"{s:.1%}"] for f, s in summary.inclusive_by_function])
    return [*out, ""]


def render(report: Report, analysis: str = "") -> str:
    out = ["# Data-path overhead: Envoy direct vs Envoy + kvgate picker", ""]
    out += [f"Command: `{report.command}`", ""]
    out += [f"- Machine: {report.machine.get('cpu', '?')}, nproc {report.machine.get('nproc', '?')}, "
            f"kernel {report.machine.get('kernel', '?')}; load average before "
            f"{report.machine.get('load_before', '?')}, after {report.machine.get('load_after', '?')}"]
    out += ["- Versions: " + ", ".join(f"{k} {v}" for k, v in report.versions.items())]
    out += [f"- {k}: {v}" for k, v in report.settings.items()]
    out += ["", *_latency_section(report), *_saturation_section(report), *_profile_section(report)]
    out += [f"- {note}" for note in report.notes]
    text = "\n".join(out).rstrip() + "\n"
    if analysis:
        text += "\n" + analysis.strip() + "\n"
    return text


def kept_analysis(existing: str) -> str:
    """The hand-written part of an existing report (from :data:`ANALYSIS_HEADING` on)."""
    index = existing.find(ANALYSIS_HEADING)
    return existing[index:] if index >= 0 else ""
