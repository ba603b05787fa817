"""Where a picker process spends its time: ``py-spy record`` on the live process, summarised.

py-spy samples the running ``kvgate picker`` from outside (no code change, low overhead with
``--nonblocking``) and writes collapsed stacks (``frame;frame;... count``). The summary gives
self time by function (the leaf frame), inclusive time of kvgate's own code (ext_proc,
scheduler, scraper parsing, telemetry), and self time by area (gRPC, codec, lifecycle, ...).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]+?)(?::(?P<line>\d+))?\)$")

LEAF_AREAS: tuple[tuple[str, str], ...] = (
    ("Handle._run (", "gRPC aio callbacks (Cython/C, run by the event loop)"),
    ("Thread.run (", "gRPC poller thread (C)"),
    ("Process (extproc/servicer.py)", "servicer loop incl. grpc.aio reads/writes (Cython)"),
)
"""Leaf Python frames that stand for C code: grpc.aio has no Python frames of its own."""

AREAS: tuple[tuple[str, str], ...] = (
    ("grpc/", "gRPC (grpc.aio, Cython)"),
    ("google/protobuf", "protobuf"),
    ("extproc/codec", "extproc codec (protobuf ⇄ events)"),
    ("extproc/servicer", "extproc servicer loop"),
    ("extproc/lifecycle", "extproc lifecycle"),
    ("extproc/decision", "extproc decision"),
    ("extproc/openai_", "OpenAI body parsing"),
    ("extproc/", "extproc other"),
    ("policies/", "scheduler (policies)"),
    ("gateway/telemetry", "telemetry (prometheus)"),
    ("prometheus_client", "telemetry (prometheus)"),
    ("gateway/picker/scrape", "scraper"),
    ("gateway/scraper", "scraper"),
    ("aiohttp", "scraper / admin HTTP (aiohttp)"),
    ("json/", "json"),
    ("uuid", "uuid"),
    ("logging/", "logging"),
    ("asyncio/", "asyncio event loop"),
)


@dataclass(frozen=True, slots=True)
class ProfileSummary:
    samples: int
    self_by_function: list[tuple[str, float]]
    inclusive_by_function: list[tuple[str, float]]
    self_by_area: list[tuple[str, float]]


def py_spy_binary() -> str | None:
    """py-spy on PATH, else beside this interpreter (a virtual environment's bin, not activated)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


async def record(pid: int, seconds: float, output: Path, rate: int = 200) -> None:
    """``py-spy record --format raw`` of ``pid`` for ``seconds`` (non-blocking sampling)."""
    binary = py_spy_binary()
    if binary is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    command = [
        binary, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
        "--rate", str(rate), "--format", "raw", "--nonblocking", "--output", str(output),
    ]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"py-spy failed ({process.returncode}): {err.decode(errors='replace')[-800:]}")


def _frames(stack: str) -> list[tuple[str, str]]:
    """(function label, file) of each Python frame, outermost first; process/thread entries dropped."""
    frames = []
    for part in stack.split(";"):
        match = _FRAME.match(part.strip())
        if match is None:
            continue
        file = match["file"]
        short = "/".join(file.split("/")[-2:])
        frames.append((f"{match['func']} ({short})", file))
    return frames


KVGATE_CODE = (
    "extproc/", "policies/", "gateway/picker/scrape", "gateway/picker/telemetry",
    "prometheus_client", "json/",
)


def area_of(label: str, file: str) -> str:
    for needle, area in LEAF_AREAS:
        if needle in label:
            return area
    for needle, area in AREAS:
        if needle in file:
            return area
    return "other"


def summarise(lines: Iterable[str], top: int = 15) -> ProfileSummary:
    """Summarise collapsed stacks (``stack count`` per line)."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = _frames(stack)
        if not frames:
            continue
        total += count
        label, file = frames[-1]
        self_time[label] += count
        areas[area_of(label, file)] += count
        for name in {label for label, file in frames if any(code in file for code in KVGATE_CODE)}:
            inclusive[name] += count

    def share(counter: Counter[str], limit: int) -> list[tuple[str, float]]:
        return [(name, n / total) for name, n in counter.most_common(limit)] if total else []

    area_count = len(AREAS) + len(LEAF_AREAS) + 1
    return ProfileSummary(total, share(self_time, top), share(inclusive, top), share(areas, area_count))


def summarise_file(path: Path, top: int = 15) -> ProfileSummary:
    return summarise(path.read_text(errors="replace").splitlines(), top)
