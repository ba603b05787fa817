"""Throughput and CPU per request of ``kvgate picker --workers N`` for several N, in one run.

``python -m kvgate.bench.datapath.workers [--workers 1 2 4] [--load-cores K] [--output FILE]``

One fast upstream (bench/datapath/upstream.py, ``--endpoints`` ports with live vLLM metrics pages);
for each N a fresh ``kvgate picker --workers N`` (its workers share state through a private Redis)
behind one Envoy with kvgate's one-pass filter chain, whose ext_proc cluster lists the workers' own
ports (least request); wrk closed-loop load with a 1 KB non-streamed body and a 64-token stream of
one SSE chunk per token. With ``--load-cores K`` (K > 0) wrk runs pinned to the last K cores and
everything else to the others, so the load generator does not compete with what it measures.
Reported: req/s, p50, p99, the pickers' CPU per request (every worker and the private Redis summed),
and each process group's cores; first, the pickers' cores at rest (``--idle-seconds``: scraping and
sharing alone). ``--scrapes both`` runs each N with shared scrapes (the default: one worker scrapes
the upstream for all) and with ``--no-shared-scrapes`` (each worker scrapes it), alternating which
goes first, so the two compare within one run.

``--lean`` runs the pickers as ``kvgate up`` does (``--skip-unread-responses --outcome-reports``:
responses not read, their outcomes reported by Envoy's access log), onepass's ``kvgate_lean``.
``--floor`` first runs the one-pass null processor (bench/datapath/null_picker.py, one process:
the grpc.aio + Envoy floor of a Python picker, onepass's ``floor``) behind the same Envoy and load,
and each row gives its p99 as a multiple of the floor's (issue 35's tail at concurrency 64).

Diagnostics for what limits scaling: each row splits the pickers' cores into the least and most busy
worker and the private Redis (an unbalanced spread shows there); ``--upstream-processes K`` serves the
endpoints from K upstream processes (one is capped at a core: the streamed rows hit it first);
``--profile-dir DIR`` samples one worker with py-spy (when on PATH) during each 1 KB run and writes
its collapsed stacks to ``DIR/w{N}-{shared|own}.txt``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvgate.bench.datapath.envoy import POOL
from kvgate.bench.datapath.full_duplex import load_average, machine, versions, wait_until_serving
from kvgate.bench.datapath.load import completion_bodies, run_wrk, write_bodies
from kvgate.bench.datapath.onepass import FLOOR, LEAN, LEAN_ARGS, processor_listener, stream_bodies
from kvgate.bench.datapath.procs import (
    Child,
    TreeCpu,
    kvgate_command,
    picker_processes,
    pools_yaml,
    start_child,
    start_null_picker,
    start_upstream,
)
from kvgate.gateway.controlplane.envoy_clusters import (
    PoolBackend,
    ext_proc_cluster,
    pool_clusters,
    split_host_port,
)
from kvgate.gateway.controlplane.envoy_config import ONE_PASS, bootstrap
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from kvgate.policies.types import FailureMode

IDLE = "at rest"
Row = tuple[float, float, float, float, int, dict[str, float]]
"""req/s, p50 ms, p99 ms, processor µs per request, errors, cores by process group."""
FLOOR_ROW = "floor"


def table_row(workers: int | str, shared: bool | None, case: str, row: Row,
              base: dict[tuple[str, bool], float], floor: dict[str, float]) -> str:
    rps, p50, p99, per_request, errors, cpu = row
    label = "–" if shared is None else "shared" if shared else "own"
    if case == IDLE:
        return (
            f"| {workers} | {label} | {case} | – | – | – | – | – | – | – | {cpu['pickers']:.3f} | "
            f"{spread(cpu)} | {cpu['envoy']:.3f} | {cpu['upstream']:.3f} | – |"
        )
    times = "–"
    if shared is not None:
        base.setdefault((case, shared), rps)
        times = f"{rps / base[case, shared]:.2f}"
    else:
        floor[case] = p99
    p99_floor = f"{p99 / floor[case]:.2f}" if floor.get(case) else "–"
    workers_cores = spread(cpu) if shared is not None else "–"
    return (
        f"| {workers} | {label} | {case} | {rps:.0f} | {times} | {p50:.2f} | {p99:.2f} | {p99_floor} | "
        f"{per_request:.0f} | {errors} | {cpu['pickers']:.2f} | {workers_cores} | {cpu['envoy']:.2f} | "
        f"{cpu['upstream']:.2f} | {cpu['wrk']:.2f} |"
    )


def spread(cpu: dict[str, float]) -> str:
    """The least and most busy worker's cores, and the private Redis's."""
    return f"{cpu['worker_min']:.2f}–{cpu['worker_max']:.2f} / {cpu['redis']:.2f}"


class CpuGroups:
    """CPU of the measured process groups and of each picker worker and private Redis, since made."""

    def __init__(self, groups: dict[str, int]) -> None:
        self.groups = groups
        self.workers, self.servers = picker_processes(groups["pickers"])
        self.meter = TreeCpu({**groups, **{f"pid{pid}": pid for pid in [*self.workers, *self.servers]}})

    def cores(self) -> dict[str, float]:
        """Cores used per group, plus ``worker_min``/``worker_max``/``redis`` and ``pickers_seconds``."""
        seconds, wall = self.meter.used()
        result = {name: seconds[name] / wall for name in self.groups}
        result["upstream"] = sum(v for name, v in result.items() if name.startswith("upstream"))
        per_worker = [seconds[f"pid{pid}"] / wall for pid in self.workers]
        result["worker_min"], result["worker_max"] = min(per_worker), max(per_worker)
        result["redis"] = sum(seconds[f"pid{pid}"] for pid in self.servers) / wall
        result["pickers_seconds"] = seconds["pickers"]
        return result


async def profile_worker(pid: int, seconds: float, output: Path) -> None:
    """py-spy's collapsed stacks of ``pid`` for ``seconds`` (nothing when py-spy is not on PATH)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return
    process = await asyncio.create_subprocess_exec(
        spy, "record", "--nonblocking", "-r", "200", "-d", str(max(1, int(seconds))), "-f", "raw",
        "-o", str(output), "-p", str(pid),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    await process.wait()


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
        f"- command: python -m kvgate.bench.datapath.workers {' '.join(sys.argv[1:])}",
        *(f"- machine {k}: {v}" for k, v in machine().items()),
        *(f"- version {k}: {v}" for k, v in versions().items()),
        f"- load generator: wrk -t{args.threads} -c{args.connections}, "
        f"{'cores ' + str(sorted(load_cores)) if load_cores else 'unpinned'}; Envoy workers: "
        f"{args.envoy_concurrency or 'N'}; endpoints: {args.endpoints} served by "
        f"{args.upstream_processes} upstream process(es)",
        "",
        "| N workers | scrapes | request | req/s | × 1 worker | p50 ms | p99 ms | p99 × floor's "
        "| pickers µs/req | errors | cores: pickers+redis | a worker's cores min–max / redis | envoy "
        "| upstream | wrk |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base: dict[tuple[str, bool], float] = {}
    floor: dict[str, float] = {}
    modes = {"shared": [True], "own": [False], "both": [True, False]}[args.scrapes]
    with tempfile.TemporaryDirectory(prefix="kvgate-workers-") as tmp, affinity(service_cores):
        workdir = Path(tmp)
        upstreams = [
            await start_upstream(len(share))
            for share in split_evenly(args.endpoints, args.upstream_processes)
        ]
        endpoints = [address for _, addresses in upstreams for address in addresses]
        upstream = [child for child, _ in upstreams]
        try:
            pools = workdir / "pools.yaml"
            pools.write_text(pools_yaml(endpoints, POOL, "default"))
            files = {
                "1 KB": write_bodies(workdir / "b.jsonl", completion_bodies(1024, 64)),
                "stream 64": write_bodies(workdir / "s.jsonl", stream_bodies(64, 64)),
            }
            if args.floor:
                floor_rows = await measure_floor(args, files, endpoints, upstream, load_cores)
                for case, row in floor_rows.items():
                    lines.append(table_row(FLOOR_ROW, None, case, row, base, floor))
                    print(lines[-1], file=sys.stderr, flush=True)
            for turn, workers in enumerate(args.workers):
                for shared in modes if turn % 2 == 0 else modes[::-1]:
                    rows = await measure(
                        args, workers, shared, pools, files, endpoints, upstream, workdir, load_cores
                    )
                    for case, row in rows.items():
                        lines.append(table_row(workers, shared, case, row, base, floor))
                        print(lines[-1], file=sys.stderr, flush=True)
        finally:
            for child in upstream:
                await child.stop()
    lines += ["", f"- load after: {load_average()}"]
    return "\n".join(lines) + "\n"


async def measure(
    args: argparse.Namespace,
    workers: int,
    shared: bool,
    pools: Path,
    files: dict[str, Path],
    endpoints: Sequence[str],
    upstream: Sequence[Child],
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
    if args.lean:
        command += list(LEAN_ARGS)
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
        outcomes = [split_host_port(a) for a in words.get("outcomes", "").split(",") if a]
        port = free_port()
        config = bootstrap(
            free_port(),
            [processor_listener("kvgate", port, "ext_proc_workers", LEAN if args.lean else ONE_PASS)],
            [
                ext_proc_cluster(pickers, name="ext_proc_workers"),
                *([ext_proc_cluster(outcomes, name="ext_proc_workers_outcomes")] if args.lean else []),
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
                await asyncio.sleep(1.0)  # sharing settles: one worker leads
                meter = CpuGroups(groups(picker, envoy, upstream))
                await asyncio.sleep(args.idle_seconds)
                rows[IDLE] = (0.0, 0.0, 0.0, 0.0, 0, meter.cores())
            with affinity(load_cores):
                await run_wrk(
                    url, files["1 KB"], connections=args.connections, seconds=2, threads=args.threads
                )
            for case, body in files.items():
                meter = CpuGroups(groups(picker, envoy, upstream))
                profiling = None
                if args.profile_dir is not None and case == "1 KB":
                    args.profile_dir.mkdir(parents=True, exist_ok=True)
                    target = args.profile_dir / f"w{workers}-{'shared' if shared else 'own'}.txt"
                    profiling = asyncio.create_task(
                        profile_worker(meter.workers[-1], args.seconds - 2, target)
                    )
                with affinity(load_cores):
                    result = await run_wrk(
                        url, body, connections=args.connections, seconds=args.seconds, threads=args.threads
                    )
                cpu = meter.cores()
                if profiling is not None:
                    await profiling
                cpu["wrk"] = result.wrk_cpu
                per_request = cpu["pickers_seconds"] / max(1, result.requests) * 1e6
                rows[case] = (
                    result.requests / result.duration_s,
                    result.p50_ms,
                    result.p99_ms,
                    per_request,
                    result.errors,
                    cpu,
                )
        finally:
            await envoy.stop()
    finally:
        await picker.stop()
    return rows


async def measure_floor(
    args: argparse.Namespace,
    files: dict[str, Path],
    endpoints: Sequence[str],
    upstream: Sequence[Child],
    load_cores: set[int] | None,
) -> dict[str, Row]:
    """The floor processor (onepass's ``floor``: every request to the first endpoint, response
    phases skipped) behind an Envoy like the workers' (concurrency ``--envoy-concurrency``, else 2)."""
    null, address = await start_null_picker(endpoints[0])
    rows: dict[str, Row] = {}
    try:
        port = free_port()
        config = bootstrap(
            free_port(),
            [processor_listener("floor", port, "ext_proc_null", FLOOR)],
            [
                ext_proc_cluster([address], name="ext_proc_null"),
                *pool_clusters(PoolBackend(POOL, FailureMode.FAIL_CLOSE)),
            ],
            node_id="kvgate-bench-workers-floor",
        )
        envoy = EnvoyProcess(config, EnvoyOptions(concurrency=args.envoy_concurrency or 2))
        await envoy.start()
        try:
            url = f"http://127.0.0.1:{port}"
            await wait_until_serving(url, completion_bodies(1024, 1)[0])
            with affinity(load_cores):
                await run_wrk(
                    url, files["1 KB"], connections=args.connections, seconds=2, threads=args.threads
                )
            for case, body in files.items():
                meter = CpuGroups(groups(null, envoy, upstream))
                with affinity(load_cores):
                    result = await run_wrk(
                        url, body, connections=args.connections, seconds=args.seconds, threads=args.threads
                    )
                cpu = meter.cores()
                cpu["wrk"] = result.wrk_cpu
                per_request = cpu["pickers_seconds"] / max(1, result.requests) * 1e6
                rows[case] = (result.requests / result.duration_s, result.p50_ms, result.p99_ms,
                              per_request, result.errors, cpu)
        finally:
            await envoy.stop()
    finally:
        await null.stop()
    return rows


def groups(picker: Child, envoy: EnvoyProcess, upstream: Sequence[Child]) -> dict[str, int]:
    found = {"pickers": picker.pid, "envoy": envoy.pid or 0}
    found.update({f"upstream{i}": child.pid for i, child in enumerate(upstream)})
    return found


def split_evenly(count: int, parts: int) -> list[range]:
    """``range(count)`` cut into ``parts`` slices as even as can be (no empty slice)."""
    parts = max(1, min(parts, count))
    return [range(count)[i::parts] for i in range(parts)]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m kvgate.bench.datapath.workers",
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
    parser.add_argument("--upstream-processes", type=int, default=1,
                        help="serve the endpoints from this many upstream processes")
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="py-spy one worker during each 1 KB run into this folder (py-spy on PATH)")
    parser.add_argument("--lean", action="store_true",
                        help="the pickers as kvgate up runs them (--skip-unread-responses --outcome-reports)")
    parser.add_argument("--floor", action="store_true",
                        help="first the one-pass null processor behind the same Envoy: p99 × the floor's")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    text = asyncio.run(run(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
