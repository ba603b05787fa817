"""Data-path cost of one pick, in one run: Envoy straight to the upstream, the one-pass floor
processor, kvgate's one-pass data path and kvgate in GIE's full-duplex mode.

``python -m kvgate.bench.datapath.onepass [--quick] [--endpoints 8] [--paths kvgate_lean ...]
[--latency-rounds N] [--picker-args ARGS] [--baseline DIR] [--profile-dir DIR]
[--output bench/results/datapath.md]``

One Envoy (``--envoy-concurrency`` workers) with one listener per path, all to the same fast
upstream (bench/datapath/upstream.py: ``--endpoints`` ports with vLLM metrics pages, so the default
profile's full scheduling runs over live endpoints; streams of one SSE chunk per token):

- ``direct``: router → round robin over the endpoints (no ext_proc);
- ``floor``: the one-pass null processor (bench/datapath/null_picker.py): request headers SEND,
  request body BUFFERED, response phases SKIP/NONE; it parses the JSON body and answers with the
  destination header and ``clear_route_cache``: the grpc.aio + Envoy floor for a Python picker;
- ``kvgate``: kvgate's filter chain as ``kvgate up`` writes it
  (``gateway.controlplane.envoy_config.ONE_PASS``) in front of one ``kvgate picker`` process;
- ``kvgate_gie``: the same picker process behind GIE's processing mode (full duplex both ways), as
  the Inference Extension's gateways configure a picker;
- ``kvgate_tpm``: kvgate's one pass to a second pool of the same endpoints with a tokens-per-minute
  limit (``rateLimits``), whose responses the picker must read for their usage (load phase only);
- ``kvgate_lean``: kvgate's one pass to a second picker process run with ``--skip-unread-responses
  --outcome-reports``, as ``kvgate up --skip-unread-responses`` runs it (requests skip the
  response-headers round trip: one message fewer each way; Envoy's gRPC access log reports their
  outcomes to the picker in batches);
- ``baseline_lean`` (with ``--baseline DIR``): ``kvgate_lean`` with the picker of another checkout,
  e.g. ``git worktree add /tmp/before <commit>``: a change's effect measured within one run.

Phases: latency at concurrency 1 (wrk for non-streamed bodies; an aiohttp client for the 64-token
stream's time to first byte and to the last byte), then closed-loop load at ``--connections`` with
each processor's CPU per request (its process's CPU seconds over the requests served). Prints the
Markdown report and writes it to ``--output``. ``--paths`` runs only the paths named (``direct`` and
``floor`` always run: every figure is read against them); ``--latency-rounds N`` repeats the
concurrency-1 phase N times with the paths alternating (in an order rotated each round) and reports
the median of the rounds' p50s
(this machine's speed drifts within minutes); ``--profile-dir`` records each processor
with py-spy during its closed-loop 1 KB run (``bench.datapath.profile`` summarises the stacks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kvgate.bench.datapath import profile as datapath_profile
from kvgate.bench.datapath.envoy import BODY_LIMIT, POOL, direct_cluster, direct_listener
from kvgate.bench.datapath.full_duplex import load_average, machine, versions, wait_until_serving
from kvgate.bench.datapath.load import completion_bodies, run_wrk, write_bodies
from kvgate.bench.datapath.procs import (
    Child,
    cpu_snapshot,
    outcome_address,
    pools_yaml,
    start_null_picker,
    start_picker,
    start_upstream,
)
from kvgate.gateway.controlplane.envoy_clusters import PoolBackend, ext_proc_cluster, pool_clusters
from kvgate.gateway.controlplane.envoy_config import (
    EXT_PROC_FILTER,
    ONE_PASS,
    ExtProcSettings,
    JsonDict,
    RouteSpec,
    bootstrap,
    http_connection_manager,
    listener,
    pool_routes,
    route_configuration,
)
from kvgate.gateway.processes import event_loop
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from kvgate.policies.types import FailureMode

PATHS = ("direct", "floor", "kvgate", "kvgate_gie")
LATENCY_PATHS = (*PATHS, "kvgate_lean", "baseline_lean")
LOAD_PATHS = (*PATHS, "kvgate_tpm", "kvgate_lean", "baseline_lean")
PROCESSOR = {"floor": "null_picker", "kvgate": "picker", "kvgate_gie": "picker", "kvgate_tpm": "picker",
             "kvgate_lean": "picker_lean", "baseline_lean": "picker_baseline"}
TPM_POOL = "bench_tpm"
LEAN_ARGS = ("--skip-unread-responses", "--outcome-reports")
"""The lean pickers' flags: as ``kvgate up`` runs its picker."""
LEAN = dataclasses.replace(ONE_PASS, outcome_reports=True)
"""The lean paths' ext_proc settings: as ``kvgate up`` writes them."""
FLOOR = ExtProcSettings(
    request_body_mode="BUFFERED", response_body_mode="NONE", send_served_endpoint=False,
    max_body_bytes=BODY_LIMIT,
)
GIE = ExtProcSettings(max_body_bytes=BODY_LIMIT)


