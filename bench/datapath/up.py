"""The data path through ``kvgate up`` itself, as a new user runs it, against a replica straight.

``python -m kvgate.bench.datapath.up [--quick] [--sim 4] [--output FILE]``

Starts ``kvgate up --sim N --sim-time-scale 0.001`` (the simulator nearly free; Envoy with its
default worker count, the picker, control plane and scraper in the ``kvgate up`` process) and, in
one run: latency at concurrency 1 straight to the first simulated replica and through the gateway
(wrk for a ~1 KB non-streamed completion with ``max_tokens`` 1; an aiohttp client for a 64-token
stream of one SSE chunk per token: time to the first byte and to the last byte), then closed-loop
load at ``--connections`` through the gateway with the CPU each process used and the ``kvgate up``
process's CPU per request (its own threads: picker, control plane, scraper; Envoy and the simulator
are other processes). Prints a Markdown report and writes it to ``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from kvgate.bench.datapath.full_duplex import load_average, machine, versions, wait_until_serving
from kvgate.bench.datapath.load import completion_bodies, run_wrk, write_bodies
from kvgate.bench.datapath.onepass import FULL, QUICK, stream_latency
from kvgate.bench.datapath.procs import cpu_snapshot, descendants, kvgate_command, start_child
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import EXAMPLE_MODEL

READY = "kvgate ready:"


def bodies(tokens: int, stream: bool, count: int) -> list[bytes]:
    out = []
    for raw in completion_bodies(1024, count):
        document = json.loads(raw)
        document.update(model=EXAMPLE_MODEL, max_tokens=tokens)
        if stream:
            document["stream"] = True
        out.append(json.dumps(document, separators=(",", ":")).encode())
    return out


def child_pids(pid: int) -> dict[str, int]:
    """Envoy and the simulator, started by the ``kvgate up`` process, by command line."""
    found: dict[str, int] = {}
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"envoy" in cmdline:
                found.setdefault("envoy", child)
            elif b"simulator" in cmdline:
                found.setdefault("simulator", child)
    return found


async def run(args: argparse.Namespace) -> str:
    plan = QUICK if args.quick else FULL
    port = free_port()
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-up-bench-") as tmp:
        workdir = Path(tmp)
        command = [
            *kvgate_command(), "up", "--sim", str(args.sim), "--sim-time-scale", "0.001",
            "--port", str(port), "--admin-port", "0",
        ]
        if args.envoy_concurrency:
            command += ["--envoy-concurrency", str(args.envoy_concurrency)]
        async with contextlib.AsyncExitStack() as stack:
            up = await start_child("kvgate_up", command, READY, workdir / "up.log")
            stack.push_async_callback(up.stop)
            gateway = f"http://127.0.0.1:{port}"
            replica = f"http://{args.sim_host}:8000"
            pids = {"kvgate_up": up.pid, **child_pids(up.pid)}
            files = {
                "1 KB": write_bodies(workdir / "b.jsonl", bodies(1, False, 64)),
                "stream 64": write_bodies(workdir / "s.jsonl", bodies(64, True, 64)),
            }
            for url in (gateway, replica):
                await wait_until_serving(url, bodies(1, False, 1)[0])
            for url in (gateway, replica):  # warm-up
                await run_wrk(url, files["1 KB"], connections=4, seconds=1)
            latency: dict[str, dict[str, float]] = {}
            for name, url in (("straight to a replica", replica), ("through kvgate up", gateway)):
                result = await run_wrk(url, files["1 KB"], connections=1, seconds=plan.latency_s)
                ttft, last, errors = await stream_latency(url, bodies(64, True, 64), plan.stream_requests)
                latency[name] = {"1 KB": result.p50_ms, "ttft": ttft, "last": last,
                                 "errors": result.errors + errors}
                print(name, latency[name], file=sys.stderr, flush=True)
            straight, through = latency["straight to a replica"], latency["through kvgate up"]
            lines += [
                "## Through `kvgate up` (c=1, p50 ms, same run)", "",
                "| request | straight to a replica | through kvgate up | added | errors |",
                "|---|---|---|---|---|",
            ]
            for key, label in (("1 KB", "1 KB non-streamed, max_tokens 1"), ("ttft", "64-token stream: TTFT"),
                               ("last", "64-token stream: last byte")):
                lines.append(f"| {label} | {straight[key]:.3f} | {through[key]:.3f} | "
                             f"+{through[key] - straight[key]:.3f} | {int(through['errors'])} |")
            names = " | ".join(sorted(pids))
            lines += ["", f"## Through `kvgate up` at c={plan.connections}", "",
                      f"| request | req/s | p50 ms | kvgate up µs/req | errors | cores: {names} | wrk |",
                      "|---|---|---|---|---|" + "---|" * (len(pids) + 1)]
            for case in ("1 KB", "stream 64"):
                before = cpu_snapshot(pids)
                started = time.monotonic()
                result = await run_wrk(
                    gateway, files[case], connections=plan.connections, seconds=plan.load_s
                )
                wall = time.monotonic() - started
                after = cpu_snapshot(pids)
                per_request = (after["kvgate_up"] - before["kvgate_up"]) / max(1, result.requests) * 1e6
                cores = " | ".join(f"{(after[n] - before[n]) / wall:.2f}" for n in sorted(pids))
                lines.append(f"| {case} | {result.requests / result.duration_s:.0f} | {result.p50_ms:.2f} | "
                             f"{per_request:.0f} | {result.errors} | {cores} | {result.wrk_cpu:.2f} |")
                print(lines[-1], file=sys.stderr, flush=True)
    header = [
        "# Data path through `kvgate up`", "",
        f"- command: python -m kvgate.bench.datapath.up {' '.join(sys.argv[1:])}",
        f"- kvgate up: {' '.join(command[len(kvgate_command()):])} (Envoy workers: "
        f"{args.envoy_concurrency or os.cpu_count()})",
        *(f"- machine {k}: {v}" for k, v in machine().items()),
        *(f"- version {k}: {v}" for k, v in versions().items()),
        f"- plan: {plan}", f"- load after: {load_average()}", "",
    ]
    return "\n".join(header + lines) + "\n"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.datapath.up", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sim", type=int, default=4, help="simulated replicas")
    parser.add_argument("--sim-host", default="127.0.1.1", help="the first replica's address")
    parser.add_argument("--envoy-concurrency", type=int, default=0, help="0: kvgate up's default")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    text = asyncio.run(run(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
