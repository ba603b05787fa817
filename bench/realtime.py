"""Realtime sessions (vLLM's ``/v1/realtime`` WebSocket) through kvgate, against a replica straight.

``python -m kvgate.bench.realtime [--sessions 200] [--messages 2000] [--output FILE] [--plot PNG]``

Three paths to one simulated replica, in one run: straight to it; through ``kvgate up`` (the
picker picks on the upgrade's headers and turns every later phase off: the frames never reach
Python); and through ``kvgate picker`` behind an Envoy configured as the Inference Extension
configures its gateways (full-duplex bodies, no ``mode_override``: each frame goes to the picker
and back). For each: the time to open a session (the upgrade until ``session.created``, one
session at a time) and the round trip of one message (a ``session.update`` naming a model the
replica does not serve: its ``error`` event comes back at once, no engine work), one at a time in
one session; and the CPU the picker's process used per message over the round trips. Prints a
Markdown report and writes it to ``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from kvgate.bench.datapath.full_duplex import load_average, machine, versions
from kvgate.bench.datapath.procs import cpu_snapshot, kvgate_command, start_child, start_picker
from kvgate.gateway.controlplane.envoy_clusters import PoolBackend
from kvgate.gateway.controlplane.envoy_config import ExtProcSettings, GatewayConfig, static_bootstrap
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port

READY = "kvgate ready:"
SIM_HOST = "127.0.9.1"
BOGUS = {"type": "session.update", "model": "no-such-model"}


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def open_times(http: aiohttp.ClientSession, url: str, sessions: int) -> list[float]:
    """Milliseconds from the upgrade to ``session.created``, one session at a time."""
    times = []
    for _ in range(sessions):
        start = time.perf_counter()
        async with http.ws_connect(f"{url}/v1/realtime") as socket:
            await socket.receive_json(timeout=10)
            times.append((time.perf_counter() - start) * 1000)
    return times


async def round_trips(http: aiohttp.ClientSession, url: str, messages: int) -> list[float]:
    """Milliseconds per message and its reply, one at a time in one session."""
    times = []
    async with http.ws_connect(f"{url}/v1/realtime") as socket:
        await socket.receive_json(timeout=10)
        for _ in range(messages):
            start = time.perf_counter()
            await socket.send_json(BOGUS)
            reply = await socket.receive_json(timeout=10)
            times.append((time.perf_counter() - start) * 1000)
            assert reply["type"] == "error", reply
    return times


async def run(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="kvgate-realtime-bench-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            port = free_port()
            command = [*kvgate_command(), "up", "--sim", "1", "--sim-time-scale", "0.001",
                       "--sim-hosts-from", SIM_HOST, "--port", str(port), "--admin-port", "0"]
            up = await start_child("kvgate_up", command, READY, workdir / "up.log")
            stack.push_async_callback(up.stop)
            replica = f"{SIM_HOST}:8000"
            pools = workdir / "pools.yaml"
            pools.write_text(f"pools:\n  - name: llama\n    endpoints: ['{replica}']\n")
            picker, grpc, _ = await start_picker("picker", pools, workdir / "picker.log")
            stack.push_async_callback(picker.stop)
            envoy_port = free_port()
            config = GatewayConfig(listen_port=envoy_port, admin_port=free_port(), picker_addresses=(grpc,),
                                   pools=(PoolBackend("llama"),), settings=ExtProcSettings())
            envoy = EnvoyProcess(static_bootstrap(config), EnvoyOptions())
            await envoy.start()
            stack.push_async_callback(envoy.stop)
            paths = {
                "straight to the replica": (f"http://{replica}", None),
                "through kvgate up (tunnel)": (f"http://127.0.0.1:{port}", up.pid),
                "kvgate picker, full-duplex Envoy (frames echoed)": (
                    f"http://127.0.0.1:{envoy_port}", picker.pid),
            }
            rows: dict[str, tuple[list[float], list[float], float | None]] = {}
            async with aiohttp.ClientSession() as http:
                for url, _ in paths.values():  # warm-up, and each path serving
                    await open_times(http, url, 5)
                    await round_trips(http, url, 50)
                for name, (url, pid) in paths.items():
                    opened = await open_times(http, url, args.sessions)
                    before = cpu_snapshot({"p": pid}) if pid is not None else None
                    trips = await round_trips(http, url, args.messages)
                    cpu = ((cpu_snapshot({"p": pid})["p"] - before["p"]) / args.messages * 1e6
                           if before is not None and pid is not None else None)
                    rows[name] = (opened, trips, cpu)
                    print(name, statistics.median(opened), statistics.median(trips), cpu, file=sys.stderr)
    straight = statistics.median(rows["straight to the replica"][1])
    lines = [
        "# Realtime sessions (vLLM's `/v1/realtime` WebSocket) through kvgate", "",
        f"- command: `python -m kvgate.bench.realtime --sessions {args.sessions} --messages {args.messages}"
        " --output bench/results/realtime.md --plot bench/results/realtime.png`",
        *[f"- machine {key}: {value}" for key, value in machine().items()],
        *[f"- version {key}: {value}" for key, value in versions().items()],
        f"- load after: {load_average()}", "",
        "Open: the upgrade until `session.created`, one session at a time. Round trip: one message and",
        "its reply in an open session (a `session.update` the replica answers with an `error` event at",
        "once). Picker CPU: the picker's process (`kvgate up`'s, or `kvgate picker`'s) over the round",
        "trips, per message.", "",
        "| path | open p50 ms | open p90 | round trip p50 ms | p90 | round trip / straight (p50) "
        "| picker CPU µs per message |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (opened, trips, cpu) in rows.items():
        ratio = statistics.median(trips) / straight
        lines.append(
            f"| {name} | {statistics.median(opened):.2f} | {percentile(opened, 0.9):.2f} | "
            f"{statistics.median(trips):.3f} | {percentile(trips, 0.9):.3f} | {ratio:.2f}x | "
            f"{'' if cpu is None else f'{cpu:.0f}'} |")
    if args.plot is not None:
        plot(args.plot, {name: trips for name, (_, trips, _) in rows.items()})
        lines += ["", f"![round trip per path]({args.plot.name})"]
    return "\n".join(lines) + "\n"


def plot(path: Path, trips: dict[str, list[float]]) -> None:
    """The round trips' p50 and p90 per path, as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(trips)
    figure, axis = plt.subplots(figsize=(7, 3.5))
    positions = range(len(names))
    axis.bar([p - 0.2 for p in positions], [statistics.median(trips[n]) for n in names], 0.4, label="p50")
    axis.bar([p + 0.2 for p in positions], [percentile(trips[n], 0.9) for n in names], 0.4, label="p90")
    axis.set_xticks(list(positions), [n.replace(" (", "\n(").replace(", ", ",\n") for n in names], fontsize=7)
    axis.set_ylabel("message round trip (ms)")
    axis.set_title("One message and its reply in a realtime session")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--plot", type=Path, help="a PNG of the round trips (needs kvgate[bench])")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    print(report)
    if args.output is not None:
        args.output.write_text(report)


if __name__ == "__main__":
    main()
