"""The data path through ``kvgate up`` itself, as a new user runs it, against a replica straight.

``python -m kvgate.bench.datapath.up [--quick] [--sim 4] [--otlp] [--output FILE]``

Starts ``kvgate up --sim N --sim-time-scale 0.001`` (the simulator nearly free; Envoy with its
default worker count, the picker, control plane and scraper in the ``kvgate up`` process) and, in
one run: latency at concurrency 1 straight to the first simulated replica and through the gateway
(wrk for a ~1 KB non-streamed completion with ``max_tokens`` 1; an aiohttp client for a 64-token
stream of one SSE chunk per token: time to the first byte and to the last byte), then closed-loop
load at ``--connections`` through the gateway with the CPU each process used and the ``kvgate up``
process's CPU per request (its own threads: picker, control plane, scraper; Envoy and the simulator
are other processes), and Envoy's CPU per request. ``--otlp``: a second ``kvgate up`` beside the
first tracing every request (``--otlp-endpoint`` to a receiver in this process: Envoy's spans and
the picker's), measured the same way in the same run. Prints a Markdown report and writes it to
``--output``. ``--kv-events``: a second gateway whose pool publishes KV events and names the
simulated model's tokenizer (the default profile then tokenizes and keys every prompt). ``--https``:
a second gateway whose listener terminates TLS (wrk and the stream client keep their connections:
the handshake is paid once per connection, as by clients that keep them). ``--workers N``: a second
gateway run with ``kvgate up --workers N`` (its picker workers and private Redis counted with it).
``--floor``: the one-pass floor processor (``bench.datapath.null_picker``: reads the buffered body,
names the first gateway's replicas in turn, nothing else) behind an Envoy of the same worker count:
the load table gives each gateway's p99 and CPU per request against it, in the same run
(issue 35's tail: ``--connections 64``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from kvgate.bench.datapath.envoy import POOL
from kvgate.bench.datapath.full_duplex import load_average, machine, versions, wait_until_serving
from kvgate.bench.datapath.load import completion_bodies, run_wrk, write_bodies
from kvgate.bench.datapath.onepass import FLOOR, FULL, QUICK, Plan, processor_listener, stream_latency
from kvgate.bench.datapath.procs import (
    Child,
    cpu_snapshot,
    descendants,
    kvgate_command,
    start_child,
    start_null_picker,
)
from kvgate.bench.otlp_receiver import OtlpReceiver
from kvgate.bench.workloads import SIM_MODEL
from kvgate.gateway.controlplane.envoy_clusters import PoolBackend, ext_proc_cluster, pool_clusters
from kvgate.gateway.controlplane.envoy_config import bootstrap
from kvgate.gateway.processes.envoy_process import EnvoyOptions, EnvoyProcess, free_port
from kvgate.gateway.up_options import EXAMPLE_MODEL, bundled_example
from kvgate.gateway.up_sim import nth_host
from kvgate.policies.types import FailureMode

READY = "kvgate ready:"


def bodies(tokens: int, stream: bool, count: int) -> list[bytes]:
    out = []
    for raw in completion_bodies(1024, count):
        document = json.loads(raw)
        document.update(model=EXAMPLE_MODEL, max_tokens=tokens)
        if stream:
            document["stream"] = True
        out.append(json.dumps(document, separators=(",", ":")).encode())
    return out


def child_pids(pid: int) -> dict[str, int]:
    """Envoy and the simulator, started by the ``kvgate up`` process, by command line; with
    ``--workers``, its picker workers (``worker1``...) and their private Redis too."""
    found: dict[str, int] = {}
    workers = simulators = 0
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"envoy" in cmdline:
                found.setdefault("envoy", child)
            elif b"simulator" in cmdline:
                simulators += 1
                found["simulator" if simulators == 1 else f"simulator{simulators}"] = child
            elif b"redis-server" in cmdline:
                found.setdefault("redis", child)
            elif b"picker" in cmdline:
                workers += 1
                found[f"worker{workers}"] = child
    return found


def picker_side(name: str) -> bool:
    """Whether process ``name`` of a gateway is its picker's: counted in its CPU per request."""
    return name in ("kvgate_up", "redis", "null_picker") or name.startswith("worker")


async def start_up(name: str, port: int, sim_host: str, args: argparse.Namespace, workdir: Path,
                   extra: Sequence[str] = ()) -> tuple[Child, list[str]]:
    command = [
        *kvgate_command(), "up", "--sim", str(args.sim), "--sim-time-scale", "0.001",
        "--sim-hosts-from", sim_host, "--port", str(port), "--admin-port", "0", *extra,
    ]
    if args.envoy_concurrency:
        command += ["--envoy-concurrency", str(args.envoy_concurrency)]
    if args.sim_processes > 1:
        command += ["--sim-processes", str(args.sim_processes)]
    return await start_child(name, command, READY, workdir / f"{name}.log"), command


