"""The simulated fleet ``kvgate up --sim N`` runs: ``python -m kvgate.simulator`` as a child process."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence

from kvgate.gateway.processes.child_process import ChildProcess, ChildProcessError
from kvgate.policies.errors import ConfigError

SIM_READY_PREFIX = "kvgate-sim ready"
SIM_READY_TIMEOUT_S = 30.0


class SimFleetProcess:
    """``python -m kvgate.simulator`` as a child process (``gateway.processes.child_process``); ``urls``
    once started."""

    def __init__(
        self, *, roles: Sequence[str], port: int, hosts_from: str, time_scale: float, model: str | None,
        kv_events_port: int | None = None,
        tokenizer: str | None = None,
        kv_events_connect: str | None = None,
    ) -> None:
        """``roles``: each replica's (``prefill``, ``decode``, ``both``), prefill ones first, then
        decode, then both (the simulator's order). ``kv_events_port``: each replica publishes
        vLLM's KV events there (its own address; replay on the next port), or connects its
        publisher to ``kv_events_connect`` (a picker's bound socket)."""
        count = Counter(roles)
        if count["prefill"] or count["decode"]:
            sizes = ["--prefill", str(count["prefill"]), "--decode", str(count["decode"]),
                     "--replicas", str(count["both"])]
        else:
            sizes = ["--replicas", str(len(roles))]
        self.command = [
            sys.executable, "-m", "kvgate.simulator", *sizes, "--port", str(port),
            "--hosts-from", hosts_from, "--time-scale", str(time_scale),
            *(("--model", model) if model else ()),
            *(("--kv-events-port", str(kv_events_port)) if kv_events_port else ()),
            *(("--kv-events-connect", kv_events_connect) if kv_events_connect else ()),
            *(("--tokenizer", tokenizer) if tokenizer else ()),
        ]
        self.urls: list[str] = []
        self._child = ChildProcess(self.command, name="the simulator", keep_lines=200)

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def output(self) -> list[str]:
        return list(self._child.lines)

    async def start(self) -> None:
        await self._child.start()
        try:
            ready = await self._child.wait_for_line(SIM_READY_PREFIX + r"(.*)$", SIM_READY_TIMEOUT_S)
        except ChildProcessError as exc:
            await self._child.stop()
            raise ConfigError(f"the simulator did not start: {exc}") from exc
        self.urls = ready.group(1).split()

    async def stop(self) -> None:
        await self._child.stop(10.0)
