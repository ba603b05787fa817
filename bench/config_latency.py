"""How fast a configuration change reaches traffic through ``kvgate up``: YAML edit → applied by the
control plane → Envoy's ACK of the new routes → the first request served by the new pool.

``python -m kvgate.bench.config_latency [--repetitions 5] [--output bench/results/config_latency.md]``

Two pools of two simulated replicas each (time scale 0.01): pool A's serve only ``base-a``, pool B's
only ``base-b``. One HTTPRoute sends everything to one pool; each repetition rewrites it to the other
and sends requests for the other pool's model until one answers 200 (before the change they get
404), while a watcher polls the control plane (every 0.5 ms) for the apply and the ACK.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from kvgate.bench.processes import ManagedProcess
from kvgate.gateway.controlplane.xds import ROUTE
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import UpOptions

GATEWAY = """
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec:
  gatewayClassName: kvgate
  listeners: [{name: http, port: 8080, protocol: HTTP}]
"""


def _pool(name: str, port: int, ips: Sequence[str]) -> str:
    docs = [f"""
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: {name}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
"""]
    docs += [f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}-{i}, labels: {{app: {name}}}}}
status: {{phase: Running, podIP: {ip}}}
""" for i, ip in enumerate(ips)]
    return "---".join(docs)


def _route(pool: str) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: r}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{{group: inference.networking.k8s.io, kind: InferencePool, name: {pool}}}]}}]
"""


async def _watch(
    up: KvgateUp, applied_before: object, acked_before: str | None, marks: dict[str, float]
) -> None:
    assert up.control is not None
    while "acked" not in marks:
        now = time.monotonic()
        if "applied" not in marks and up.control.applied is not applied_before:
            marks["applied"] = now
        if up.xds_status.nodes["kvgate"][ROUTE].acked_version != acked_before:
            marks["acked"] = now
        await asyncio.sleep(0.0005)


async def _served(http: aiohttp.ClientSession, url: str, model: str, edited: float) -> float:
    body = json.dumps({"model": model, "prompt": "x", "max_tokens": 1})
    while time.monotonic() - edited < 10.0:
        async with http.post(f"{url}/v1/completions", data=body,
                             headers={"content-type": "application/json"}) as response:
            await response.read()
            if response.status == 200:
                return time.monotonic()
    raise RuntimeError("the change was not served within 10 s")


async def run(repetitions: int) -> list[tuple[float, float, float]]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="kvgate-config-latency-") as tmp:
        work = Path(tmp)
        fleets = {
            pool: ManagedProcess(pool, [
                sys.executable, "-m", "kvgate.simulator", "--replicas", "2", "--port", str(port),
                "--hosts-from", first_ip, "--admin-port", "0", "--time-scale", "0.01", "--model", model,
            ], work / f"{pool}.log")
            for pool, first_ip, model in (
                ("pool-a", "127.0.9.1", "base-a"), ("pool-b", "127.0.10.1", "base-b")
            )
        }
        config = work / "config"
        config.mkdir()
        up: KvgateUp | None = None
        try:
            for fleet in fleets.values():
                await fleet.start()
            for fleet in fleets.values():
                await fleet.wait_for_log(r"^kvgate-sim ready")
            (config / "gateway.yaml").write_text(GATEWAY)
            (config / "pools.yaml").write_text(
                _pool("pool-a", port, ["127.0.9.1", "127.0.9.2"]) + "---"
                + _pool("pool-b", port, ["127.0.10.1", "127.0.10.2"])
            )
            route_file = config / "route.yaml"
            route_file.write_text(_route("pool-a"))
            up = KvgateUp(UpOptions(directory=config, port=free_port(), admin_port=0, sim=0))
            await up.start()
            rows: list[tuple[float, float, float]] = []
            current = "pool-a"
            async with aiohttp.ClientSession() as http:
                await _served(http, up.url, "base-a", time.monotonic())
                for _ in range(repetitions):
                    target = "pool-b" if current == "pool-a" else "pool-a"
                    assert up.control is not None
                    applied_before = up.control.applied
                    acked_before = up.xds_status.nodes["kvgate"][ROUTE].acked_version
                    marks: dict[str, float] = {}
                    edited = time.monotonic()
                    route_file.write_text(_route(target))
                    watcher = asyncio.create_task(_watch(up, applied_before, acked_before, marks))
                    model = "base-b" if target == "pool-b" else "base-a"
                    served_at = await _served(http, up.url, model, edited)
                    await asyncio.wait_for(watcher, 10.0)
                    applied, acked = marks["applied"], marks["acked"]
                    rows.append((applied - edited, acked - applied, served_at - edited))
                    current = target
                    await asyncio.sleep(0.3)
            return rows
        finally:
            if up is not None:
                await up.stop()
            for fleet in fleets.values():
                await fleet.stop()


def report(rows: list[tuple[float, float, float]]) -> str:
    lines = [
        "# Configuration change → traffic, through `kvgate up`", "",
        f"- command: `python -m kvgate.bench.config_latency {' '.join(sys.argv[1:])}`",
        f"- machine: {platform.machine()}, Python {platform.python_version()}; 2 pools of 2 simulated "
        f"replicas; {len(rows)} route edits, one run", "",
        "| edit → applied (s) | applied → Envoy ACK (s) | edit → first request served (s) |",
        "|---|---|---|",
    ]
    lines += [f"| {a:.3f} | {b:.3f} | {c:.3f} |" for a, b, c in rows]
    medians = [statistics.median(column) for column in zip(*rows, strict=True)]
    lines += [f"| median {medians[0]:.3f} | {medians[1]:.3f} | {medians[2]:.3f} |", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.config_latency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    text = report(asyncio.run(run(args.repetitions)))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