@dataclass(frozen=True, slots=True)
class Plan:
    latency_s: float
    stream_requests: int
    load_s: float
    connections: int
    warmup_s: float


QUICK = Plan(latency_s=4, stream_requests=150, load_s=5, connections=8, warmup_s=1)
FULL = Plan(latency_s=8, stream_requests=400, load_s=10, connections=8, warmup_s=2)


@dataclass
class Row:
    path: str
    case: str
    p50_ms: float = 0.0
    p99_ms: float | None = None
    """Closed-loop runs: wrk's p99."""
    ttft_p50_ms: float | None = None
    rps: float = 0.0
    cpu_us_per_request: float | None = None
    errors: int = 0
    cpu_cores: dict[str, float] = field(default_factory=dict)


def processor_listener(
    name: str, port: int, cluster: str, settings: ExtProcSettings, pool_name: str = POOL
) -> JsonDict:
    settings = dataclasses.replace(settings, cluster_name=cluster, outcome_cluster_name=f"{cluster}_outcomes",
                                   max_body_bytes=BODY_LIMIT)
    pool = PoolBackend(pool_name, FailureMode.FAIL_CLOSE)
    routes = pool_routes(RouteSpec(name=name, pool=pool_name), pool, settings)
    hcm = http_connection_manager(name, route_configuration(name, routes), settings)
    if settings.response_body_mode == "NONE" and not settings.send_served_endpoint:
        # the floor: response phases skipped entirely
        ext_proc = next(f for f in hcm["typed_config"]["http_filters"] if f["name"] == EXT_PROC_FILTER)
        ext_proc["typed_config"]["processing_mode"]["response_header_mode"] = "SKIP"
    return listener(name, "127.0.0.1", port, hcm, BODY_LIMIT)


def picker_clusters(
    cluster: str, picker: tuple[str, int], outcomes: tuple[str, int] | None = None
) -> list[JsonDict]:
    """A :func:`processor_listener`'s clusters: the picker's ext_proc port, and where it takes
    outcome reports (``outcomes``; unused by a listener without them)."""
    return [ext_proc_cluster([picker], name=cluster),
            ext_proc_cluster([outcomes or picker], name=f"{cluster}_outcomes")]


