"""``kvgate up`` as a user runs it: bundled example + simulated fleet, one request, ``kvgate status``,
then SIGINT stops Envoy, the picker and the simulator (no child process left)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.picker_harness import post_json, wait_until

pytestmark = pytest.mark.e2e

KVGATE = [sys.executable, "-c", "import sys; from kvgate.gateway.cli import main; sys.exit(main())"]


def children_of(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def alive(pid: int) -> bool:
    """Running (a zombie waiting for whoever adopted it to reap it counts as gone)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


async def test_kvgate_up_serves_reports_status_and_stops_on_sigint(http: aiohttp.ClientSession) -> None:
    port = free_port()
    process = ChildProcess([
        *KVGATE, "up", "--port", str(port), "--admin-port", "0", "--sim", "2",
        "--sim-time-scale", "0.01", "--sim-hosts-from", "127.0.8.1",
    ], name="kvgate up")
    await process.start()
    try:
        await process.wait_for_line("kvgate ready:", 60.0)
        admin_line = await process.wait_for_line(r"\s+kvgate status --admin (\S+)$", 10.0)
        lines = list(process.lines)
        first = next(i for i, line in enumerate(lines) if line.startswith("kvgate ready:"))
        assert f"http://127.0.0.1:{port}" in lines[first]
        assert lines[first + 1].lstrip().startswith(f"curl http://127.0.0.1:{port}/v1/completions")
        admin = admin_line.group(1)
        children = children_of(_pid(process))
        assert len(children) >= 2, children  # Envoy and the simulator

        async def ready() -> bool:
            async with http.get(f"{admin}/readyz") as response:
                return response.status == 200

        await wait_until(ready, "the picker scraped the simulated replicas", timeout_s=15.0)
        reply = await post_json(
            http, f"http://127.0.0.1:{port}",
            {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Say hello", "max_tokens": 4},
        )
        assert reply.status == 200, reply
        assert reply.json()["usage"]["completion_tokens"] == 4

        status = await asyncio.create_subprocess_exec(
            *KVGATE, "status", "--admin", admin, stdout=asyncio.subprocess.PIPE
        )
        table = (await status.communicate())[0].decode()
        assert status.returncode == 0, table
        for word in ("InferencePool", "ResolvedRefs", "Listener"):
            assert word in table, table

        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 30.0) == 0
        await process.wait_for_line("kvgate stopped", 5.0)
        assert [pid for pid in children if alive(pid)] == []
    finally:
        await process.stop()


async def test_kvgate_up_killed_takes_envoy_and_the_simulator_with_it() -> None:
    """SIGKILL (or the OOM killer) gives kvgate no chance to stop its children: the kernel does
    (``setpriv --pdeathsig``), so no orphaned Envoy keeps the port."""
    port = free_port()
    process = ChildProcess([
        *KVGATE, "up", "--port", str(port), "--admin-port", "0", "--sim", "2", "--sim-processes", "2",
        "--sim-time-scale", "0.01", "--sim-hosts-from", "127.0.8.11",
    ], name="kvgate up")
    await process.start()
    try:
        await process.wait_for_line("kvgate ready:", 60.0)
        children = children_of(_pid(process))
        simulators = [pid for pid in children if b"kvgate.simulator" in cmdline(pid)]
        assert len(simulators) == 2, children  # --sim-processes 2: a replica in each
        assert len(children) >= 3, children
    finally:
        await process.kill()

    async def orphans_gone() -> bool:
        return not [pid for pid in children if alive(pid)]

    await wait_until(orphans_gone, "Envoy and the simulator exit after kvgate is killed", timeout_s=15.0)


def _pid(process: ChildProcess) -> int:
    assert process.pid is not None
    return process.pid
