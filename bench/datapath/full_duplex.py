"""Data-path overhead: Envoy direct to a fast upstream vs Envoy + kvgate picker, in one run.

``python -m kvgate.bench.datapath [--quick] [--output bench/results/datapath.md]``

One Envoy (``--envoy-concurrency`` workers) with three listeners (bench/datapath/envoy.py):
``direct`` (router → STATIC cluster of the upstream endpoints, no ext_proc), ``kvgate`` (kvgate's
filter chain, ext_proc FULL_DUPLEX_STREAMED → ORIGINAL_DST, one ``kvgate picker`` process) and
``kvgate_pair`` (the same with two picker processes in the ext_proc cluster) and ``null_extproc``
(the same chain with bench/datapath/null_picker.py, a processor that only does what the protocol
requires: the grpc.aio + Envoy ext_proc floor under any Python picker). The upstream is one
process of bench/datapath/upstream.py serving ``--endpoints`` ports (each one pool endpoint with a
vLLM /metrics page, so the default profile's full scheduling runs over them). Load comes from
``wrk`` in its own process (bench/datapath/load.py). Phases:

1. latency at concurrency 1, 1 KB and 200 KB completion bodies, direct / null / kvgate alternating
   (``--rounds`` rounds; the median of each statistic over rounds is reported);
2. saturation throughput (closed loop, ``--connections``), every path and size, with the CPU
   each process used (cores) — the picker's requests/s per core of its own CPU;
3. a py-spy profile of one picker at saturation (a separate run: sampling costs some CPU).

Prints the Markdown report and writes it to ``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kvgate.bench.datapath import profile as profiling
from kvgate.bench.datapath.envoy import POOL, DatapathPorts, datapath_bootstrap
from kvgate.bench.datapath.load import WrkResult, completion_bodies, run_wrk, write_bodies, wrk_binary
from kvgate.bench.datapath.procs import (
    Child,
    cpu_share,
    cpu_snapshot,
    pools_yaml,
    start_null_picker,
    start_picker,
    start_upstream,
)
from kvgate.bench.datapath.report import Measurement, Report, kept_analysis, render
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, find_envoy_binary, free_port

LATENCY_PATHS = ("direct", "null_extproc", "kvgate")
SIZES = {"1 KB": 1024, "200 KB": 200 * 1024}
BODY_COUNTS = {"1 KB": 64, "200 KB": 8}


@dataclass(frozen=True, slots=True)
class Plan:
    latency_s: float
    rounds: int
    saturation_s: float
    connections: tuple[int, ...]
    profile_s: float
    warmup_s: float


QUICK = Plan(latency_s=4, rounds=1, saturation_s=5, connections=(32,), profile_s=6, warmup_s=1)
FULL = Plan(latency_s=8, rounds=3, saturation_s=8, connections=(16, 64), profile_s=10, warmup_s=3)


@dataclass
class Rig:
    """Everything running: upstream, pickers, Envoy and the listener URLs."""

    upstream: Child
    endpoints: list[str]
    pickers: list[Child]
    null_picker: Child | None
    envoy: EnvoyProcess
    urls: dict[str, str]
    bodies: dict[str, Path] = field(default_factory=dict)

    def pids(self) -> dict[str, int]:
        pids = {"envoy": self.envoy.pid or 0, "upstream": self.upstream.pid}
        for picker in self.pickers:
            pids[picker.name] = picker.pid
        if self.null_picker is not None:
            pids[self.null_picker.name] = self.null_picker.pid
        return pids


async def wait_until_serving(url: str, body: bytes, timeout_s: float = 20.0) -> None:
    """Until a completion through ``url`` answers 200 (the picker has fresh metrics)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    connector = aiohttp.TCPConnector(ssl=False)  # (an HTTPS gateway's self-signed certificate)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2), connector=connector) as session:
        while time.monotonic() < deadline:
            try:
                async with session.post(
                    f"{url}/v1/completions", data=body, headers={"content-type": "application/json"}
                ) as response:
                    last = f"{response.status} {(await response.text())[:200]}"
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} is not serving: {last}")


async def measure(rig: Rig, path: str, size: str, connections: int, seconds: float) -> Measurement:
    before = cpu_snapshot(rig.pids())
    started = time.monotonic()
    result: WrkResult = await run_wrk(
        rig.urls[path], rig.bodies[size], connections=connections, seconds=seconds
    )
    wall = time.monotonic() - started
    cpu = cpu_share(before, cpu_snapshot(rig.pids()), wall)
    cpu["wrk"] = result.wrk_cpu
    return Measurement(path=path, size=size, result=result, cpu=cpu)