Gateways = dict[str, tuple[str, dict[str, int]]]
"""Path name → (URL, the processes to measure by name)."""


async def traced_gateway(args: argparse.Namespace, workdir: Path, stack: contextlib.AsyncExitStack,
                         gateways: Gateways) -> OtlpReceiver:
    """``--otlp``: a second gateway tracing every request, its spans to a receiver in this process."""
    receiver = OtlpReceiver(keep=False)
    await receiver.start()
    stack.push_async_callback(receiver.stop)
    port = free_port()
    tracing = ["--otlp-endpoint", receiver.endpoint, "--otlp-sampling-ratio", "1"]
    traced, _ = await start_up("kvgate_up_traced", port, args.traced_sim_host, args, workdir, tracing)
    stack.push_async_callback(traced.stop)
    gateways["through kvgate up, traced"] = (f"http://127.0.0.1:{port}",
                                              {"kvgate_up": traced.pid, **child_pids(traced.pid)})
    return receiver


async def kv_events_gateway(args: argparse.Namespace, workdir: Path, stack: contextlib.AsyncExitStack,
                            gateways: Gateways) -> None:
    """``--kv-events``: a second gateway whose pool publishes KV events and names the simulated
    model's tokenizer (the bundled example with ``kvgate.io/kv-events-port`` and
    ``kvgate.io/tokenizer``): the default profile routes on the engines' reports."""
    config = workdir / "kv-events-config"
    shutil.copytree(bundled_example(), config)
    pool = config / "pool.yaml"
    pool.write_text(pool.read_text().replace(
        "    kvgate.io/profile: default\n",
        f"    kvgate.io/profile: default\n    kvgate.io/kv-events-port: \"{free_port()}\"\n"
        f"    kvgate.io/tokenizer: {SIM_MODEL}\n"))
    port = free_port()
    up, _ = await start_up("kvgate_up_kv_events", port, args.kv_events_sim_host, args, workdir,
                           ["-f", str(config)])
    stack.push_async_callback(up.stop)
    gateways["through kvgate up, KV events"] = (f"http://127.0.0.1:{port}",
                                                 {"kvgate_up": up.pid, **child_pids(up.pid)})


async def https_gateway(args: argparse.Namespace, workdir: Path, stack: contextlib.AsyncExitStack,
                        gateways: Gateways) -> None:
    """``--https``: a second gateway whose listener terminates TLS (the bundled example with an HTTPS
    listener and a self-signed certificate's Secret); clients do not verify it."""
    from kvgate.gateway.picker.tls import self_signed
    config = workdir / "https-config"
    shutil.copytree(bundled_example(), config)
    gateway = config / "gateway.yaml"
    text = gateway.read_text()
    plain = "    - name: http\n      protocol: HTTP\n      port: 8080\n"
    if plain not in text:
        raise RuntimeError("the bundled example's listener is not where --https expects it")
    gateway.write_text(text.replace(plain, "    - name: https\n      protocol: HTTPS\n      port: 8080\n"
                                           "      tls: {certificateRefs: [{name: bench-cert}]}\n"))
    pair = self_signed(("localhost",))
    crt, key = (base64.b64encode(pem).decode() for pem in (pair.cert_pem, pair.key_pem))
    (config / "secret.yaml").write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: bench-cert, namespace: default}\n"
        f"type: kubernetes.io/tls\ndata: {{tls.crt: {crt}, tls.key: {key}}}\n")
    port = free_port()
    up, _ = await start_up("kvgate_up_https", port, args.https_sim_host, args, workdir, ["-f", str(config)])
    stack.push_async_callback(up.stop)
    gateways["through kvgate up, HTTPS"] = (f"https://127.0.0.1:{port}",
                                             {"kvgate_up": up.pid, **child_pids(up.pid)})


