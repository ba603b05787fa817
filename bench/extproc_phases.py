"""Where a request's time goes at concurrency 1, as Envoy sees it: the floor against kvgate.

``python -m kvgate.bench.extproc_phases [--rounds 5] [--seconds 4] [--endpoints 8] [--baseline DIR]
[--pause-ms MS] [--picker-args ARGS] [--lean-args ARGS] [--floor-loop LOOP] [--stream-tokens N]
[--output FILE]``

The same Envoy, upstream and processors as ``bench.datapath.onepass`` (``direct``, ``floor``,
``kvgate_lean`` and, with ``--baseline DIR``, ``baseline_lean``), each listener with a file access
log of Envoy's own per-request timings:

- ``request headers call`` / ``request body call``: the ext_proc filter's latency for each message,
  from Envoy sending it to Envoy holding the processor's reply (filter state
  ``envoy.filters.http.ext_proc``: gRPC both ways, grpc.aio and the processor's Python);
- ``before upstream``: from the request's first byte to the first byte sent upstream (the two calls,
  Envoy's filters, the route and the connection pool);
- ``upstream``: first byte sent upstream to the last byte received from it;
- ``total``: the request's first byte received to its response's last byte sent.

Non-streamed 1 KB ``/v1/completions`` bodies (``--stream-tokens N``: streamed ones of N tokens, one
chunk per token; the client's p50 is then to the last byte), one wrk connection, the paths
alternating within each of ``--rounds`` rounds (the order rotated each round: a path's place in it
showed in the figures); every figure is the median over the round's requests, then the median of
the rounds. ``envoy's own`` = before upstream − the two calls. The client's p50 (wrk) is beside
them: what Envoy does not see is the client and the kernel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.bench.datapath.envoy import POOL, direct_cluster, direct_listener
from kvgate.bench.datapath.full_duplex import load_average, machine, versions, wait_until_serving
from kvgate.bench.datapath.load import completion_bodies, run_wrk, write_bodies
from kvgate.bench.datapath.onepass import (
    FLOOR,
    LEAN,
    LEAN_ARGS,
    picker_clusters,
    processor_listener,
    stream_bodies,
)
from kvgate.bench.datapath.procs import (
    outcome_address,
    pools_yaml,
    start_null_picker,
    start_picker,
    start_upstream,
)
from kvgate.gateway.controlplane.envoy_clusters import PoolBackend, pool_clusters
from kvgate.gateway.controlplane.envoy_config import EXT_PROC_FILTER, JsonDict, bootstrap
from kvgate.gateway.processes import event_loop
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from kvgate.policies.types import FailureMode

PATHS = ("direct", "floor", "kvgate_lean", "baseline_lean")
_STATE = f"%FILTER_STATE({EXT_PROC_FILTER}:FIELD:"
LOG_FORMAT = {
    "headers_call": f"{_STATE}request_header_latency_us)%",
    "body_call": f"{_STATE}request_body_total_latency_us)%",
    "before_upstream": "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)%",
    "upstream": "%COMMON_DURATION(US_TX_BEG:US_RX_END:us)%",
    "after_upstream": "%COMMON_DURATION(US_RX_END:DS_TX_END:us)%",
    "total": "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%",
    "status": "%RESPONSE_CODE%",
}
"""One JSON line per request; the durations in µs (a phase that did not happen: ``-``/null)."""
LOG_WAIT_S = 15
COLUMNS = ("headers_call", "body_call", "envoy_own", "before_upstream", "upstream", "after_upstream", "total")


def timing_log(path: Path) -> JsonDict:
    return {
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(path),
            "log_format": {"json_format": LOG_FORMAT},
        },
    }


def with_log(listener: JsonDict, path: Path) -> JsonDict:
    """``listener`` (one filter chain, one HCM) with the timing log added to its HCM."""
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["access_log"] = [*hcm.get("access_log", []), timing_log(path)]
    return listener


def phases_bootstrap(
    admin: int, ports: Mapping[str, int], logs: Mapping[str, Path], endpoints: Sequence[str],
    pickers: Mapping[str, tuple[str, int]], outcomes: Mapping[str, tuple[str, int]],
) -> JsonDict:
    """Envoy with one logged listener per path; ``pickers``: processor address per ext_proc path
    (``outcomes``: where a lean one takes its outcome reports)."""
    settings = {"floor": FLOOR, "kvgate_lean": LEAN, "baseline_lean": LEAN}
    listeners = [with_log(direct_listener(ports["direct"]), logs["direct"])]
    clusters = [direct_cluster(endpoints), *pool_clusters(PoolBackend(POOL, FailureMode.FAIL_CLOSE))]
    for path, address in pickers.items():
        cluster = f"ext_proc_{path}"
        listeners.append(with_log(processor_listener(path, ports[path], cluster, settings[path]), logs[path]))
        clusters.extend(picker_clusters(cluster, address, outcomes.get(path)))
    return bootstrap(admin, listeners, clusters, node_id="kvgate-bench-phases")


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return float(value)
    return None


def phase_medians(lines: Sequence[str]) -> dict[str, float]:
    """Median µs of each phase over successful requests' log lines (``envoy_own`` derived)."""
    values: dict[str, list[float]] = {column: [] for column in COLUMNS}
    for line in lines:
        entry = json.loads(line)
        if str(entry.get("status")) != "200":
            continue
        got = {key: _number(entry.get(key)) for key in LOG_FORMAT if key != "status"}
        for key, value in got.items():
            if value is not None:
                values[key].append(value)
        before, headers, body = got["before_upstream"], got["headers_call"], got["body_call"]
        if before is not None and headers is not None and body is not None:
            values["envoy_own"].append(before - headers - body)
    return {column: statistics.median(found) for column, found in values.items() if found}