def onepass_bootstrap(
    admin: int, ports: dict[str, int], endpoints: Sequence[str], picker: tuple[str, int],
    null_picker: tuple[str, int], lean_picker: tuple[str, int], lean_outcomes: tuple[str, int] | None,
    baseline_picker: tuple[str, int] | None = None, baseline_outcomes: tuple[str, int] | None = None,
) -> JsonDict:
    listeners = [
        direct_listener(ports["direct"]),
        processor_listener("floor", ports["floor"], "ext_proc_null", FLOOR),
        processor_listener("kvgate", ports["kvgate"], "ext_proc_kvgate", ONE_PASS),
        processor_listener("kvgate_gie", ports["kvgate_gie"], "ext_proc_kvgate", GIE),
        processor_listener("kvgate_tpm", ports["kvgate_tpm"], "ext_proc_kvgate", ONE_PASS, TPM_POOL),
        processor_listener("kvgate_lean", ports["kvgate_lean"], "ext_proc_lean", LEAN),
    ]
    clusters = [
        direct_cluster(endpoints),
        ext_proc_cluster([null_picker], name="ext_proc_null"),
        ext_proc_cluster([picker], name="ext_proc_kvgate"),
        *picker_clusters("ext_proc_lean", lean_picker, lean_outcomes),
        *pool_clusters(PoolBackend(POOL, FailureMode.FAIL_CLOSE)),
        *pool_clusters(PoolBackend(TPM_POOL, FailureMode.FAIL_CLOSE)),
    ]
    if baseline_picker is not None:
        listeners.append(
            processor_listener("baseline_lean", ports["baseline_lean"], "ext_proc_baseline", LEAN)
        )
        clusters.extend(picker_clusters("ext_proc_baseline", baseline_picker, baseline_outcomes))
    return bootstrap(admin, listeners, clusters, node_id="kvgate-bench-onepass")


def pools_with_token_limit(endpoints: Sequence[str], profile: str) -> str:
    """The benchmark's pool, and the same endpoints again as a pool with a tokens-per-minute limit."""
    text = pools_yaml(endpoints, POOL, profile)
    limited = pools_yaml(endpoints, TPM_POOL, profile).replace("pools:\n", "")
    limited += "    rateLimits:\n      tokensPerMinute: 1000000000000\n"
    return text + limited


def stream_bodies(tokens: int, count: int) -> list[bytes]:
    out = []
    for body in completion_bodies(1024, count):
        document = json.loads(body)
        document.update(stream=True, max_tokens=tokens)
        out.append(json.dumps(document, separators=(",", ":")).encode())
    return out


async def stream_latency(url: str, bodies: Sequence[bytes], requests: int) -> tuple[float, float, int]:
    """Sequential streamed requests: p50 ms to the first body byte and to the last byte, errors."""
    firsts: list[float] = []
    lasts: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as session:
        for index in range(requests):
            started = time.perf_counter()
            async with session.post(
                f"{url}/v1/completions", data=bodies[index % len(bodies)],
                headers={"content-type": "application/json"},
            ) as response:
                first: float | None = None
                async for _chunk in response.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                end = time.perf_counter()
                if response.status != 200 or first is None:
                    errors += 1
                    continue
            firsts.append((first - started) * 1000)
            lasts.append((end - started) * 1000)
    return statistics.median(firsts), statistics.median(lasts), errors


async def load(
    url: str, body_file: Path, connections: int, seconds: float, pids: dict[str, int], path: str, case: str,
    processor: str | None = None, profile: Path | None = None,
) -> Row:
    """One wrk run; ``processor`` (default: ``PROCESSOR[path]``) is the process whose CPU per
    request is reported; ``profile``: py-spy records it over the run's middle into that file."""
    processor = processor or PROCESSOR.get(path)
    before = cpu_snapshot(pids)
    started = time.monotonic()
    wrk = run_wrk(url, body_file, connections=connections, seconds=seconds)
    if profile is not None and processor is not None:
        record = datapath_profile.record(pids[processor], max(1.0, seconds - 2), profile)
        result, _ = await asyncio.gather(wrk, _after(1.0, record))
    else:
        result = await wrk
    wall = time.monotonic() - started
    after = cpu_snapshot(pids)
    row = Row(path, case, p50_ms=result.p50_ms, p99_ms=result.p99_ms, rps=result.requests / result.duration_s,
              errors=result.errors)
    row.cpu_cores = {name: (after[name] - before[name]) / wall for name in pids}
    row.cpu_cores["wrk"] = result.wrk_cpu
    if processor is not None:
        row.cpu_cores["processor"] = row.cpu_cores[processor]
    if processor is not None and result.requests:
        row.cpu_us_per_request = (after[processor] - before[processor]) / result.requests * 1e6
    return row


