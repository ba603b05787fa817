"""Scale from zero through ``kvgate up``: a pool whose only replica becomes ready ``--ready-after`` s
after the first request (issue 34, acceptance 2).

``python -m kvgate.bench.scale_from_zero [--ready-after 10] [--timeouts 15,5] [--output FILE]``

For each queue timeout: ``kvgate up -f DIR`` with flow control on (``kvgate.io/queue-timeout``) and
one Pod whose replica is not running; a streamed completion is sent, the replica (the simulator)
is started ``--ready-after`` seconds later, and the report gives what the client got and when: 200
after the replica came when the timeout allows, else 503 ``queue_timeout`` with ``Retry-After`` at
the timeout. The held-requests gauge (``kvgate_flow_control_held_requests``, what an autoscaler
scales on) is read while the request waits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from kvgate.bench.datapath.procs import kvgate_command, start_child
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up_options import EXAMPLE_MODEL, bundled_example

UP_READY = "kvgate ready:"
SIM_READY = "kvgate-sim ready"


async def one(timeout_s: float, args: argparse.Namespace, workdir: Path) -> list[str]:
    config = workdir / f"timeout-{timeout_s:g}"
    shutil.copytree(bundled_example(), config)
    sim_port, admin_port, port = free_port(), free_port(), free_port()
    pool = config / "pool.yaml"
    text = pool.read_text().replace("    - number: 8000", f"    - number: {sim_port}")
    text = text.replace("    kvgate.io/engine: vllm\n",
                        f"    kvgate.io/engine: vllm\n    kvgate.io/queue-timeout: {timeout_s:g}s\n")
    pool.write_text(text + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: sim-0, namespace: default, "
                    f"labels: {{app: vllm-llama}}}}\nstatus: {{podIP: {args.sim_host}}}\n")
    async with contextlib.AsyncExitStack() as stack:
        up = await start_child("kvgate_up", [*kvgate_command(), "up", "-f", str(config), "--port", str(port),
                                             "--admin-port", str(admin_port)], UP_READY, config / "up.log")
        stack.push_async_callback(up.stop)
        body = {"model": EXAMPLE_MODEL, "prompt": "hello from zero", "max_tokens": 8, "stream": True}
        async with aiohttp.ClientSession() as http:
            started = time.monotonic()
            sent = asyncio.create_task(request(http, port, body))
            await asyncio.sleep(min(args.ready_after, timeout_s) / 2)
            held = await held_gauge(http, admin_port)
            delay = args.ready_after - (time.monotonic() - started)
            if delay > 0:
                await asyncio.sleep(delay)
            ready_at = time.monotonic() - started
            sim = await start_child("simulator", [
                sys.executable, "-m", "kvgate.simulator", "--replicas", "1", "--port", str(sim_port),
                "--hosts-from", args.sim_host], SIM_READY, config / "sim.log")
            stack.push_async_callback(sim.stop)
            status, retry_after, code, answered = await sent
    outcome = f"{status}" + (f" `{code}`" if code else "")
    if retry_after:
        outcome += f", Retry-After {retry_after}"
    return [f"| {timeout_s:g} s | {args.ready_after:g} s (started at {ready_at:.1f} s) | {held:g} "
            f"| {outcome} | {answered:.2f} s |"]


async def request(http: aiohttp.ClientSession, port: int,
                  body: dict[str, object]) -> tuple[int, str, str, float]:
    started = time.monotonic()
    async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body,
                         timeout=aiohttp.ClientTimeout(total=120)) as response:
        text = await response.text()
        code = ""
        if response.status != 200:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                code = json.loads(text)["error"]["code"]
        elif "[DONE]" not in text:
            code = "stream without [DONE]"
        return response.status, response.headers.get("retry-after", ""), code, time.monotonic() - started


async def held_gauge(http: aiohttp.ClientSession, admin_port: int) -> float:
    async with http.get(f"http://127.0.0.1:{admin_port}/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith("kvgate_flow_control_held_requests{"):
                return float(line.rsplit(" ", 1)[1])
    return float("nan")


async def main_async(args: argparse.Namespace) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-zero-"))
    rows = []
    for timeout_s in args.timeouts:
        rows += await one(timeout_s, args, workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    return "\n".join([
        "# Scale from zero: a request waits for its pool's first replica", "",
        f"`python -m kvgate.bench.scale_from_zero {' '.join(sys.argv[1:])}`", "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}. `kvgate up -f DIR` with flow "
        "control on; the pool's one Pod has no replica until the simulator starts it.", "",
        "| queue timeout | replica ready after | held while waiting | client got | answered after |",
        "|---|---|---|---|---|", *rows, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.scale_from_zero",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--ready-after", type=float, default=10.0)
    parser.add_argument("--timeouts", type=lambda t: [float(x) for x in t.split(",")], default=[15.0, 5.0])
    parser.add_argument("--sim-host", default="127.0.5.1")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    text = asyncio.run(main_async(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
