"""What skipping unread responses saves, and what the outcome reports cost, in one run.

``python -m kvgate.bench.outcome_reports [--rounds 3] [--seconds 8] [--latency] [--output FILE]``

One Envoy, one upstream of 8 endpoints with live metrics pages (bench/datapath/upstream.py), and
the processors behind it, each on a listener of its own: ``direct`` (no processor), the one-pass
floor (bench/datapath/null_picker.py), ``roundtrip`` (``kvgate picker`` reading every response's
headers: ``kvgate up --no-skip-unread-responses``), ``bare`` (``kvgate picker
--skip-unread-responses``: the picker never hears of the outcomes) and ``reports`` (``kvgate picker
--skip-unread-responses --outcome-reports`` behind a listener whose gRPC access log reports them:
what ``kvgate up`` runs by default). Closed-loop wrk load (1 KB non-streamed, then a 64-token stream
of one chunk per token) goes to each in turn, ``--rounds`` times alternated; each processor's CPU per
request is its process's CPU seconds over the requests served. ``--latency`` adds, in each round,
p50 at concurrency 1 (wrk, 1 KB) for every path. Medians over the rounds; compare within the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kvgate.bench.datapath.envoy import POOL, direct_cluster, direct_listener
from kvgate.bench.datapath.full_duplex import load_average, machine, versions, wait_until_serving
from kvgate.bench.datapath.load import completion_bodies, write_bodies
from kvgate.bench.datapath.onepass import (
    FLOOR,
    LEAN,
    LEAN_ARGS,
    Row,
    load,
    picker_clusters,
    pools_with_token_limit,
    processor_listener,
    stream_bodies,
)
from kvgate.bench.datapath.procs import outcome_address, start_null_picker, start_picker, start_upstream
from kvgate.gateway.controlplane.envoy_clusters import PoolBackend as Pool
from kvgate.gateway.controlplane.envoy_clusters import ext_proc_cluster, pool_clusters
from kvgate.gateway.controlplane.envoy_config import ONE_PASS, bootstrap
from kvgate.gateway.processes.envoy_process import EnvoyProcess, free_port

PATHS = ("floor", "roundtrip", "bare", "reports")
PROCESSOR = {"floor": "null_picker", "roundtrip": "picker_roundtrip", "bare": "picker_bare",
             "reports": "picker_reports"}


async def run(args: argparse.Namespace) -> tuple[list[Row], dict[str, str]]:
    header = {
        "command": " ".join(["python -m kvgate.bench.outcome_reports", *sys.argv[1:]]),
        **{f"machine {k}": v for k, v in machine().items()},
        **{f"version {k}": v for k, v in versions().items()},
        "load": f"wrk, {args.connections} connections, {args.seconds:g} s a run, "
                f"{args.rounds} rounds alternated",
    }
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-reports-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            upstream, endpoints = await start_upstream(8)
            stack.push_async_callback(upstream.stop)
            pools = workdir / "pools.yaml"
            pools.write_text(pools_with_token_limit(endpoints, "default"))
            roundtrip, roundtrip_address, _ = await start_picker(
                "picker_roundtrip", pools, workdir / "roundtrip.log")
            stack.push_async_callback(roundtrip.stop)
            bare, bare_address, _ = await start_picker(
                "picker_bare", pools, workdir / "bare.log", ("--skip-unread-responses",))
            stack.push_async_callback(bare.stop)
            reports, reports_address, _ = await start_picker(
                "picker_reports", pools, workdir / "reports.log", LEAN_ARGS)
            stack.push_async_callback(reports.stop)
            null_picker, null_address = await start_null_picker(endpoints[0])
            stack.push_async_callback(null_picker.stop)
            ports = {path: free_port() for path in ("direct", *PATHS)}
            listeners = [
                direct_listener(ports["direct"]),
                processor_listener("floor", ports["floor"], "ext_proc_null", FLOOR),
                processor_listener("roundtrip", ports["roundtrip"], "ext_proc_roundtrip", ONE_PASS),
                processor_listener("bare", ports["bare"], "ext_proc_bare", ONE_PASS),
                processor_listener("reports", ports["reports"], "ext_proc_reports", LEAN),
            ]
            clusters = [
                direct_cluster(endpoints),
                ext_proc_cluster([null_address], name="ext_proc_null"),
                ext_proc_cluster([roundtrip_address], name="ext_proc_roundtrip"),
                ext_proc_cluster([bare_address], name="ext_proc_bare"),
                *picker_clusters("ext_proc_reports", reports_address,
                                 outcome_address(reports, reports_address)),
                *pool_clusters(Pool(POOL)),
            ]
            envoy = EnvoyProcess(bootstrap(free_port(), listeners, clusters, node_id="kvgate-bench-reports"))
            await envoy.start()
            stack.push_async_callback(envoy.stop)
            children = (upstream, roundtrip, bare, reports, null_picker)
            pids = {c.name: c.pid for c in children} | {"envoy": envoy.pid or 0}
            urls = {path: f"http://127.0.0.1:{port}" for path, port in ports.items()}
            files = {
                "1 KB": write_bodies(workdir / "b1k.jsonl", completion_bodies(1024, 64)),
                "stream 64": write_bodies(workdir / "s64.jsonl", stream_bodies(64, 64)),
            }
            for url in urls.values():
                await wait_until_serving(url, completion_bodies(1024, 1)[0])
            for path in PATHS:  # warm-up
                await load(urls[path], files["1 KB"], 4, 2.0, pids, path, "warm-up")
            for round_ in range(args.rounds):
                order = PATHS if round_ % 2 == 0 else tuple(reversed(PATHS))
                if args.latency:
                    for path in ("direct", *order):
                        row = await load(urls[path], files["1 KB"], 1, args.seconds, pids, path, "c=1 1 KB")
                        rows.append(row)
                        print(f"round {round_} c=1 1 KB  {path:9} p50 {row.p50_ms:.3f} ms",
                              file=sys.stderr, flush=True)
                for case, body in files.items():
                    for path in order:
                        row = await load(urls[path], body, args.connections, args.seconds, pids, path, case,
                                         processor=PROCESSOR[path])
                        rows.append(row)
                        print(f"round {round_} {case:10} {path:8} {row.rps:7.0f} req/s "
                              f"{row.cpu_us_per_request or 0.0:6.0f} us/req err {row.errors}",
                              file=sys.stderr, flush=True)
    header["load after"] = load_average()
    return rows, header


def render(rows: Sequence[Row], header: dict[str, str]) -> str:
    out = ["# Outcome reports: what they cost the picker (issue 19)", ""]
    out += [f"- {key}: {value}" for key, value in header.items()]
    out += ["", "Medians over the rounds; CPU per request of each processor's own process.", "",
            "| request | path | req/s | processor µs/req | × floor | × roundtrip | errors |",
            "|---|---|---|---|---|---|---|"]
    for case in ("1 KB", "stream 64"):
        cpu = {p: statistics.median(r.cpu_us_per_request or 0.0
                                    for r in rows if r.case == case and r.path == p) for p in PATHS}
        for path in PATHS:
            mine = [r for r in rows if r.case == case and r.path == path]
            rps = statistics.median(r.rps for r in mine)
            errors = sum(r.errors for r in mine)
            out.append(f"| {case} | {path} | {rps:.0f} | {cpu[path]:.0f} | {cpu[path] / cpu['floor']:.2f} | "
                       f"{cpu[path] / cpu['roundtrip']:.2f} | {errors} |")
    latency = [r for r in rows if r.case == "c=1 1 KB"]
    if latency:
        p50 = {p: statistics.median(r.p50_ms for r in latency if r.path == p) for p in ("direct", *PATHS)}
        out += ["", "Concurrency 1, 1 KB non-streamed: p50 ms (median over the rounds); "
                "added = path − direct.", "",
                "| path | p50 ms | added | − floor's added |", "|---|---|---|---|"]
        for path in ("direct", *PATHS):
            added = p50[path] - p50["direct"]
            floor_added = p50["floor"] - p50["direct"]
            out.append(f"| {path} | {p50[path]:.3f} | {added:+.3f} | {added - floor_added:+.3f} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.outcome_reports", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--latency", action="store_true", help="also p50 at concurrency 1 (1 KB) each round")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    rows, header = asyncio.run(run(args))
    text = render(rows, header)
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