@dataclass(frozen=True)
class Round:
    path: str
    client_p50_us: float
    requests: int
    errors: int
    phases: dict[str, float]


def _size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def _lines_from(log: Path, start: int) -> list[str]:
    with log.open() as handle:
        handle.seek(start)
        return [line for line in handle.read().splitlines() if line.strip()]


async def measure(path: str, url: str, body_file: Path, log: Path, seconds: float, pause_ms: int) -> Round:
    start = await asyncio.to_thread(_size, log)
    result = await run_wrk(url, body_file, connections=1, seconds=seconds, pause_ms=pause_ms)
    lines: list[str] = []
    for _ in range(LOG_WAIT_S * 10):  # Envoy writes its file logs in batches: wait for every line
        lines = await asyncio.to_thread(_lines_from, log, start)
        if len(lines) >= result.requests:
            break
        await asyncio.sleep(0.1)
    return Round(path, result.p50_ms * 1000, result.requests, result.errors, phase_medians(lines))


async def run(args: argparse.Namespace) -> tuple[list[Round], dict[str, str]]:
    paths = [p for p in PATHS if p != "baseline_lean" or args.baseline is not None]
    extra = tuple(args.picker_args.split())
    header = {
        "command": " ".join(["python -m kvgate.bench.extproc_phases", *sys.argv[1:]]),
        **{f"machine {k}": v for k, v in machine().items()},
        **{f"version {k}": v for k, v in versions().items()},
        "endpoints": str(args.endpoints),
        "rounds": f"{args.rounds} × {args.seconds:g} s per path, alternating, the order rotated each round",
        "requests": (f"streamed, {args.stream_tokens} tokens, one chunk each (client p50: to the last byte)"
                     if args.stream_tokens else "1 KB, not streamed"),
        "pause between requests": f"{args.pause_ms} ms",
        "picker args": " ".join(extra) or "(none)",
        "kvgate_lean's own args": args.lean_args or "(none)",
        "floor's event loop": args.floor_loop,
    }
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-phases-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            upstream, endpoints = await start_upstream(args.endpoints)
            stack.push_async_callback(upstream.stop)
            pools = workdir / "pools.yaml"
            pools.write_text(pools_yaml(endpoints, POOL, args.profile))
            null_picker, null_address = await start_null_picker(endpoints[0], args.floor_loop)
            stack.push_async_callback(null_picker.stop)
            lean, lean_address, _ = await start_picker(
                "picker_lean", pools, workdir / "lean.log", (*LEAN_ARGS, *extra, *args.lean_args.split())
            )
            stack.push_async_callback(lean.stop)
            pickers = {"floor": null_address, "kvgate_lean": lean_address}
            outcomes = {"kvgate_lean": outcome_address(lean, lean_address)}
            if args.baseline is not None:
                baseline, baseline_address, _ = await start_picker(
                    "picker_baseline", pools, workdir / "baseline.log", (*LEAN_ARGS, *extra),
                    root=args.baseline,
                )
                stack.push_async_callback(baseline.stop)
                pickers["baseline_lean"] = baseline_address
                outcomes["baseline_lean"] = outcome_address(baseline, baseline_address)
            ports = {path: free_port() for path in paths}
            logs = {path: workdir / f"{path}.log" for path in paths}
            envoy = EnvoyProcess(
                phases_bootstrap(free_port(), ports, logs, endpoints, pickers, outcomes),
                EnvoyOptions(concurrency=1)
            )
            await envoy.start()
            stack.push_async_callback(envoy.stop)
            urls = {path: f"http://127.0.0.1:{port}" for path, port in ports.items()}
            bodies = (
                stream_bodies(args.stream_tokens, 64) if args.stream_tokens else completion_bodies(1024, 64)
            )
            body_file = write_bodies(workdir / "bodies.jsonl", bodies)
            for path in paths:
                await wait_until_serving(urls[path], completion_bodies(1024, 1)[0])
                await run_wrk(urls[path], body_file, connections=4, seconds=1)  # warm-up
            for index in range(args.rounds):
                shift = index % len(paths)  # each path takes each place in the order in turn
                for path in paths[shift:] + paths[:shift]:
                    found = await measure(
                        path, urls[path], body_file, logs[path], args.seconds, args.pause_ms
                    )
                    rounds.append(found)
                    print(f"round {index + 1} {path}: {_cells(found)}", file=sys.stderr, flush=True)
    header["load after"] = load_average()
    return rounds, header


