"""Load generation for the data-path benchmark: OpenAI completion bodies and ``wrk`` runs.

``wrk`` (C, event loop, keep-alive connections, its own process) is the load generator: on a
2-core machine it drives tens of thousands of requests per second from one thread, so it stays
far from being the bottleneck, where an aiohttp client would need a core of its own for a few
thousand. Bodies are formatted once per wrk thread by ``bench/lua/datapath_post.lua``.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LUA_SCRIPT = Path(__file__).resolve().parents[1] / "lua" / "datapath_post.lua"
RESULT_PREFIX = "DATAPATH-RESULT "
MODEL = "bench-model"
COMPLETION_BODY_PATH = "/v1/completions"
_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "this", "are", "from", "at", "or", "an", "which", "have", "not", "table", "query",
    "select", "index", "cache", "token", "model", "request", "server", "gateway", "replica",
    "latency", "prefix", "block", "memory", "route", "pool", "picker", "envoy", "stream", "chunk",
    "batch", "queue", "score", "filter", "metric",
)


def completion_bodies(size: int, count: int, seed: int = 11) -> list[bytes]:
    """``count`` distinct ``/v1/completions`` bodies of exactly ``size`` bytes (compact JSON)."""
    rng = random.Random(seed)
    bodies: list[bytes] = []
    for index in range(count):
        head = {"model": MODEL, "max_tokens": 16, "temperature": 0, "prompt": ""}
        empty = len(json.dumps(head, separators=(",", ":")))
        words: list[str] = [f"doc{index}"]
        length = len(words[0])
        while length < size - empty:
            word = rng.choice(_WORDS)
            words.append(word)
            length += len(word) + 1
        prompt = " ".join(words)[: size - empty]
        head["prompt"] = prompt
        body = json.dumps(head, separators=(",", ":")).encode()
        if len(body) != size:
            raise AssertionError(f"body is {len(body)} bytes, wanted {size}")
        bodies.append(body)
    return bodies


def write_bodies(path: Path, bodies: Sequence[bytes]) -> Path:
    path.write_bytes(b"\n".join(bodies) + b"\n")
    return path


@dataclass(frozen=True, slots=True)
class WrkResult:
    connections: int
    requests: int
    duration_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    errors: int
    """Socket errors, timeouts and non-2xx/3xx answers."""
    wrk_cpu: float
    """Cores the wrk process used over the run."""

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise RuntimeError("wrk is not installed (Debian: apt-get install -y wrk)")
    return found


async def run_wrk(
    url: str, body_file: Path, *, connections: int, seconds: float, threads: int = 1,
    path: str = "/v1/completions", pause_ms: int = 0,
) -> WrkResult:
    """One closed-loop wrk run of ``connections`` keep-alive connections for ``seconds``;
    ``pause_ms``: each connection waits that long between a response and its next request."""
    command = [
        wrk_binary(), f"-t{min(threads, connections)}", f"-c{connections}", f"-d{max(1, round(seconds))}s",
        "--timeout", "10s", "-s", str(LUA_SCRIPT), url, "--", str(body_file), path,
    ]
    if pause_ms > 0:
        command.append(str(pause_ms))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = output.decode(errors="replace")
    line = next((ln for ln in text.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if process.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({process.returncode}): {text[-2000:]}")
    raw = json.loads(line[len(RESULT_PREFIX) :])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    error_keys = ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    errors = sum(int(raw[key]) for key in error_keys)
    return WrkResult(
        connections=connections,
        requests=int(raw["requests"]),
        duration_s=raw["duration_us"] / 1e6,
        p50_ms=raw["p50_us"] / 1000,
        p90_ms=raw["p90_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000,
        mean_ms=raw["mean_us"] / 1000,
        errors=errors,
        wrk_cpu=cpu / wall,
    )