def chosen(paths: Sequence[str], wanted: Sequence[str] | None) -> tuple[str, ...]:
    """``paths`` restricted to ``wanted`` (None: all), ``direct`` and ``floor`` always kept."""
    if wanted is None:
        return tuple(paths)
    return tuple(p for p in paths if p in ("direct", "floor") or p in wanted)


async def run(args: argparse.Namespace) -> tuple[list[Row], dict[str, str]]:
    plan = QUICK if args.quick else FULL
    if args.connections:
        plan = dataclasses.replace(plan, connections=args.connections)
    # baseline_lean runs exactly when --baseline is given, whatever --paths names
    wanted = None if args.paths is None else [*args.paths, "baseline_lean"]
    unwanted = () if args.baseline is not None else ("baseline_lean",)
    latency_paths = tuple(p for p in chosen(LATENCY_PATHS, wanted) if p not in unwanted)
    load_paths = tuple(p for p in chosen(LOAD_PATHS, wanted) if p not in unwanted)
    rows: list[Row] = []
    header = {
        "command": " ".join(["python -m kvgate.bench.datapath.onepass", *sys.argv[1:]]),
        **{f"machine {k}": v for k, v in machine().items()},
        **{f"version {k}": v for k, v in versions().items()},
        "endpoints": str(args.endpoints),
        "envoy concurrency": str(args.envoy_concurrency),
        "plan": str(plan),
        "latency rounds": str(args.latency_rounds),
        "floor's event loop": args.floor_loop,
    }
    with tempfile.TemporaryDirectory(prefix="kvgate-onepass-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            upstream, endpoints = await start_upstream(args.endpoints)
            stack.push_async_callback(upstream.stop)
            pools = workdir / "pools.yaml"
            pools.write_text(pools_with_token_limit(endpoints, args.profile))
            extra = tuple(args.picker_args.split())
            children: list[Child] = [upstream]
            picker_address = lean_address = ("127.0.0.1", 1)  # a path not run: nothing listens
            lean_outcomes = baseline_outcomes = None
            if {"kvgate", "kvgate_gie", "kvgate_tpm"} & set(load_paths):
                picker, picker_address, _ = await start_picker("picker", pools, workdir / "picker.log", extra)
                stack.push_async_callback(picker.stop)
                children.append(picker)
            null_picker, null_address = await start_null_picker(endpoints[0], args.floor_loop)
            stack.push_async_callback(null_picker.stop)
            children.append(null_picker)
            if "kvgate_lean" in load_paths:
                lean, lean_address, _ = await start_picker(
                    "picker_lean", pools, workdir / "picker_lean.log", (*LEAN_ARGS, *extra)
                )
                stack.push_async_callback(lean.stop)
                children.append(lean)
                lean_outcomes = outcome_address(lean, lean_address)
            baseline_address = None
            if args.baseline is not None:
                baseline, baseline_address, _ = await start_picker(
                    "picker_baseline", pools, workdir / "picker_baseline.log", (*LEAN_ARGS, *extra),
                    root=args.baseline,
                )
                stack.push_async_callback(baseline.stop)
                children.append(baseline)
                baseline_outcomes = outcome_address(baseline, baseline_address)
            ports = {path: free_port() for path in LOAD_PATHS}
            envoy = EnvoyProcess(
                onepass_bootstrap(free_port(), ports, endpoints, picker_address, null_address, lean_address,
                                  lean_outcomes, baseline_address, baseline_outcomes),
                EnvoyOptions(concurrency=args.envoy_concurrency),
            )
            await envoy.start()
            stack.push_async_callback(envoy.stop)
            pids = {child.name: child.pid for child in children} | {"envoy": envoy.pid or 0}
            urls = {path: f"http://127.0.0.1:{port}" for path, port in ports.items()}
            files = {
                "1 KB": write_bodies(workdir / "b1k.jsonl", completion_bodies(1024, 64)),
                "200 KB": write_bodies(workdir / "b200k.jsonl", completion_bodies(200 * 1024, 8)),
                "stream 64": write_bodies(workdir / "s64.jsonl", stream_bodies(64, 64)),
                "stream 256": write_bodies(workdir / "s256.jsonl", stream_bodies(256, 64)),
            }
            for path in load_paths:
                await wait_until_serving(urls[path], completion_bodies(1024, 1)[0])
            for path in load_paths:  # warm-up
                await load(urls[path], files["1 KB"], 4, plan.warmup_s, pids, path, "warm-up")
                await load(urls[path], files["stream 64"], 4, plan.warmup_s, pids, path, "warm-up")
            stream64 = stream_bodies(64, 64)
            rounds: list[Row] = []
            for index in range(args.latency_rounds):  # the paths alternate within each round,
                shift = index % len(latency_paths)  # each taking each place in turn (a fixed order
                for path in latency_paths[shift:] + latency_paths[:shift]:  # biased: extproc_phases.md)
                    for case in ("1 KB", "200 KB"):
                        row = await load(
                            urls[path], files[case], 1, plan.latency_s, pids, path, f"c=1 {case}"
                        )
                        rounds.append(row)
                        print(_line(row), file=sys.stderr, flush=True)
                    ttft, last, errors = await stream_latency(urls[path], stream64, plan.stream_requests)
                    rounds.append(Row(path, "c=1 stream 64", p50_ms=last, ttft_p50_ms=ttft, errors=errors))
                    print(_line(rounds[-1]), file=sys.stderr, flush=True)
            rows.extend(median_rows(rounds))
            for case in ("1 KB", "stream 64", "stream 256"):
                for path in load_paths:
                    profile = (
                        args.profile_dir / f"{path}-{case.replace(' ', '')}.txt"
                        if args.profile_dir is not None and case == "1 KB" and path != "direct" else None
                    )
                    row = await load(
                        urls[path], files[case], plan.connections, plan.load_s, pids, path,
                        f"c={plan.connections} {case}", profile=profile,
                    )
                    rows.append(row)
                    print(_line(row), file=sys.stderr, flush=True)
    header["load after"] = load_average()
    return rows, header


def median_rows(rounds: Sequence[Row]) -> list[Row]:
    """One row per (path, case): the median over the rounds of each figure, errors summed."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rounds:
        groups.setdefault((row.path, row.case), []).append(row)
    out = []
    for (path, case), group in groups.items():
        ttfts = [r.ttft_p50_ms for r in group if r.ttft_p50_ms is not None]
        out.append(Row(
            path, case, p50_ms=statistics.median(r.p50_ms for r in group),
            ttft_p50_ms=statistics.median(ttfts) if ttfts else None,
            rps=statistics.median(r.rps for r in group), errors=sum(r.errors for r in group),
        ))
    return out


async def _after(delay_s: float, work: Awaitable[None]) -> None:
    await asyncio.sleep(delay_s)
    await work


def _line(row: Row) -> str:
    cpu = "" if row.cpu_us_per_request is None else f" cpu {row.cpu_us_per_request:.0f} us/req"
    ttft = "" if row.ttft_p50_ms is None else f" ttft {row.ttft_p50_ms:.3f}"
    return f"{row.case:16} {row.path:11} p50 {row.p50_ms:.3f}{ttft} {row.rps:.0f} req/s{cpu} err {row.errors}"


def render(rows: Sequence[Row], header: dict[str, str]) -> str:
    out = ["# Data path: one pass per request (issue 19)", ""]
    out += [f"- {key}: {value}" for key, value in header.items()]
    by = {(r.path, r.case): r for r in rows}
    present = {r.path for r in rows}
    latency_paths = [p for p in LATENCY_PATHS if p in present]
    out += ["", "## Latency at concurrency 1 (p50, ms; added = path − direct, same run)", ""]
    processors = [p for p in latency_paths if p != "direct"]
    compared = [p for p in processors if p != "floor"]
    out += ["| request | " + " | ".join(latency_paths) + " | "
            + " | ".join(f"{p} added" for p in processors) + " | "
            + " | ".join(f"{p} − floor" for p in compared) + " |",
            "|---|" + "---|" * (len(latency_paths) + len(processors) + len(compared))]
    for case, key in (("c=1 1 KB", "p50_ms"), ("c=1 200 KB", "p50_ms"), ("c=1 stream 64", "ttft_p50_ms"),
                      ("c=1 stream 64", "p50_ms")):
        label = case + (" TTFT" if key == "ttft_p50_ms" else " last byte" if "stream" in case else "")
        values = {p: getattr(by[(p, case)], key) for p in latency_paths}
        added = {p: values[p] - values["direct"] for p in latency_paths}
        out.append(
            f"| {label} | " + " | ".join(f"{values[p]:.3f}" for p in latency_paths)
            + " | " + " | ".join(f"+{added[p]:.3f}" for p in processors)
            + " | " + " | ".join(f"{added[p] - added['floor']:+.3f}" for p in compared) + " |"
        )
    loads = [r for r in rows if not r.case.startswith("c=1")]
    out += ["", "## Closed-loop load: throughput and the processor's CPU per request", "",
            "CPU columns: cores each process used over the run (1.00 = one core busy); processor: the "
            "row's own processor (the null picker, the picker or the lean picker).", "",
            "| request | path | req/s | p50 ms | p99 ms | p99 × floor's | processor µs/req | × floor "
            "| errors | processor | envoy | upstream | picker | picker_lean | null_picker | wrk |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in loads:
        floor = by[("floor", row.case)].cpu_us_per_request
        ratio = (
            f"{row.cpu_us_per_request / floor:.2f}"
            if row.cpu_us_per_request is not None and floor else "–"
        )
        cpu = "–" if row.cpu_us_per_request is None else f"{row.cpu_us_per_request:.0f}"
        floor_p99 = by[("floor", row.case)].p99_ms
        p99 = "–" if row.p99_ms is None else f"{row.p99_ms:.2f}"
        p99_ratio = f"{row.p99_ms / floor_p99:.2f}" if row.p99_ms is not None and floor_p99 else "–"
        names = ("processor", "envoy", "upstream", "picker", "picker_lean", "null_picker", "wrk")
        cores = " | ".join(f"{row.cpu_cores.get(name, 0.0):.2f}" for name in names)
        out.append(
            f"| {row.case} | {row.path} | {row.rps:.0f} | {row.p50_ms:.2f} | {p99} | {p99_ratio} | {cpu} | "
            f"{ratio} | {row.errors} | {cores} |"
        )
    return "\n".join(out) + "\n"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.datapath.onepass", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs (about 3 minutes)")
    parser.add_argument("--endpoints", type=int, default=8, help="upstream endpoints in the pool")
    parser.add_argument("--connections", type=int, default=0,
                        help="closed-loop connections of the load phase (0: the plan's, 8)")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    parser.add_argument("--profile", default="default", help="scheduling profile of the pool")
    parser.add_argument("--output", type=Path, default=None, help="also write the report here")
    parser.add_argument("--paths", nargs="+", choices=LOAD_PATHS, default=None,
                        help="run only these paths (direct and floor always run)")
    parser.add_argument("--latency-rounds", type=int, default=1,
                        help="repeat the concurrency-1 phase, paths alternating; report the median p50s")
    parser.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                        help="also run path baseline_lean: kvgate_lean with the picker of another checkout "
                             "(e.g. a git worktree of an earlier commit), for a same-run comparison")
    parser.add_argument("--picker-args", default="",
                        help="extra arguments for both kvgate pickers, e.g. '--scrape-interval 1'")
    parser.add_argument("--floor-loop", choices=event_loop.CHOICES, default=event_loop.DEFAULT,
                        help="the floor processor's event loop (default: the picker's default)")
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="py-spy each processor during its closed-loop 1 KB run (needs py-spy)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    rows, header = asyncio.run(run(args))
    text = render(rows, header)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)


if __name__ == "__main__":
    main()
