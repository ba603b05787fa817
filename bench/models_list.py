"""``GET /v1/models`` through the gateway next to a completion (issue 20: listing costs no replica
round trip).

``python -m kvgate.bench.models_list [--requests 400] [--output bench/results/models.md]``

``kvgate up --sim 2 --sim-time-scale 0.001`` (the simulator nearly free) in a child process; one
client connection sends, alternately, ``GET /v1/models``, ``GET /v1/models/{id}`` and a
non-streamed completion of one token, ``--requests`` of each, and reports each kind's latency
percentiles measured in the same run. A completion goes Envoy → picker (ext_proc) → a replica; a
models request goes Envoy → kvgate's models server, nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from kvgate.bench.processes import ManagedProcess
from kvgate.gateway.processes.envoy_process import free_port

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(http: aiohttp.ClientSession, method: str, url: str, body: bytes | None) -> tuple[float, int]:
    started = time.perf_counter()
    async with http.request(method, url, data=body, headers={"content-type": "application/json"}) as response:
        await response.read()
        return (time.perf_counter() - started) * 1000, response.status


async def run(args: argparse.Namespace) -> str:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvgate-models-") as tmp:
        up = ManagedProcess("kvgate up", [
            sys.executable, "-m", "kvgate.gateway.cli", "up", "--port", str(port), "--admin-port", "0",
            "--sim", "2", "--sim-time-scale", "0.001",
        ], Path(tmp) / "up.log")
        await up.start()
        try:
            await up.wait_for_log(r"kvgate ready", timeout_s=60)
            url = f"http://127.0.0.1:{port}"
            completion = json.dumps({"model": MODEL, "prompt": "Say hello", "max_tokens": 1}).encode()
            kinds = {
                "GET /v1/models": ("GET", f"{url}/v1/models", None),
                "GET /v1/models/{id}": ("GET", f"{url}/v1/models/{MODEL}", None),
                "POST /v1/completions (1 token)": ("POST", f"{url}/v1/completions", completion),
            }
            timings: dict[str, list[float]] = {name: [] for name in kinds}
            connector = aiohttp.TCPConnector(limit=1)
            async with aiohttp.ClientSession(connector=connector) as http:
                for _ in range(20):  # warm up every path
                    for method, target, body in kinds.values():
                        await _timed(http, method, target, body)
                for _ in range(args.requests):
                    for name, (method, target, body) in kinds.items():
                        ms, status = await _timed(http, method, target, body)
                        if status != 200:
                            raise RuntimeError(f"{name} answered {status}")
                        timings[name].append(ms)
        finally:
            await up.stop()
    lines = [
        "# `GET /v1/models` through the gateway, next to a completion (issue 20)", "",
        f"- command: `python -m kvgate.bench.models_list {' '.join(sys.argv[1:])}`",
        f"- machine: {platform.machine()}, Python {platform.python_version()}; `kvgate up --sim 2 "
        f"--sim-time-scale 0.001`; one client connection, the three kinds interleaved, "
        f"{args.requests} of each after 20 warm-up rounds; one run", "",
        "| request | p50 ms | p90 ms | p99 ms | mean ms |", "|---|---|---|---|---|",
    ]
    for name, values in timings.items():
        lines.append(f"| {name} | {_percentile(values, 0.5):.2f} | {_percentile(values, 0.9):.2f} "
                     f"| {_percentile(values, 0.99):.2f} | {statistics.fmean(values):.2f} |")
    models_p50 = _percentile(timings["GET /v1/models"], 0.5)
    completion_p50 = _percentile(timings["POST /v1/completions (1 token)"], 0.5)
    lines += ["", f"- `GET /v1/models` p50 / completion p50: {models_p50 / completion_p50:.2f}", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.models_list", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    text = asyncio.run(run(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
