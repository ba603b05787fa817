"""Child processes of the routing benchmark: start with a log file, wait for a ready line, stop.

Every child writes stdout and stderr to its own log file (kept for the policy checks and for
post-mortems); readiness is a regular expression matched against the log, or a TCP port accepting.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from kvgate.gateway.processes.child_process import ChildProcess, ChildProcessError


class ProcessError(RuntimeError):
    pass


class ManagedProcess(ChildProcess):
    """A benchmark's child process (``gateway.processes.child_process.ChildProcess``) whose output goes to
    ``log_path`` (kept with the run's files), with the waits the benchmarks use."""

    def __init__(self, name: str, cmd: Sequence[str], log_path: Path) -> None:
        super().__init__(cmd, name=name, log_path=log_path, keep_lines=200)
        self.cmd = list(cmd)
        self.log_path = log_path

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        await super().start()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    async def wait_for_log(self, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
        """The first output line in which ``pattern`` is found (``^``/``$``: the line's ends)."""
        try:
            return await self.wait_for_line(re.compile(f".*?(?:{pattern})"), timeout_s)
        except ChildProcessError as exc:
            raise ProcessError(str(exc)) from exc

    async def wait_for_port(self, port: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.pid is not None and not self.running:
                raise ProcessError(f"{self.name} exited ({self.returncode}): {self.tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
            await asyncio.sleep(0.2)
        raise ProcessError(f"{self.name} does not listen on {port} after {timeout_s} s")

    async def stop(self, timeout_s: float = 5.0) -> int | None:
        return await super().stop(timeout_s)


async def http_get_text(url: str, timeout_s: float = 5.0) -> str:
    async with aiohttp.ClientSession() as session, session.get(
        url, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as resp:
        return await resp.text()


def metric_sum(page: str, name: str, label_filter: str = "") -> float:
    """Sum of the samples of ``name`` whose label text contains ``label_filter``."""
    total = 0.0
    for line in page.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name):]
        if rest[:1] not in ("{", " "):
            continue
        if label_filter and label_filter not in rest:
            continue
        with contextlib.suppress(ValueError, IndexError):
            total += float(rest.rsplit(" ", 1)[1])
    return total
