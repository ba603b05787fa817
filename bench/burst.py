"""A burst of concurrent connections through ``kvgate up``: does any request fail, and whose fault?

``python -m kvgate.bench.burst [--connections 2000] [--rounds 3] [--sim 4] [--output FILE]``

Starts ``kvgate up --sim N`` (the simulator at ``--sim-time-scale``, fast enough that 2,000 requests
fit in the replicas' queues) and fires ``--connections`` requests at once, each on its own TCP
connection, non-streamed then streamed, ``--rounds`` times. A request counts as failed when its status
is not 200 or a stream does not end with ``[DONE]``; failures are grouped by status and the error
code of their body, and the Envoy counters that tell the picker's share (``ext_proc.streams_failed``,
the ext_proc cluster's stream resets) are read before and after. Each process's CPU over the run
is reported beside the wall time (the client, Envoy, the simulator and ``kvgate up`` share the
machine). Prints a Markdown report and writes it to ``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc

from kvgate.bench.datapath.full_duplex import machine
from kvgate.bench.datapath.procs import cpu_snapshot, kvgate_command, start_child
from kvgate.bench.datapath.up import child_pids
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up_options import EXAMPLE_MODEL

READY = "kvgate ready:"
ENVOY_COUNTERS = (
    "http.*.ext_proc.streams_failed",
    "cluster.kvgate_ext_proc.http2.rx_reset",
    "cluster.kvgate_ext_proc.upstream_rq_pending_overflow",
    "http.*.downstream_rq_5xx",
)
"""Envoy counters read around the run; ``*`` stands for any listener's stat prefix."""


@dataclass
class BurstResult:
    """One burst: how many requests went out, and the failed ones by kind."""

    requests: int
    stream: bool
    wall_s: float
    failures: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


def _failure_kind(status: int, body: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = json.loads(body)["error"]
        return f"{status} {error.get('code')}"
    return f"{status} {body[:60]!r}"


async def _one(url: str, index: int, stream: bool, result: BurstResult) -> None:
    """One request on a connection of its own (a burst of clients, not one multiplexing client)."""
    body = {"model": EXAMPLE_MODEL, "prompt": f"burst request {index}", "max_tokens": 8, "stream": stream}
    connector = aiohttp.TCPConnector(limit=1, force_close=True)
    timeout = aiohttp.ClientTimeout(total=300)
    try:
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            session.post(f"{url}/v1/completions", json=body) as response,
        ):
            data = await response.read()
            if response.status != 200:
                result.failures[_failure_kind(response.status, data)] += 1
            elif stream and b"data: [DONE]" not in data:
                result.failures["200 stream without [DONE]"] += 1
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        result.failures[f"client: {type(exc).__name__}"] += 1


async def burst(url: str, connections: int, *, stream: bool) -> BurstResult:
    """``connections`` requests at once through ``url``; returns what failed."""
    result = BurstResult(connections, stream, 0.0)
    started = time.monotonic()
    await asyncio.gather(*(_one(url, index, stream, result) for index in range(connections)))
    result.wall_s = time.monotonic() - started
    return result


async def envoy_counters(http: aiohttp.ClientSession, admin_url: str) -> dict[str, int]:
    """The counters of :data:`ENVOY_COUNTERS` (summed over the listeners a ``*`` stands for)."""
    async with http.get(f"{admin_url}/stats?format=json") as response:
        stats = (await response.json(content_type=None)).get("stats", [])
    totals = dict.fromkeys(ENVOY_COUNTERS, 0)
    for stat in stats:
        name, value = stat.get("name", ""), stat.get("value")
        if not isinstance(value, int):
            continue
        for counter in ENVOY_COUNTERS:
            head, _, tail = counter.partition("*")
            if name == counter or (tail and name.startswith(head) and name.endswith(tail)):
                totals[counter] += value
    return totals


