"""Throughput and CPU per request of ``kvgate picker --workers N`` for several N, in one run.

``python -m bench.datapath_workers [--workers 1 2 4] [--load-cores K] [--output FILE]``

One fast upstream (bench/datapath_upstream.py, ``--endpoints`` ports with live vLLM metrics pages);
for each N a fresh ``kvgate picker --workers N`` (its workers share state through a private Redis)
behind one Envoy with kvgate's one-pass filter chain, whose ext_proc cluster lists the workers' own
ports (least request); wrk closed-loop load with a 1 KB non-streamed body and a 64-token stream of
one SSE chunk per token. With ``--load-cores K`` (K > 0) wrk runs pinned to the last K cores and
everything else to the others, so the load generator does not compete with what it measures.
Reported: req/s, p50, the pickers' CPU per request (every worker and the private Redis summed),
and each process group's cores; first, the pickers' cores at rest (``--idle-seconds``: scraping and
sharing alone). ``--scrapes both`` runs each N with shared scrapes (the default: one worker scrapes
the upstream for all) and with ``--no-shared-scrapes`` (each worker scrapes it), alternating which
goes first, so the two compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.datapath import load_average, machine, versions, wait_until_serving
from bench.datapath_envoy import POOL
from bench.datapath_load import completion_bodies, run_wrk, write_bodies
from bench.datapath_onepass import processor_listener, stream_bodies
from bench.datapath_procs import Child, group_cpu, kvgate_command, pools_yaml, start_child, start_upstream
from gateway.controlplane.envoy_config import (
    ONE_PASS,
    PoolBackend,
    bootstrap,
    ext_proc_cluster,
    pool_clusters,
    split_host_port,
)
from gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from policies.types import FailureMode

IDLE = "at rest"
Row = tuple[float, float, float, int, dict[str, float]]


def table_row(workers: int, shared: bool, case: str, row: Row, base: dict[tuple[str, bool], float]) -> str:
    rps, p50, per_request, errors, cpu = row
    label = "shared" if shared else "own"
    if case == IDLE:
        return (
            f"| {workers} | {label} | {case} | – | – | – | – | – | {cpu['pickers']:.3f} | "
            f"{cpu['envoy']:.3f} | {cpu['upstream']:.3f} | – |"
        )
    base.setdefault((case, shared), rps)
    return (
        f"| {workers} | {label} | {case} | {rps:.0f} | {rps / base[case, shared]:.2f} | {p50:.2f} | "
        f"{per_request:.0f} | {errors} | {cpu['pickers']:.2f} | {cpu['envoy']:.2f} | "
        f"{cpu['upstream']:.2f} | {cpu['wrk']:.2f} |"
    )


@contextlib.contextmanager
def affinity(cores: set[int] | None) -> Iterator[None]:
    """Children started inside inherit ``cores`` (None: leave as is)."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


