"""``kvgate up`` notices when Envoy is gone and when it cannot listen: a clear line, never a silent
gateway that says it is ready."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.picker_harness import KVGATE, wait_until
from tests.e2e.test_up_cli import children_of

pytestmark = pytest.mark.e2e


def _up(*args: str) -> ChildProcess:
    return ChildProcess([*KVGATE, "up", "--sim", "1", "--sim-time-scale", "0.01", *args], name="kvgate up")


def _lines(process: ChildProcess, text: str, count: int) -> Callable[[], Awaitable[bool]]:
    """A check: ``count`` lines of the output hold ``text``."""

    async def seen() -> bool:
        return sum(text in line for line in process.lines) >= count

    return seen


async def _ends(process: ChildProcess, timeout_s: float) -> tuple[int, str]:
    code = await asyncio.wait_for(process.wait(), timeout_s)
    await process.stop()
    return code, process.tail(50)


async def test_a_gateway_port_in_use_fails_at_once_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = _up("--port", str(port), "--admin-port", "0", "--sim-hosts-from", "127.0.8.41")
        await process.start()
        code, output = await _ends(process, 30.0)
    assert code == 2, output
    assert f"port {port} (--port) is in use by another process" in output
    assert "kvgate ready" not in output
    assert "kvgate stopped" not in output
    assert "Traceback" not in output


async def test_a_busy_admin_port_and_an_invalid_port_fail_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        admin = taken.getsockname()[1]
        process = _up("--port", str(free_port()), "--admin-port", str(admin),
                      "--sim-hosts-from", "127.0.8.42")
        await process.start()
        code, output = await _ends(process, 30.0)
    assert code == 2, output
    assert f"port {admin} (--admin-port) is in use" in output
    assert "Traceback" not in output
    process = _up("--port", "99999")
    await process.start()
    code, output = await _ends(process, 30.0)
    assert code == 2
    assert "argument --port: 99999 is not a port" in output


async def test_envoy_exiting_is_logged_unready_meanwhile_restarted_and_the_third_exit_stops_kvgate() -> None:
    port, envoy_admin = free_port(), free_port()
    process = _up("--port", str(port), "--admin-port", "0", "--envoy-admin-port", str(envoy_admin),
                  "--sim-hosts-from", "127.0.8.43")
    await process.start()
    try:
        await process.wait_for_line("kvgate ready:", 60.0)
        admin = (await process.wait_for_line(r"\s+kvgate status --admin (\S+)$", 10.0)).group(1)
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                async with http.get(f"{admin}/readyz") as response:
                    return response.status == 200

            async def serves() -> bool:
                body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hi", "max_tokens": 2}
                try:
                    async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_until(ready, "kvgate up is ready", timeout_s=20.0)
            for quits in (1, 2):
                async with http.post(f"http://127.0.0.1:{envoy_admin}/quitquitquit") as response:
                    assert response.status == 200
                logged = "ERROR kvgate.gateway.processes.envoy_supervisor: Envoy exited"
                exited = _lines(process, logged, quits)
                await wait_until(exited, f"exit {quits} logged", timeout_s=10.0)
                async with http.get(f"{admin}/readyz") as response:
                    status = (response.status, await response.json())
                restarted = _lines(process, "Envoy restarted", quits)
                await wait_until(restarted, f"restart {quits}", timeout_s=20.0)
                assert status[0] == 503 or await ready(), status  # unready until it serves again
                await wait_until(serves, f"the gateway serves after restart {quits}", timeout_s=20.0)
            async with http.post(f"http://127.0.0.1:{envoy_admin}/quitquitquit") as response:
                assert response.status == 200
        code, output = await _ends(process, 30.0)
        assert code == 1, output
        assert "kvgate up: Envoy exited 3 times within 60 s" in output
    finally:
        await process.stop()


async def test_replicas_going_away_and_the_5xx_that_follow_are_logged() -> None:
    port = free_port()
    process = _up("--port", str(port), "--admin-port", "0", "--sim-hosts-from", "127.0.8.44")
    await process.start()
    try:
        await process.wait_for_line("kvgate ready:", 60.0)
        [simulator] = [pid for pid in children_of(process.pid or 0) if b"simulator" in _cmdline(pid)]
        os.kill(simulator, signal.SIGKILL)
        await process.wait_for_line(r".*WARNING .*endpoint default/llama/127\.0\.8\.44:8000 unhealthy", 10.0)
        async with aiohttp.ClientSession() as http:
            body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hi", "max_tokens": 2}
            async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response:
                assert response.status == 503
        await process.wait_for_line(r".*WARNING .*\d+ requests answered 5xx in the last 5 s", 15.0)
    finally:
        await process.stop()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
