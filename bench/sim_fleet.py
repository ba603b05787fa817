"""The simulated fleet as child processes (``python -m kvgate.simulator``), each with its admin server.

One simulator process plays every replica on one event loop; at real time (time scale 1) a large
fleet outruns one core (16 replicas at ~300 req/s, one SSE chunk per token: 130-160 ms of loop lag
on a 16-core machine, so even plain round robin was invalid). ``processes=K`` splits the replicas
over K processes (replica i in process i // ceil(N/K), its ``--replica`` overrides renumbered), and
``stats`` adds their counters and takes the worst loop lag. A fleet that publishes KV events
(``FleetSpec.kv_events``) gets an address per replica (``EventAddresses``), as a pool's pods have.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

from kvgate.bench.processes import ManagedProcess, http_get_text
from kvgate.bench.workloads import FleetSpec
from kvgate.gateway.processes.envoy_process import free_port


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
        part = dataclasses.replace(spec, replicas=count, overrides=tuple(overrides))
        out.append(part.args())
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class EventAddresses:
    """Where a fleet that publishes KV events lives: replica ``i`` at ``first_host + i``, all on
    ``port``, each publishing on its own address at ``events_port`` (replay on the next port), as
    the picker subscribes (``kvEvents.port``: the same port on every endpoint's address)."""

    first_host: str
    port: int
    events_port: int

    @staticmethod
    def pick() -> EventAddresses:
        """A random 127.x.y.1 block (no other run's replicas there) and two free ports."""
        block = random.SystemRandom().randrange(1, 150 * 250)
        return EventAddresses(f"127.{100 + block // 250}.{block % 250}.1", free_port(), free_port())

    def args(self, first_replica: int) -> list[str]:
        host = ipaddress.ip_address(self.first_host) + first_replica
        return ["--hosts-from", str(host), "--port", str(self.port),
                "--kv-events-port", str(self.events_port)]


class SimFleet:
    def __init__(self, spec: FleetSpec, time_scale: float, log_path: Path, seed: int = 0,
                 processes: int = 1) -> None:
        self.events = EventAddresses.pick() if spec.kv_events else None
        parts = split_fleet(spec, processes)
        per = math.ceil(spec.replicas / max(1, min(processes, spec.replicas)))  # as split_fleet cuts
        self.processes = [
            ManagedProcess(
                f"simulator-{k}",
                [sys.executable, "-m", "kvgate.simulator", "--admin-port", "0",
                 *(self.events.args(k * per) if self.events is not None else ("--port", "0")),
                 "--time-scale", str(time_scale), "--seed", str(seed + k), *args],
                log_path.with_name(f"{log_path.stem}-{k}{log_path.suffix}") if k else log_path,
            )
            for k, args in enumerate(parts)
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
            # a long run over a large fleet takes the simulator seconds to summarise
            *(http_get_text(f"{url}/stats?window_s={window_s:.1f}", timeout_s=120.0)
              for url in self.admin_urls)
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