async def load_rows(
    name: str, url: str, pids: dict[str, int], files: dict[str, Path], plan: Plan,
    floor: dict[str, tuple[float, float]] | None = None,
) -> list[str]:
    """The closed-loop rows of one path; ``floor``: per case, the floor's p99 and CPU per request
    (picker and Envoy) in this run, which each row is given as a ratio of."""
    names = " | ".join(sorted(pids))
    lines = ["", f"## {name[0].upper()}{name[1:]} at c={plan.connections}", "",
             "| request | req/s | p50 ms | p99 ms | p99 × floor's | picker µs/req | Envoy µs/req "
             f"| CPU/req × floor's | errors | cores: {names} | wrk |",
             "|---|---|---|---|---|---|---|---|---|" + "---|" * (len(pids) + 1)]
    for case in ("1 KB", "stream 64"):
        before = cpu_snapshot(pids)
        started = time.monotonic()
        result = await run_wrk(url, files[case], connections=plan.connections, seconds=plan.load_s)
        wall = time.monotonic() - started
        after = cpu_snapshot(pids)
        served = max(1, result.requests)
        picker = sum(after[n] - before[n] for n in pids if picker_side(n)) / served * 1e6
        envoy = (after.get("envoy", 0.0) - before.get("envoy", 0.0)) / served * 1e6
        cores = " | ".join(f"{(after[n] - before[n]) / wall:.2f}" for n in sorted(pids))
        rate = result.requests / result.duration_s
        against = floor.get(case) if floor is not None else None
        p99_ratio = f"{result.p99_ms / against[0]:.2f}" if against else "–"
        cpu_ratio = f"{(picker + envoy) / against[1]:.2f}" if against else "–"
        if floor is not None and against is None:  # the floor's own row
            floor[case] = (result.p99_ms, picker + envoy)
            p99_ratio = cpu_ratio = "1.00"
        lines.append(f"| {case} | {rate:.0f} | {result.p50_ms:.2f} | {result.p99_ms:.2f} | {p99_ratio} | "
                     f"{picker:.0f} | {envoy:.0f} | {cpu_ratio} | {result.errors} | {cores} | "
                     f"{result.wrk_cpu:.2f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


async def workers_gateway(args: argparse.Namespace, workdir: Path, stack: contextlib.AsyncExitStack,
                          gateways: Gateways) -> None:
    """``--workers N``: a second gateway, ``kvgate up --workers N``."""
    port = free_port()
    up, _ = await start_up("kvgate_up_workers", port, args.workers_sim_host, args, workdir,
                           ["--workers", str(args.workers)])
    stack.push_async_callback(up.stop)
    gateways[f"through kvgate up --workers {args.workers}"] = (
        f"http://127.0.0.1:{port}", {"kvgate_up": up.pid, **child_pids(up.pid)})


async def floor_path(
    args: argparse.Namespace, stack: contextlib.AsyncExitStack
) -> tuple[str, dict[str, int]]:
    """``--floor``: the one-pass floor processor behind its own Envoy (the same worker count as
    ``kvgate up``'s), naming the first gateway's replicas in turn (round robin: the same upstream
    processes as the gateway's, none of them its bottleneck alone)."""
    replicas = [f"{nth_host(args.sim_host, index)}:8000" for index in range(args.sim)]
    null_picker, address = await start_null_picker(replicas)
    stack.push_async_callback(null_picker.stop)
    port = free_port()
    config = bootstrap(
        free_port(), [processor_listener("floor", port, "ext_proc_null", FLOOR)],
        [ext_proc_cluster([address], name="ext_proc_null"),
         *pool_clusters(PoolBackend(POOL, FailureMode.FAIL_CLOSE))],
        node_id="kvgate-bench-up-floor",
    )
    envoy = EnvoyProcess(config, EnvoyOptions(concurrency=args.envoy_concurrency or (os.cpu_count() or 1)))
    await envoy.start()
    stack.push_async_callback(envoy.stop)
    return f"http://127.0.0.1:{port}", {"null_picker": null_picker.pid, "envoy": envoy.pid or 0}


async def run(args: argparse.Namespace) -> str:
    plan = QUICK if args.quick else FULL
    if args.connections:
        plan = dataclasses.replace(plan, connections=args.connections)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-up-bench-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            port = free_port()
            up, command = await start_up("kvgate_up", port, args.sim_host, args, workdir)
            stack.push_async_callback(up.stop)
            gateways: Gateways = {
                "through kvgate up": (f"http://127.0.0.1:{port}", {"kvgate_up": up.pid, **child_pids(up.pid)})
            }
            receiver = await traced_gateway(args, workdir, stack, gateways) if args.otlp else None
            if args.kv_events:
                await kv_events_gateway(args, workdir, stack, gateways)
            if args.https:
                await https_gateway(args, workdir, stack, gateways)
            if args.workers > 1:
                await workers_gateway(args, workdir, stack, gateways)
            floor = await floor_path(args, stack) if args.floor else None
            replica = f"http://{args.sim_host}:8000"
            files = {
                "1 KB": write_bodies(workdir / "b.jsonl", bodies(1, False, 64)),
                "stream 64": write_bodies(workdir / "s.jsonl", bodies(64, True, 64)),
            }
            paths = {"straight to a replica": replica,
                     **({"the floor processor": floor[0]} if floor is not None else {}),
                     **{n: url for n, (url, _) in gateways.items()}}
            for url in paths.values():
                await wait_until_serving(url, bodies(1, False, 1)[0])
            for url in paths.values():  # warm-up
                await run_wrk(url, files["1 KB"], connections=4, seconds=1)
            latency: dict[str, dict[str, float]] = {}
            for name, url in paths.items():
                result = await run_wrk(url, files["1 KB"], connections=1, seconds=plan.latency_s)
                ttft, last, errors = await stream_latency(url, bodies(64, True, 64), plan.stream_requests)
                latency[name] = {"1 KB": result.p50_ms, "ttft": ttft, "last": last,
                                 "errors": result.errors + errors}
                print(name, latency[name], file=sys.stderr, flush=True)
            straight = latency["straight to a replica"]
            lines += [
                "## Through `kvgate up` (c=1, p50 ms, same run)", "",
                "| request | path | straight to a replica | through the gateway | added | errors |",
                "|---|---|---|---|---|---|",
            ]
            for key, label in (("1 KB", "1 KB non-streamed, max_tokens 1"), ("ttft", "64-token stream: TTFT"),
                               ("last", "64-token stream: last byte")):
                for name in (n for n in paths if n != "straight to a replica"):
                    through = latency[name]
                    lines.append(f"| {label} | {name} | {straight[key]:.3f} | {through[key]:.3f} | "
                                 f"+{through[key] - straight[key]:.3f} | {int(through['errors'])} |")
            floor_figures: dict[str, tuple[float, float]] | None = None
            if floor is not None:
                floor_figures = {}
                lines += await load_rows("the floor processor", *floor, files, plan, floor_figures)
            for name, (url, pids) in gateways.items():
                lines += await load_rows(name, url, pids, files, plan, floor_figures)
            if receiver is not None:
                await asyncio.sleep(6.0)  # Envoy's exporter flushes every 5 s
                exported = receiver.received
                lines += ["", f"Spans the traced gateway exported (Envoy's and the picker's): {exported}"]
    header = [
        "# Data path through `kvgate up`", "",
        f"- command: python -m kvgate.bench.datapath.up {' '.join(sys.argv[1:])}",
        f"- kvgate up: {' '.join(command[len(kvgate_command()):])} (Envoy workers: "
        f"{args.envoy_concurrency or os.cpu_count()})"
        + (" and the same with `--otlp-endpoint URL --otlp-sampling-ratio 1` (a receiver in the benchmark's "
           "process), `--sim-hosts-from " + args.traced_sim_host + "`" if args.otlp else "")
        + (" and the bundled example with the pool's KV events and tokenizer (`-f DIR`, "
           "`--sim-hosts-from " + args.kv_events_sim_host + "`)" if args.kv_events else "")
        + (" and the bundled example with an HTTPS listener (`-f DIR`, a self-signed ECDSA P-256 "
           "certificate; `--sim-hosts-from " + args.https_sim_host + "`)" if args.https else "")
        + (f" and the same with `--workers {args.workers}` (`--sim-hosts-from {args.workers_sim_host}`; its "
           "picker workers and private Redis counted as the picker)" if args.workers > 1 else ""),
        *(["- the floor: bench.datapath.null_picker (the buffered body read, the first gateway's replicas "
           "named in turn, response phases skipped) behind its own Envoy with the same worker count; "
           "CPU per request × floor's: picker and Envoy together"]
          if args.floor else []),
        *(f"- machine {k}: {v}" for k, v in machine().items()),
        *(f"- version {k}: {v}" for k, v in versions().items()),
        f"- plan: {plan}", f"- load after: {load_average()}", "",
    ]
    return "\n".join(header + lines) + "\n"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.datapath.up", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sim", type=int, default=4, help="simulated replicas")
    parser.add_argument("--sim-host", default="127.0.1.1", help="the first replica's address")
    parser.add_argument("--sim-processes", type=int, default=1,
                        help="each gateway's replicas spread over this many simulator processes")
    parser.add_argument("--envoy-concurrency", type=int, default=0, help="0: kvgate up's default")
    parser.add_argument("--otlp", action="store_true",
                        help="a second kvgate up beside the first, tracing every request (issue 36)")
    parser.add_argument("--traced-sim-host", default="127.0.3.1", help="its first replica's address")
    parser.add_argument("--kv-events", action="store_true",
                        help="a second kvgate up beside the first whose pool publishes KV events and names "
                        "its tokenizer: routing on the engines' reports (issue 37)")
    parser.add_argument("--kv-events-sim-host", default="127.0.4.1", help="its first replica's address")
    parser.add_argument("--https", action="store_true",
                        help="a second gateway whose listener terminates TLS (a self-signed certificate)")
    parser.add_argument("--https-sim-host", default="127.0.5.1", help="its first replica's address")
    parser.add_argument("--workers", type=int, default=1,
                        help="above 1: a second gateway run with kvgate up --workers N")
    parser.add_argument("--workers-sim-host", default="127.0.6.1", help="its first replica's address")
    parser.add_argument("--floor", action="store_true",
                        help="the one-pass floor processor behind its own Envoy, in the same run")
    parser.add_argument("--connections", type=int, default=0, help="closed-loop connections (0: the plan's)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    text = asyncio.run(run(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
