"""Faults under load through ``kvgate up``: what a client sees when a replica dies or fails.

``python -m kvgate.bench.faults [--rate 50] [--seconds 30] [--output bench/results/faults.md]``

A simulated fleet of 4 replicas (one address each, as Pods; time scale 0.01) behind the composition
``kvgate up`` runs (real Envoy, kvgate's pool clusters and retries, the in-process picker), an
open-loop client at ``--rate`` requests a second for ``--seconds`` (half of them streamed, 24
tokens), and three phases:

1. at 15 % of the run, replica 1's listener stops (connections refused; responses streaming from it
   end with an error event);
2. at 35 %, replica 3 hangs (accepts inference requests and never answers; its /metrics answers);
3. at 55 %, replica 2 starts answering every inference request with HTTP 500;
4. at 80 %, all recover (replica 1 listens again, replica 3 answers what it held, the 500s stop).

``kvgate up`` runs with ``--stream-idle-retry 1`` (a streamed request whose replica stays silent for
1 s goes to the next endpoint) and ``--attempt-timeout 1 --attempt-timeout-per-token 0.01`` (a
non-streamed request of 24 tokens that has no answer after 1.24 s goes to the next endpoint): the
report's slowest-request columns show what a request the hung replica took waited.

Reported per phase: requests sent, completed, failed before their response started (the issue's
goal: zero), failed after it started (streams cut by the stop), retried to a fallback
(``kvgate_fallback_served_total``), and how long after the fault the replica last received a pick
(replica 2: its request counter; replica 1: the picker's fallback counter, which grows while the
picker still names it; replica 3: its held-requests counter). The picker's in-flight count at the
end must be zero.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from kvgate.bench.processes import ManagedProcess, http_get_text, metric_sum
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import UpOptions

MODEL = "base"
FIRST_IP = "127.0.6.1"
REPLICAS = 4
STREAM_IDLE_S = 1.0
ATTEMPT_BASE_S = 1.0
ATTEMPT_PER_TOKEN_S = 0.01


@dataclass
class Outcome:
    sent_at: float
    ok: bool = False
    started: bool = False
    status: int = 0
    seconds: float = 0.0
    stream: bool = False


@dataclass
class Timeline:
    """Samples of (time, replica 2's requests received, the picker's fallback count, replica 3's
    held requests)."""

    samples: list[tuple[float, int, float, int]] = field(default_factory=list)


def manifests(directory: Path, port: int) -> None:
    pods = "---".join(
        f"\napiVersion: v1\nkind: Pod\nmetadata: {{name: r{i}, labels: {{app: llm}}}}\n"
        f"status: {{phase: Running, podIP: 127.0.6.{i + 1}}}\n"
        for i in range(REPLICAS)
    )
    (directory / "all.yaml").write_text(f"""
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw}}
spec:
  gatewayClassName: kvgate
  listeners: [{{name: http, port: 8080, protocol: HTTP}}]
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {{name: llm}}
spec:
  selector: {{matchLabels: {{app: llm}}}}
  targetPorts: [{{number: {port}}}]
  endpointPickerRef: {{name: kvgate, port: {{number: 9002}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: llm}}
spec:
  parentRefs: [{{name: gw}}]
  rules: [{{backendRefs: [{{group: inference.networking.k8s.io, kind: InferencePool, name: llm}}]}}]
---{pods}""")


async def one(http: aiohttp.ClientSession, url: str, index: int, outcome: Outcome) -> None:
    stream = index % 2 == 1
    outcome.stream = stream
    began = time.monotonic()
    body = {"model": MODEL, "prompt": f"request {index} " + "words " * 40, "max_tokens": 24, "stream": stream}
    try:
        async with http.post(f"{url}/v1/completions", data=json.dumps(body),
                             headers={"content-type": "application/json"}) as response:
            outcome.status = response.status
            text = ""
            async for chunk in response.content.iter_any():
                outcome.started = response.status == 200
                text += chunk.decode(errors="replace")
            outcome.ok = response.status == 200 and (not stream or "[DONE]" in text) and '"error"' not in text
    except aiohttp.ClientError:
        outcome.ok = False
    outcome.seconds = time.monotonic() - began


async def sample(http: aiohttp.ClientSession, admin: str, picker_admin: str, timeline: Timeline,
                 stop: asyncio.Event, started: float) -> None:
    while not stop.is_set():
        with contextlib.suppress(Exception):
            async with http.get(f"{admin}/stats") as response:
                replicas = (await response.json())["replicas"]
            page = await http_get_text(f"{picker_admin}/metrics")
            timeline.samples.append((
                time.monotonic() - started, int(replicas[2]["requests_received"]),
                metric_sum(page, "kvgate_fallback_served_total"), int(replicas[3]["hung"]),
            ))
        await asyncio.sleep(0.05)


def first_quiet_after(
    samples: Sequence[tuple[float, float]], after: float, until: float, quiet_s: float = 1.0
) -> float | None:
    """Seconds from ``after`` to the last rise before the value first stays flat for ``quiet_s``
    (when the endpoint stopped getting picks the first time); None if it never rose."""
    rises = [at for (at, value), (_, before) in zip(samples[1:], samples, strict=False)
             if after < at <= until and value > before]
    for index, at in enumerate(rises):
        following = rises[index + 1] if index + 1 < len(rises) else until
        if following - at >= quiet_s:
            return at - after
    return None


def last_change_after(samples: Sequence[tuple[float, float]], after: float, until: float) -> float | None:
    """Seconds from ``after`` to the last sample in (after, until] whose value rose; None if none."""
    last: float | None = None
    previous: float | None = None
    for at, value in samples:
        if previous is not None and after < at <= until and value > previous:
            last = at - after
        previous = value
    return last


async def run(args: argparse.Namespace) -> str:
    seconds, rate = args.seconds, args.rate
    phases = {"stop": 0.15 * seconds, "hang": 0.35 * seconds, "errors": 0.55 * seconds,
              "recover": 0.80 * seconds}
    with tempfile.TemporaryDirectory(prefix="kvgate-faults-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        sim = ManagedProcess("simulator", [
            sys.executable, "-m", "kvgate.simulator", "--replicas", str(REPLICAS), "--port", str(port),
            "--hosts-from", FIRST_IP, "--admin-port", "0", "--model", MODEL, "--time-scale", "0.01",
        ], workdir / "sim.log")
        await sim.start()
        up: KvgateUp | None = None
        try:
            await sim.wait_for_log(r"^kvgate-sim ready")
            admin = (await sim.wait_for_log(r"^kvgate-sim admin (\S+)$")).group(1)
            config = workdir / "config"
            config.mkdir()
            manifests(config, port)
            up = KvgateUp(UpOptions(
                directory=config, port=free_port(), admin_port=0, sim=0, stream_idle_retry_s=STREAM_IDLE_S,
                attempt_timeout_s=ATTEMPT_BASE_S, attempt_timeout_per_token_s=ATTEMPT_PER_TOKEN_S,
            ))
            await up.start()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                for _ in range(100):
                    async with http.get(f"{up.admin_url}/readyz") as response:
                        if response.status == 200:
                            break
                    await asyncio.sleep(0.1)
                outcomes: list[Outcome] = []
                tasks: list[asyncio.Task[None]] = []
                timeline = Timeline()
                stop_sampling = asyncio.Event()
                started = time.monotonic()
                sampler = asyncio.create_task(
                    sample(http, admin, up.admin_url, timeline, stop_sampling, started)
                )
                done_phases: set[str] = set()
                total = int(seconds * rate)
                for index in range(total):
                    due = started + index / rate
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    now = time.monotonic() - started
                    for name, at in phases.items():
                        if now >= at and name not in done_phases:
                            done_phases.add(name)
                            await apply_phase(http, admin, name)
                    outcome = Outcome(now)
                    outcomes.append(outcome)
                    tasks.append(asyncio.create_task(one(http, up.url, index, outcome)))
                await asyncio.gather(*tasks)
                await asyncio.sleep(0.5)
                stop_sampling.set()
                await sampler
                pools = json.loads(await http_get_text(f"{up.admin_url}/debug/pools"))["pools"]
                inflight = sum(int(e.get("inflight_requests", 0)) for p in pools for e in p["endpoints"])
        finally:
            if up is not None:
                await up.stop()
            await sim.stop()
    return report(args, outcomes, timeline, phases, inflight)


async def apply_phase(http: aiohttp.ClientSession, admin: str, name: str) -> None:
    if name == "stop":
        await (await http.post(f"{admin}/replicas/1/stop")).release()
    elif name == "hang":
        await (await http.post(f"{admin}/replicas/3/faults", json={"hang": True})).release()
    elif name == "errors":
        await (await http.post(f"{admin}/replicas/2/faults", json={"error_rate": 1.0})).release()
    else:
        await (await http.post(f"{admin}/replicas/1/start")).release()
        await (await http.post(f"{admin}/replicas/2/faults", json={"error_rate": 0.0})).release()
        await (await http.post(f"{admin}/replicas/3/faults", json={"hang": False})).release()


def report(args: argparse.Namespace, outcomes: Sequence[Outcome], timeline: Timeline,
           phases: dict[str, float], inflight: int) -> str:
    bounds = [
        ("before the faults", 0.0, phases["stop"]),
        ("replica 1 stopped", phases["stop"], phases["hang"]),
        ("… and replica 3 hung", phases["hang"], phases["errors"]),
        ("… and replica 2 answering 500", phases["errors"], phases["recover"]),
        ("all recovered", phases["recover"], float("inf")),
    ]
    lines = [
        "# Faults under load through `kvgate up` (issue 14)", "",
        f"- command: `python -m kvgate.bench.faults {' '.join(sys.argv[1:])}`",
        f"- machine: {platform.machine()}, Python {platform.python_version()}; {REPLICAS} simulated replicas "
        f"(time scale 0.01), open loop {args.rate} req/s for {args.seconds} s, half streamed (24 tokens); "
        f"`kvgate up` with a stream idle bound of {STREAM_IDLE_S:g} s and an attempt bound of "
        f"{ATTEMPT_BASE_S:g} s + {ATTEMPT_PER_TOKEN_S:g} s a token for non-streamed requests",
        f"- picker in-flight requests at the end: **{inflight}**", "",
        "| phase | sent | completed | failed before the response started | failed after it started "
        "| slowest streamed (s) | slowest non-streamed (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, low, high in bounds:
        part = [o for o in outcomes if low <= o.sent_at < high]
        before = sum(1 for o in part if not o.ok and not o.started)
        after = sum(1 for o in part if not o.ok and o.started)
        slow_stream = max((o.seconds for o in part if o.stream), default=0.0)
        slow_plain = max((o.seconds for o in part if not o.stream), default=0.0)
        lines.append(f"| {name} | {len(part)} | {sum(o.ok for o in part)} | {before} | {after} "
                     f"| {slow_stream:.2f} | {slow_plain:.2f} |")
    fallback = [(at, fb) for at, _, fb, _ in timeline.samples]
    replica2 = [(at, float(r2)) for at, r2, _, _ in timeline.samples]
    replica3 = [(at, float(held)) for at, _, _, held in timeline.samples]
    stopped = last_change_after(fallback, phases["stop"], phases["hang"])
    hung = first_quiet_after(replica3, phases["hang"], phases["errors"])
    held = replica3[-1][1] if replica3 else 0.0
    ejected = first_quiet_after(replica2, phases["errors"], phases["recover"])
    erroring = last_change_after(replica2, phases["errors"], phases["recover"])
    total_fallbacks = fallback[-1][1] if fallback else 0.0
    lines += [
        "",
        f"- requests served by a fallback endpoint (`kvgate_fallback_served_total`): {total_fallbacks:.0f}",
        "- replica 1 (stopped): the picker last named it "
        + (f"{stopped:.2f} s after the stop" if stopped is not None else "never after the stop"),
        f"- replica 3 (hung): it held {held:.0f} requests; it stopped getting requests "
        + (f"{hung:.2f} s after it hung" if hung is not None else "(no quiet second seen)")
        + f" (streamed ones went on after {STREAM_IDLE_S:g} s of silence, non-streamed ones after "
        f"{ATTEMPT_BASE_S + 24 * ATTEMPT_PER_TOKEN_S:g} s without an answer)",
        "- replica 2 (500s): it stopped getting requests "
        + (f"{ejected:.2f} s after its 500s began" if ejected is not None else "(no quiet second seen)")
        + "; ejected for a back-off (5 s, doubling), it was tried again, the last time "
        + (f"{erroring:.2f} s after they began" if erroring is not None else "never"),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    text = asyncio.run(run(args))
    print(text)
    if args.output is not None:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