def raise_open_files(wanted: int) -> int:
    """Raise this process's open-file limit towards ``wanted`` (one socket per connection)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(max(soft, wanted), hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def report(args: argparse.Namespace, results: Sequence[BurstResult], counters: Mapping[str, int],
           cpu: Mapping[str, float], wall_s: float, command: str) -> str:
    lines = [
        "# Burst: concurrent connections through `kvgate up`",
        "",
        f"Command: `python -m kvgate.bench.burst --connections {args.connections} --rounds {args.rounds} "
        f"--sim {args.sim}`",
        f"`kvgate up` ran as: `{command}`",
        "",
        f"Machine: {', '.join(f'{k} {v}' for k, v in machine().items())}; Python "
        f"{platform.python_version()}, grpcio {grpc.__version__}",
        "",
        "| round | mode | requests | failed | wall s | failures by kind |",
        "|---|---|---:|---:|---:|---|",
    ]
    for index, result in enumerate(results):
        kinds = ", ".join(f"{kind}: {n}" for kind, n in result.failures.most_common()) or "-"
        mode = "streamed" if result.stream else "non-streamed"
        lines.append(f"| {index // 2 + 1} | {mode} | {result.requests} | {result.failed} | "
                     f"{result.wall_s:.1f} | {kinds} |")
    total = sum(r.requests for r in results)
    failed = sum(r.failed for r in results)
    lines += [
        "",
        f"**{failed} of {total} requests failed.**",
        "",
        "Envoy's counters over the run (the picker's share of any failure: an ext_proc stream that "
        "failed, a stream the picker's gRPC server reset):",
        "",
        "| counter | increase |",
        "|---|---:|",
        *(f"| `{name}` | {value} |" for name, value in counters.items()),
        "",
        f"CPU over the whole run ({wall_s:.1f} s of wall time; 1.0 = one core busy):",
        "",
        "| process | cores |",
        "|---|---:|",
        *(f"| {name} | {share:.2f} |" for name, share in cpu.items()),
        "",
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> str:
    limit = raise_open_files(args.connections * 2 + 256)
    if limit < args.connections + 64:
        raise SystemExit(f"the open-file limit is {limit}: too low for {args.connections} connections")
    port = free_port()
    command = [
        *kvgate_command(), "up", "--sim", str(args.sim), "--sim-time-scale", str(args.sim_time_scale),
        "--port", str(port), "--admin-port", "0", "--envoy-admin-port", str(free_port()),
    ]
    envoy_admin = f"http://127.0.0.1:{command[-1]}"
    with tempfile.TemporaryDirectory(prefix="kvgate-burst-") as tmp:
        up = await start_child("kvgate_up", command, READY, Path(tmp) / "up.log")
        try:
            url = f"http://127.0.0.1:{port}"
            pids = {"kvgate up (picker, control plane)": up.pid, **child_pids(up.pid),
                    "load generator": os.getpid()}
            async with aiohttp.ClientSession() as http:
                await burst(url, 8, stream=False)  # warm: connections to the replicas, the scrapes
                before = await envoy_counters(http, envoy_admin)
                cpu_before, started = cpu_snapshot(pids), time.monotonic()
                results = []
                for _ in range(args.rounds):
                    for stream in (False, True):
                        results.append(await burst(url, args.connections, stream=stream))
                wall = time.monotonic() - started
                cpu_after = cpu_snapshot(pids)
                after = await envoy_counters(http, envoy_admin)
        finally:
            await up.stop()
    counters = {name: after[name] - before[name] for name in ENVOY_COUNTERS}
    cpu = {name: (cpu_after[name] - cpu_before[name]) / wall for name in pids}
    return report(args, results, counters, cpu, wall, " ".join(["kvgate", *command[len(kvgate_command()):]]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.burst",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sim", type=int, default=4)
    parser.add_argument("--sim-time-scale", type=float, default=0.01)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    text = asyncio.run(run(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