async def run(args: argparse.Namespace) -> str:
    cores = sorted(os.sched_getaffinity(0))
    load_cores = set(cores[-args.load_cores :]) if args.load_cores else None
    service_cores = set(cores) - load_cores if load_cores else None
    lines = [
        "# `kvgate picker --workers N`: throughput and CPU per request",
        "",
        f"- command: python -m bench.datapath_workers {' '.join(sys.argv[1:])}",
        *(f"- machine {k}: {v}" for k, v in machine().items()),
        *(f"- version {k}: {v}" for k, v in versions().items()),
        f"- load generator: wrk -t{args.threads} -c{args.connections}, "
        f"{'cores ' + str(sorted(load_cores)) if load_cores else 'unpinned'}; Envoy workers: "
        f"{args.envoy_concurrency or 'N'}; endpoints: {args.endpoints}",
        "",
        "| N workers | scrapes | request | req/s | × 1 worker | p50 ms | pickers µs/req | errors "
        "| cores: pickers+redis | envoy | upstream | wrk |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base: dict[tuple[str, bool], float] = {}
    modes = {"shared": [True], "own": [False], "both": [True, False]}[args.scrapes]
    with tempfile.TemporaryDirectory(prefix="kvgate-workers-") as tmp, affinity(service_cores):
        workdir = Path(tmp)
        upstream, endpoints = await start_upstream(args.endpoints)
        try:
            pools = workdir / "pools.yaml"
            pools.write_text(pools_yaml(endpoints, POOL, "default"))
            files = {
                "1 KB": write_bodies(workdir / "b.jsonl", completion_bodies(1024, 64)),
                "stream 64": write_bodies(workdir / "s.jsonl", stream_bodies(64, 64)),
            }
            for turn, workers in enumerate(args.workers):
                for shared in modes if turn % 2 == 0 else modes[::-1]:
                    rows = await measure(
                        args, workers, shared, pools, files, endpoints, upstream, workdir, load_cores
                    )
                    for case, row in rows.items():
                        lines.append(table_row(workers, shared, case, row, base))
                        print(lines[-1], file=sys.stderr, flush=True)
        finally:
            await upstream.stop()
    lines += ["", f"- load after: {load_average()}"]
    return "\n".join(lines) + "\n"


async def measure(
    args: argparse.Namespace,
    workers: int,
    shared: bool,
    pools: Path,
    files: dict[str, Path],
    endpoints: Sequence[str],
    upstream: Child,
    workdir: Path,
    load_cores: set[int] | None,
) -> dict[str, Row]:
    command = [
        *kvgate_command(),
        "picker",
        "--pools",
        str(pools),
        "--grpc-port",
        "0",
        "--admin-port",
        "0",
        "--secure-serving=false",
        "--grpc-health-port",
        "0",
        "--workers",
        str(workers),
        "--log-level",
        "WARNING",
    ]
    if not shared:
        command += ["--no-shared-scrapes"]
    if args.redis:  # with one worker too: the cost of sharing alone
        command += ["--redis", args.redis]
    if args.scrape_interval:
        command += ["--scrape-interval", f"{args.scrape_interval:g}",
                    "--stale-after", f"{max(0.2, 4 * args.scrape_interval):g}"]
    picker = await start_child(f"picker_w{workers}", command, "kvgate-picker ready", workdir / "picker.log")
    rows: dict[str, Row] = {}
    try:
        words = dict(w.split("=", 1) for w in picker.ready_words if "=" in w)
        own = words.get("grpc_workers") or words["grpc"]
        pickers = [split_host_port(a) for a in own.split(",")]
        port = free_port()
        config = bootstrap(
            free_port(),
            [processor_listener("kvgate", port, "ext_proc_workers", ONE_PASS)],
            [
                ext_proc_cluster(pickers, name="ext_proc_workers"),
                *pool_clusters(PoolBackend(POOL, FailureMode.FAIL_CLOSE)),
            ],
            node_id="kvgate-bench-workers",
        )
        envoy = EnvoyProcess(config, EnvoyOptions(concurrency=args.envoy_concurrency or max(2, workers)))
        await envoy.start()
        try:
            url = f"http://127.0.0.1:{port}"
            await wait_until_serving(url, completion_bodies(1024, 1)[0])
            if args.idle_seconds > 0:
                groups = {"pickers": picker.pid, "envoy": envoy.pid or 0, "upstream": upstream.pid}
                await asyncio.sleep(1.0)  # sharing settles: one worker leads
                before = {name: group_cpu(pid) for name, pid in groups.items()}
                started = time.monotonic()
                await asyncio.sleep(args.idle_seconds)
                wall = time.monotonic() - started
                idle = {name: (group_cpu(pid) - before[name]) / wall for name, pid in groups.items()}
                rows[IDLE] = (0.0, 0.0, 0.0, 0, idle)
            with affinity(load_cores):
                await run_wrk(
                    url, files["1 KB"], connections=args.connections, seconds=2, threads=args.threads
                )
            for case, body in files.items():
                groups = {"pickers": picker.pid, "envoy": envoy.pid or 0, "upstream": upstream.pid}
                before = {name: group_cpu(pid) for name, pid in groups.items()}
                started = time.monotonic()
                with affinity(load_cores):
                    result = await run_wrk(
                        url, body, connections=args.connections, seconds=args.seconds, threads=args.threads
                    )
                wall = time.monotonic() - started
                after = {name: group_cpu(pid) for name, pid in groups.items()}
                cpu = {name: (after[name] - before[name]) / wall for name in groups}
                cpu["wrk"] = result.wrk_cpu
                per_request = (after["pickers"] - before["pickers"]) / max(1, result.requests) * 1e6
                rows[case] = (
                    result.requests / result.duration_s,
                    result.p50_ms,
                    per_request,
                    result.errors,
                    cpu,
                )
        finally:
            await envoy.stop()
    finally:
        await picker.stop()
    return rows


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.datapath_workers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="wrk threads")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--envoy-concurrency", type=int, default=0, help="0: max(2, N)")
    parser.add_argument("--load-cores", type=int, default=0, help="pin wrk to the last K cores")
    parser.add_argument("--redis", default=None, metavar="URL",
                        help="share through this Redis (also with 1 worker: isolates the cost of sharing)")
    parser.add_argument("--scrape-interval", type=float, default=0.0,
                        help="the pickers' scrape interval (0: their default, 50 ms)")
    parser.add_argument("--scrapes", choices=("shared", "own", "both"), default="shared",
                        help="shared scrapes (default), each worker its own (--no-shared-scrapes), or both")
    parser.add_argument("--idle-seconds", type=float, default=5.0,
                        help="measure the pickers at rest this long first (0: not)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    text = asyncio.run(run(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