async def run_phases(rig: Rig, plan: Plan, workdir: Path, report: Report) -> None:
    paths = list(rig.urls)
    for path in paths:  # warm-up: connections, prefix index, Python caches
        for size in SIZES:
            await measure(rig, path, size, 4, plan.warmup_s)
    for size in SIZES:
        for _ in range(plan.rounds):
            for path in [p for p in LATENCY_PATHS if p in rig.urls]:
                report.latency.append(await measure(rig, path, size, 1, plan.latency_s))
                print(f"latency {report.latency[-1].line()}", file=sys.stderr, flush=True)
    for size in SIZES:
        for connections in plan.connections:
            for path in paths:
                report.saturation.append(await measure(rig, path, size, connections, plan.saturation_s))
                print(f"saturation {report.saturation[-1].line()}", file=sys.stderr, flush=True)
    if profiling.py_spy_binary() is None or plan.profile_s <= 0:
        report.notes.append("py-spy not installed: no profile.")
        return
    raw = workdir / "picker.collapsed"
    connections = max(plan.connections)
    load = asyncio.create_task(measure(rig, "kvgate", "1 KB", connections, plan.profile_s + 1.0))
    await asyncio.sleep(0.5)
    await profiling.record(rig.pickers[0].pid, plan.profile_s, raw)
    report.profiled = await load
    report.profile = profiling.summarise_file(raw)


def versions() -> dict[str, str]:
    envoy = subprocess.run(
        [str(find_envoy_binary()), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip().split("version:")[-1].strip()
    wrk = subprocess.run([wrk_binary(), "--version"], capture_output=True, text=True, check=False)
    import google.protobuf
    import grpc
    from google.protobuf.internal import api_implementation

    return {
        "python": platform.python_version(),
        "envoy": envoy.split("/")[1] if "/" in envoy else envoy,
        "wrk": (wrk.stdout or wrk.stderr).split("[")[0].strip(),
        "grpcio": grpc.__version__,
        "protobuf": f"{google.protobuf.__version__} ({api_implementation.Type()})",
        "aiohttp": aiohttp.__version__,
    }


def machine() -> dict[str, str]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    names = (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name"))
    model = next(names, "?")
    nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    return {"cpu": model, "nproc": nproc, "kernel": platform.release(), "load_before": load_average()}


def load_average() -> str:
    """1/5/15-minute load averages: other work on a shared machine skews absolute figures."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def run(args: argparse.Namespace) -> Report:
    plan = QUICK if args.quick else FULL
    report = Report(
        command=" ".join(["python -m kvgate.bench.datapath", *sys.argv[1:]]),
        machine=machine(),
        versions=versions(),
        settings={
            "endpoints": str(args.endpoints),
            "envoy_concurrency": str(args.envoy_concurrency),
            "profile": args.profile,
            "plan": f"{'quick' if args.quick else 'full'}: {plan}",
        },
    )
    with tempfile.TemporaryDirectory(prefix="kvgate-datapath-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            upstream, endpoints = await start_upstream(args.endpoints)
            stack.push_async_callback(upstream.stop)
            pools = workdir / "pools.yaml"
            pools.write_text(pools_yaml(endpoints, POOL, args.profile))
            pickers: list[Child] = []
            addresses: list[tuple[str, int]] = []
            for index in range(2 if args.pair else 1):
                name = f"picker_{'ab'[index]}"
                picker, grpc_address, _ = await start_picker(name, pools, workdir / f"{name}.log")
                stack.push_async_callback(picker.stop)
                pickers.append(picker)
                addresses.append(grpc_address)
            null_picker: Child | None = None
            null_address: tuple[str, int] | None = None
            if args.null:
                null_picker, null_address = await start_null_picker(endpoints[0])
                stack.push_async_callback(null_picker.stop)
            ports = DatapathPorts(
                free_port(), free_port(), free_port(), free_port() if args.pair else None,
                free_port() if args.null else None,
            )
            envoy = EnvoyProcess(
                datapath_bootstrap(ports, endpoints, addresses, null_address),
                EnvoyOptions(concurrency=args.envoy_concurrency),
            )
            await envoy.start()
            stack.push_async_callback(envoy.stop)
            urls = {"direct": f"http://127.0.0.1:{ports.direct}", "kvgate": f"http://127.0.0.1:{ports.kvgate}"}
            if ports.kvgate_pair is not None:
                urls["kvgate_pair"] = f"http://127.0.0.1:{ports.kvgate_pair}"
            if ports.null_extproc is not None:
                urls["null_extproc"] = f"http://127.0.0.1:{ports.null_extproc}"
            rig = Rig(upstream, endpoints, pickers, null_picker, envoy, urls)
            for size, nbytes in SIZES.items():
                bodies = completion_bodies(nbytes, BODY_COUNTS[size])
                rig.bodies[size] = write_bodies(workdir / f"bodies_{nbytes}.jsonl", bodies)
            for url in urls.values():
                await wait_until_serving(url, completion_bodies(1024, 1)[0])
            await run_phases(rig, plan, workdir, report)
    report.machine["load_after"] = load_average()
    return report


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.datapath", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs (about 2 minutes)")
    parser.add_argument("--endpoints", type=int, default=4, help="upstream endpoints in the pool")
    parser.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    parser.add_argument("--profile", default="default", help="scheduling profile of the pool")
    parser.add_argument("--no-pair", dest="pair", action="store_false", help="skip the 2-picker path")
    parser.add_argument("--no-null", dest="null", action="store_false", help="skip the null processor")
    parser.add_argument("--output", type=Path, default=Path("bench/results/datapath-full-duplex.md"))
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C: the exit stack stops every child
    report = asyncio.run(run(args))
    existing = args.output.read_text() if args.output.exists() else ""
    text = render(report, kept_analysis(existing))
    print(text)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)


if __name__ == "__main__":
    main()
