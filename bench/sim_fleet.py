"""The simulated fleet as a child process (``python -m simulator``) with its admin server."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.processes import ManagedProcess, http_get_text
from bench.workloads import FleetSpec


class SimFleet:
    def __init__(self, spec: FleetSpec, time_scale: float, log_path: Path, seed: int = 0) -> None:
        cmd = [sys.executable, "-m", "simulator", "--port", "0", "--admin-port", "0",
               "--time-scale", str(time_scale), "--seed", str(seed), *spec.args()]
        self.process = ManagedProcess("simulator", cmd, log_path)
        self.urls: list[str] = []
        self.admin_url = ""

    @property
    def command(self) -> list[str]:
        return self.process.cmd

    async def start(self) -> list[str]:
        self.process.start()
        match = await self.process.wait_for_log(r"^kvgate-sim ready (.+)$")
        self.urls = match.group(1).split()
        admin = await self.process.wait_for_log(r"^kvgate-sim admin (\S+)$")
        self.admin_url = admin.group(1)
        return self.urls

    async def stats(self, window_s: float) -> dict[str, Any]:
        url = f"{self.admin_url}/stats?window_s={window_s:.1f}"
        data: dict[str, Any] = json.loads(await http_get_text(url))
        return data

    async def stop(self) -> None:
        await self.process.stop()
