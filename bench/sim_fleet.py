"""The simulated fleet as child processes (``python -m kvgate.simulator``), each with its admin server.

One simulator process plays every replica on one event loop; at real time (time scale 1) a large
fleet outruns one core (16 replicas at ~300 req/s, one SSE chunk per token: 130-160 ms of loop lag
on a 16-core machine, so even plain round robin was invalid). ``processes=K`` splits the replicas
over K processes (replica i in process i // ceil(N/K), its ``--replica`` overrides renumbered), and
``stats`` adds their counters and takes the worst loop lag.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

from kvgate.bench.processes import ManagedProcess, http_get_text
from kvgate.bench.workloads import FleetSpec


def split_fleet(spec: FleetSpec, processes: int) -> list[list[str]]:
    """The ``python -m kvgate.simulator`` fleet arguments of each process (replicas and overrides split)."""
    if processes > 1 and (spec.prefill or spec.decode):
        raise ValueError("a disaggregated fleet runs in one simulator process (its KV transfers)")
    processes = max(1, min(processes, spec.replicas))
    per = math.ceil(spec.replicas / processes)
    out: list[list[str]] = []
    for k in range(processes):
        first = k * per
        count = min(per, spec.replicas - first)
        if count <= 0:
            break
        overrides = []
        for override in spec.overrides:
            index, _, rest = override.partition(":")
            if first <= int(index) < first + count:
                overrides.append(f"{int(index) - first}:{rest}")
        part = FleetSpec(count, spec.num_gpu_blocks, spec.loras, spec.max_loras, tuple(overrides),
                         spec.stream_interval)
        out.append(part.args())
    return out


class SimFleet:
    def __init__(self, spec: FleetSpec, time_scale: float, log_path: Path, seed: int = 0,
                 processes: int = 1) -> None:
        self.processes = [
            ManagedProcess(
                f"simulator-{k}",
                [sys.executable, "-m", "kvgate.simulator", "--port", "0", "--admin-port", "0",
                 "--time-scale", str(time_scale), "--seed", str(seed + k), *args],
                log_path.with_name(f"{log_path.stem}-{k}{log_path.suffix}") if k else log_path,
            )
            for k, args in enumerate(split_fleet(spec, processes))
        ]
        self.urls: list[str] = []
        self.admin_urls: list[str] = []

    @property
    def command(self) -> list[str]:
        return self.processes[0].cmd

    async def start(self) -> list[str]:
        for process in self.processes:
            await process.start()
        for process in self.processes:
            match = await process.wait_for_log(r"^kvgate-sim ready (.+)$")
            self.urls += match.group(1).split()
            admin = await process.wait_for_log(r"^kvgate-sim admin (\S+)$")
            self.admin_urls.append(admin.group(1))
        return self.urls

    async def stats(self, window_s: float) -> dict[str, Any]:
        pages = await asyncio.gather(
            *(http_get_text(f"{url}/stats?window_s={window_s:.1f}") for url in self.admin_urls)
        )
        parts: list[dict[str, Any]] = [json.loads(page) for page in pages]
        if len(parts) == 1:
            return parts[0]
        totals: dict[str, Any] = {}
        for part in parts:
            for key, value in part["totals"].items():
                if isinstance(value, int | float):
                    totals[key] = totals.get(key, 0) + value
        lags = [part["loop_lag"] for part in parts if part.get("loop_lag")]
        worst = max(lags, key=lambda lag: lag.get("p99_ms") or 0.0) if lags else None
        return {"replicas": [r for part in parts for r in part["replicas"]], "totals": totals,
                "loop_lag": worst}

    async def stop(self) -> None:
        await asyncio.gather(*(process.stop() for process in self.processes))