def _cells(found: Round) -> str:
    phases = (f"{found.phases[c]:.0f}" if c in found.phases else "–" for c in COLUMNS)
    return " | ".join([f"{found.client_p50_us:.0f}", *phases])


def median_of_rounds(rounds: Sequence[Round], path: str) -> Round:
    mine = [r for r in rounds if r.path == path]
    columns = {c for r in mine for c in r.phases}
    return Round(
        path,
        statistics.median(r.client_p50_us for r in mine),
        sum(r.requests for r in mine),
        sum(r.errors for r in mine),
        {c: statistics.median(r.phases[c] for r in mine if c in r.phases) for c in columns},
    )


def render(rounds: Sequence[Round], header: Mapping[str, str]) -> str:
    paths = [p for p in PATHS if any(r.path == p for r in rounds)]
    lines = ["# ext_proc phases at concurrency 1 (µs, medians; Envoy's access log)", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    titles = ("client p50", "headers call", "body call", "envoy's own", "before upstream", "upstream",
              "after upstream", "total (envoy)")
    lines += ["", "| path | " + " | ".join(titles) + " | requests | errors |",
              "|---|" + "---|" * (len(titles) + 2)]
    for path in paths:
        found = median_of_rounds(rounds, path)
        lines.append(f"| {path} | {_cells(found)} | {found.requests} | {found.errors} |")
    lines += same_round_differences(rounds, paths)
    lines += ["", "Each round, in the order run (the same columns):", ""]
    for index, found in enumerate(rounds):
        lines.append(f"- {found.path} #{index // len(paths) + 1}: {_cells(found)}")
    return "\n".join(lines) + "\n"


def same_round_differences(rounds: Sequence[Round], paths: Sequence[str]) -> list[str]:
    """Each path minus the floor, and kvgate_lean minus baseline_lean, taken within each round
    (the machine's speed drifts between rounds), then the median: µs, and the rounds where the
    first is ahead (lower)."""
    groups = [
        {found.path: found for found in rounds[start : start + len(paths)]}
        for start in range(0, len(rounds), len(paths))
    ]
    pairs = [(path, "floor") for path in paths if path not in ("direct", "floor")]
    if "baseline_lean" in paths:
        pairs.append(("kvgate_lean", "baseline_lean"))
    titles = ("client p50", "headers call", "body call", "envoy's own", "upstream")
    keys = ("client", "headers_call", "body_call", "envoy_own", "upstream")
    lines = ["", "Differences within each round (median µs; rounds where the first is lower):", "",
             "| pair | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
    for first, second in pairs:
        cells = []
        for key in keys:
            differences = [
                _figure(group[first], key) - _figure(group[second], key)
                for group in groups
                if first in group and second in group
            ]
            found = [value for value in differences if not math.isnan(value)]
            if not found:
                cells.append("–")
                continue
            ahead = sum(1 for value in found if value < 0)
            cells.append(f"{statistics.median(found):+.0f} ({ahead} of {len(found)})")
        lines.append(f"| {first} − {second} | " + " | ".join(cells) + " |")
    return lines


def _figure(found: Round, key: str) -> float:
    if key == "client":
        return found.client_p50_us
    return found.phases.get(key, math.nan)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m kvgate.bench.extproc_phases", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--profile", default="default")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also run baseline_lean: kvgate_lean with the picker of another checkout")
    parser.add_argument("--pause-ms", type=int, default=0,
                        help="the client waits this long between a response and its next request")
    parser.add_argument("--picker-args", default="", help="more flags for the kvgate pickers")
    parser.add_argument("--lean-args", default="",
                        help="more flags for kvgate_lean's picker only (with --baseline: compare a flag "
                        "against the baseline's default, e.g. '--loop asyncio')")
    parser.add_argument("--floor-loop", choices=event_loop.CHOICES, default=event_loop.DEFAULT,
                        help="the floor processor's event loop (default: the picker's default)")
    parser.add_argument("--stream-tokens", type=int, default=0,
                        help="streamed requests of this many tokens (one SSE chunk each) instead of 1 KB")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    rounds, header = asyncio.run(run(args))
    text = render(rounds, header)
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
