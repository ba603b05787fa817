"""Child processes of the data-path benchmark (fast upstream, ``kvgate picker``) and CPU accounting."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.bench.datapath.upstream import READY_PREFIX as UPSTREAM_READY
from kvgate.gateway.processes import event_loop
from kvgate.gateway.processes.child_process import ChildProcess

PICKER_READY = "kvgate-picker ready"
READY_TIMEOUT_S = 30.0
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Child:
    """A started child process (``gateway.processes.child_process``) and the words after its ready prefix."""

    name: str
    process: ChildProcess
    ready_words: list[str]

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    async def stop(self, timeout_s: float = 5.0) -> None:
        await self.process.stop(timeout_s)


async def start_child(
    name: str, command: Sequence[str], ready_prefix: str, log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Child:
    """Start ``command``; return once a line starts with ``ready_prefix`` (output → ``log_path``)."""
    process = ChildProcess(command, name=name, log_path=log_path, keep_lines=200, env=env)
    await process.start()
    try:
        ready = await process.wait_for_line(re.escape(ready_prefix) + "(.*)$", READY_TIMEOUT_S)
    except BaseException:
        await process.stop()
        raise
    return Child(name, process, ready.group(1).split())


async def start_upstream(endpoints: int) -> tuple[Child, list[str]]:
    """The fast upstream (one process, ``endpoints`` ports); returns it and its ``ip:port`` list."""
    command = [sys.executable, "-m", "kvgate.bench.datapath.upstream", "--endpoints", str(endpoints)]
    child = await start_child("upstream", command, UPSTREAM_READY)
    return child, [url.removeprefix("http://") for url in child.ready_words]


async def start_null_picker(
    destination: str | Sequence[str], loop: str = event_loop.DEFAULT
) -> tuple[Child, tuple[str, int]]:
    """bench/datapath/null_picker.py routing everything to ``destination`` (several: round robin),
    on event loop ``loop``."""
    from kvgate.bench.datapath.null_picker import READY_PREFIX

    destinations = [destination] if isinstance(destination, str) else list(destination)
    command = [sys.executable, "-m", "kvgate.bench.datapath.null_picker",
               *(arg for d in destinations for arg in ("--destination", d)), "--loop", loop]
    child = await start_child("null_picker", command, READY_PREFIX)
    return child, ("127.0.0.1", int(child.ready_words[0]))


def pools_yaml(endpoints: Sequence[str], pool: str, profile: str) -> str:
    lines = [f"pools:\n  - name: {pool}\n    profile: {profile}\n    engine: vllm\n    endpoints:"]
    lines.extend(f'      - "{address}"' for address in endpoints)
    return "\n".join(lines) + "\n"


def kvgate_command() -> list[str]:
    """``kvgate`` from the running environment (its console script, else ``-m gateway.cli``)."""
    script = Path(sys.executable).with_name("kvgate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvgate.gateway.cli"]


async def start_picker(
    name: str, pools_file: Path, log_path: Path, extra: Sequence[str] = (), root: Path | None = None
) -> tuple[Child, tuple[str, int], str]:
    """``kvgate picker`` on free ports; returns it, its gRPC (host, port) and its admin URL.

    ``root``: run the picker of another kvgate checkout (e.g. a ``git worktree`` of an earlier
    commit, to compare two versions in one run) instead of this environment's."""
    args = [
        "picker", "--pools", str(pools_file), "--secure-serving=false", "--grpc-health-port", "0",
        "--grpc-port", "0", "--admin-port", "0", *extra,
    ]
    env = None
    if root is None:
        command = [*kvgate_command(), *args]
    else:  # -P: the working directory does not go first on sys.path; the checkout does
        module = "kvgate.gateway.cli" if (root / "kvgate").is_dir() else "gateway.cli"  # before kvgate.*
        command = [sys.executable, "-P", "-m", module, *args]
        inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "proto"), *inherited]))
    child = await start_child(name, command, PICKER_READY, log_path, env=env)
    words = dict(word.split("=", 1) for word in child.ready_words)
    host, _, port = words["grpc"].rpartition(":")
    return child, (host, int(port)), words["admin"]


def outcome_address(child: Child, grpc: tuple[str, int]) -> tuple[str, int]:
    """Where a ``kvgate picker --outcome-reports`` takes Envoy's reports (its ready line's
    ``outcomes=``; a picker of an earlier checkout took them on its gRPC port)."""
    words = dict(word.split("=", 1) for word in child.ready_words if "=" in word)
    if "outcomes" not in words:
        return grpc
    host, _, port = words["outcomes"].rpartition(":")
    return host, int(port)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def cpu_snapshot(pids: Mapping[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def cpu_share(before: Mapping[str, float], after: Mapping[str, float], wall_s: float) -> dict[str, float]:
    """Cores used by each process over ``wall_s`` (1.0 = one core busy all the time)."""
    return {name: (after[name] - before[name]) / wall_s for name in before}


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def picker_processes(pid: int) -> tuple[list[int], list[int]]:
    """The picker workers (the process itself when it has no python children) and the Redis servers."""
    workers: list[int] = []
    servers: list[int] = []
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            name = Path(f"/proc/{child}/comm").read_text().strip()
            (servers if name.startswith("redis") else workers).append(child)
    return (workers or [pid]), servers


class TreeCpu:
    """CPU seconds of named process trees (each pid and its descendants) since this was made."""

    def __init__(self, trees: Mapping[str, int]) -> None:
        self.trees = dict(trees)
        self.before = {name: group_cpu(pid) for name, pid in self.trees.items()}
        self.started = time.monotonic()

    def used(self) -> tuple[dict[str, float], float]:
        """CPU seconds per tree since then, and the wall seconds."""
        wall = time.monotonic() - self.started
        return {name: group_cpu(pid) - self.before[name] for name, pid in self.trees.items()}, wall


def group_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and all its descendants."""
    total = 0.0
    for member in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError):
            total += cpu_seconds(member)
    return total
