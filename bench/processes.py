"""Child processes of the routing benchmark: start with a log file, wait for a ready line, stop.

Every child writes stdout and stderr to its own log file (kept for the policy checks and for
post-mortems); readiness is a regular expression matched against the log, or a TCP port accepting.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from gateway.child_process import dies_with_parent


class ProcessError(RuntimeError):
    pass


class ManagedProcess:
    def __init__(self, name: str, cmd: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            # children die with the benchmark, even when it is killed (setpriv --pdeathsig)
            self._proc = subprocess.Popen(dies_with_parent(self.cmd), stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    async def wait_for_log(self, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
        regex = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = regex.search(self.log_text())
            if match is not None:
                return match
            if self._proc is not None and self._proc.poll() is not None:
                raise ProcessError(f"{self.name} exited ({self._proc.returncode}): {self.log_text()[-2000:]}")
            await asyncio.sleep(0.1)
        raise ProcessError(f"{self.name} not ready after {timeout_s} s: {self.log_text()[-2000:]}")

    async def wait_for_port(self, port: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ProcessError(f"{self.name} exited ({self._proc.returncode}): {self.log_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
            await asyncio.sleep(0.2)
        raise ProcessError(f"{self.name} does not listen on {port} after {timeout_s} s")

    async def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
