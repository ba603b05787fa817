"""``kvgate picker --workers 2``: two picker processes on one gRPC port with a private Redis; a worker
that dies is restarted; SIGTERM stops every process the supervisor started. ``kvgate up --workers``
runs one worker process beside its in-process picker. Workers share their scrapes: one scrapes each
model server for all."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvgate.gateway.processes.child_process import ChildProcess
from kvgate.gateway.processes.envoy_process import free_port
from tests.e2e.picker_harness import post_json, wait_until
from tests.e2e.test_up_cli import alive, children_of
from tests.gateway.picker.metrics_server import MetricsServer, vllm_text

pytestmark = pytest.mark.e2e

KVGATE = [sys.executable, "-c", "import sys; from kvgate.gateway.cli import main; sys.exit(main())"]
POOLS = 'pools:\n  - name: p\n    endpoints: ["127.0.0.1:1"]\n'


def _pid(process: ChildProcess) -> int:
    assert process.pid is not None
    return process.pid


def _words(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


async def _serving(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def test_two_workers_share_one_port_restart_when_killed_and_stop_together(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    process = ChildProcess([
        *KVGATE, "picker", "--pools", str(pools), "--grpc-port", "0", "--admin-port", "0",
        "--grpc-health-port", str(free_port()), "--workers", "2", "--log-level", "WARNING",
    ], name="kvgate")
    await process.start()
    try:
        words = _words((await process.wait_for_line(re.escape("kvgate-picker ready") + ".*", 60)).group(0))
        admins = words["admins"].split(",")
        assert words["workers"] == "2"
        assert len(set(admins)) == 2
        assert words["redis"].startswith("redis://127.0.0.1:")
        assert await _serving(words["health"])
        async with aiohttp.ClientSession() as http:
            for admin in admins:  # each worker answers on its own admin port
                async with http.get(f"{admin}/healthz") as response:
                    assert response.status == 200
        descendants = children_of(_pid(process))
        workers = [pid for pid in descendants if _is_worker(pid)]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        for _ in range(200):  # restarted after its back-off (0.5 s)
            replacement = [pid for pid in children_of(_pid(process)) if _is_worker(pid)]
            if len(replacement) == 2 and workers[0] not in replacement:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the killed worker was not restarted:\n" + process.tail())
        assert await _serving(words["health"])
        everything = children_of(_pid(process))
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
        await asyncio.sleep(0.2)
        assert not [pid for pid in everything if alive(pid)], "a worker or Redis outlived the supervisor"
    finally:
        await process.stop()


def _is_worker(pid: int) -> bool:
    with contextlib.suppress(OSError):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return b"--worker-index" in cmdline and alive(pid)
    return False


async def test_kvgate_up_with_two_workers_serves_through_both_and_stops_them(tmp_path: Path) -> None:
    """``kvgate up --workers 2``: the in-process picker and one worker process (state shared through
    a private redis-server), both in Envoy's ext_proc cluster; requests are picked by both; SIGINT
    stops the worker and Redis with everything else."""
    port = free_port()
    process = ChildProcess([
        *KVGATE, "up", "--port", str(port), "--admin-port", "0", "--sim", "2", "--workers", "2",
        "--sim-time-scale", "0.01", "--sim-hosts-from", "127.0.8.21",
    ], name="kvgate")
    await process.start()
    try:
        line = (await process.wait_for_line(re.escape("kvgate ready:") + ".*", 60)).group(0)
        admin = line.split("(admin ")[1].split(";")[0]
        everything = children_of(_pid(process))
        workers = [pid for pid in everything if _is_worker(pid)]
        assert len(workers) == 1
        async with aiohttp.ClientSession() as http:
            async def ready() -> bool:
                async with http.get(f"{admin}/readyz") as response:
                    return response.status == 200

            await wait_until(ready, "the in-process picker scraped the replicas", timeout_s=15.0)
            await asyncio.sleep(0.5)  # the worker's first scrapes
            body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Say hello", "max_tokens": 2}
            for _ in range(30):
                reply = await post_json(http, f"http://127.0.0.1:{port}", body)
                assert reply.status == 200, reply
            async with http.get(f"{admin}/metrics") as response:
                page = await response.text()
        in_process = sum(
            float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
            if line.startswith("inference_extension_scheduler_e2e_duration_seconds_count")
        )
        assert 0 < in_process < 30, f"the in-process picker scheduled {in_process} of 30"
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        await asyncio.sleep(0.2)
        assert not [pid for pid in everything if alive(pid)], "a worker or Redis outlived kvgate up"
    finally:
        await process.stop()


async def test_a_watched_pools_file_is_applied_on_change_and_a_bad_one_is_ignored(tmp_path: Path) -> None:
    """``kvgate picker --watch`` (what ``kvgate up --workers`` gives its workers)."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    process = ChildProcess([
        *KVGATE, "picker", "--pools", str(pools), "--grpc-port", "0", "--admin-port", "0", "--watch",
        "--grpc-health-port", "0",
        "--log-level", "WARNING",
    ], name="kvgate")
    await process.start()
    try:
        ready = (await process.wait_for_line(re.escape("kvgate-picker ready") + ".*", 30)).group(0)
        admin = _words(ready)["admin"]
        async with aiohttp.ClientSession() as http:
            async def names() -> set[str]:
                async with http.get(f"{admin}/debug/pools") as response:
                    return {str(pool["name"]) for pool in (await response.json())["pools"]}

            assert await names() == {"p"}
            staged = tmp_path / "pools.tmp"
            staged.write_text(POOLS.replace("name: p", "name: q"))
            os.replace(staged, pools)

            async def renamed() -> bool:
                return await names() == {"q"}

            await wait_until(renamed, "the rewritten pools file was applied", timeout_s=10.0)
            pools.write_text("pools: [")  # not YAML: the last good pools stay
            await asyncio.sleep(0.5)
            assert await names() == {"q"}
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
    finally:
        await process.stop()


async def _leader_pools(http: aiohttp.ClientSession, admins: list[str]) -> float:
    total = 0.0
    for admin in admins:
        async with http.get(f"{admin}/metrics") as response:
            text = await response.text()
        found = re.search(r"^kvgate_shared_scrape_leader_pools (\S+)$", text, re.MULTILINE)
        total += float(found.group(1)) if found else 0.0
    return total


async def _scrapes_per_second(tmp_path: Path, server: MetricsServer, *flags: str) -> tuple[float, float]:
    """(GETs of the server's /metrics per second, pools led summed over the workers) with 3 workers."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(f'pools:\n  - name: p\n    endpoints: ["{server.address}"]\n')
    process = ChildProcess([
        *KVGATE, "picker", "--pools", str(pools), "--grpc-port", "0", "--admin-port", "0",
        "--grpc-health-port", str(free_port()), "--workers", "3", "--scrape-interval", "0.05",
        "--log-level", "WARNING", *flags,
    ], name="kvgate")
    await process.start()
    try:
        words = _words((await process.wait_for_line(re.escape("kvgate-picker ready") + ".*", 60)).group(0))
        admins = words["admins"].split(",")
        async with aiohttp.ClientSession() as http:
            if "--no-shared-scrapes" not in flags:
                for _ in range(100):
                    if await _leader_pools(http, admins) == 1:
                        break
                    await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # the followers' last own scrapes are behind
            before, started = server.hits, asyncio.get_running_loop().time()
            await asyncio.sleep(2.0)
            rate = (server.hits - before) / (asyncio.get_running_loop().time() - started)
            return rate, await _leader_pools(http, admins)
    finally:
        await process.stop()


async def test_workers_scrape_each_model_server_once_between_them(tmp_path: Path) -> None:
    server = MetricsServer(vllm_text(2))
    await server.start()
    try:
        shared, leaders = await _scrapes_per_second(tmp_path, server)
        alone, no_leaders = await _scrapes_per_second(tmp_path, server, "--no-shared-scrapes")
    finally:
        await server.stop()
    assert leaders == 1, "exactly one worker scrapes the pool"
    assert no_leaders == 0
    # Three workers scraping every 50 ms: ~60 GETs a second each on their own, ~20 shared.
    assert shared < 0.6 * alone, f"{shared:.1f} GETs/s shared against {alone:.1f} each on its own"
