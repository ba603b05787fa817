"""``kvgate picker --workers N``: N picker processes on one gRPC port, sharing state through Redis.

Why processes: one picker process is one Python interpreter, so about one core (grpc.aio and the
scheduler hold the GIL; grpc's own C threads add a third of a core under load: 1.33 cores measured
on 16 cores, bench/results/device-16core/workers-4-upstreams.md).
Why one port: a gateway configures one endpoint-picker address (the Inference Extension's 9002);
the workers bind it with ``SO_REUSEPORT`` and the kernel spreads the gateway's HTTP/2 connections
over them (Envoy opens at least one per worker thread).

Why Redis for what they share: each worker must see the others' picks (prefix index, in-flight
counts, sessions) or routing falls apart (a prefix learned by one worker is unknown to the rest).
kvgate already shares exactly that between pickers on different hosts through Redis
(``gateway.picker.shared_state``: batched off the request path, bounded reads, TTLs, a picker that dies
ages out, Redis going away degrades to the local view), tested and measured
(bench/results/redis_sharing.md). Workers on one host are the same problem on one machine, so they
use the same mechanism instead of a second one (shared memory would need its own locking,
versioning and crash handling). With ``--redis URL`` the workers share it with every other picker;
without, the supervisor starts a private ``redis-server`` on a free loopback port for them.
One worker per pool scrapes the replicas and the others adopt its scrapes through the same Redis
(``gateway.picker.shared_state.scrapes``; ``--no-shared-scrapes``: each worker scrapes them itself).

``SO_REUSEPORT`` spreads connections, not requests, and a gateway multiplexes every request over a
few HTTP/2 connections, so N workers behind one port are balanced only as well as the kernel's hash
spreads those few connections. Each worker therefore also serves a port of its own (the ready
line's ``grpc_workers=``): a data plane that kvgate configures lists those in its ext_proc cluster
and balances requests over them (least request).

The supervisor starts the workers, prints one ready line when all are serving, restarts a worker
that dies (with back-off), and on SIGTERM/SIGINT stops them all and its private Redis.

``kvgate up --workers N`` (:class:`UpWorkers`) keeps its in-process picker and adds N - 1 worker
processes: ``kvgate picker --watch`` on a pools file that the control plane rewrites with every
configuration it applies (before Envoy learns it), each on a port chosen in advance so that the
ext_proc cluster kvgate writes lists all N pickers from the first snapshot on. Each worker has its
own admin server and /metrics (on a free port); ``kvgate up``'s /metrics is the in-process one's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvgate.extproc.attempt_timeout import AttemptTimeout
from kvgate.gateway.picker.pools_file import PoolSpec, dump_pools
from kvgate.gateway.picker.tracing import TracingSettings
from kvgate.gateway.processes import event_loop
from kvgate.gateway.processes.child_process import ChildProcess, ChildProcessError
from kvgate.gateway.processes.envoy_process import free_port, free_ports
from kvgate.policies.errors import ConfigError
from kvgate.policies.state import DEFAULT_MAX_SESSIONS

log = logging.getLogger(__name__)

WORKER_READY = "kvgate-picker ready"
READY_TIMEOUT_S = 30.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """What the supervisor runs: ``command(index)`` is one worker's argv."""

    workers: int
    grpc_port: int
    admin_port: int
    base_command: tuple[str, ...]
    """The worker's argv without ``--grpc-port``, ``--admin-port``, ``--redis`` and ``--workers``."""
    own_ports: tuple[int, ...] = ()
    """Each worker's own gRPC port, when the caller must know it in advance (else any free)."""
    outcome_ports: tuple[int, ...] = ()
    """Each worker's outcome-report port, likewise (used with ``--outcome-reports``)."""

    def command(self, index: int, redis_url: str) -> list[str]:
        admin = self.admin_port + index if self.admin_port else 0
        own = self.own_ports[index] if index < len(self.own_ports) else 0
        outcome = self.outcome_ports[index] if index < len(self.outcome_ports) else 0
        return [
            *self.base_command, "--workers", "1", "--reuse-port", "--worker-index", str(index),
            "--grpc-port", str(self.grpc_port), "--admin-port", str(admin), "--redis", redis_url,
            "--own-port", str(own), "--outcome-port", str(outcome),
        ]


_SIZE = re.compile(r"^\s*(\d+)\s*(|B|KiB|MiB|GiB)\s*$")
_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def byte_size(text: str) -> int:
    """``--max-request-body``: bytes, or with ``KiB``, ``MiB`` or ``GiB``."""
    found = _SIZE.match(text)
    if found is None or int(found.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 33554432 or 32MiB)")
    return int(found.group(1)) * _UNITS[found.group(2)]


AUTO_WORKERS_MAX = 8


def auto_workers(cpus: int, redis_available: bool) -> int:
    """``--workers auto``: one picker process per two cores, at most 8, when the workers can share
    their state (``--redis``, or a ``redis-server`` to start); else one. On the 16-core device, 1 KB
    at concurrency 64 through ``kvgate up`` had a p99 of 2.1x the one-pass floor's with one process,
    1.7x with 4 and 1.4x with 8 (bench/results/device-16core/datapath-up-c64.md); a picker process
    saturates near one core, Envoy and the model servers' traffic take the other half."""
    if not redis_available:
        return 1
    return max(1, min(AUTO_WORKERS_MAX, cpus // 2))


def available_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may use: its CPU affinity, and a container's CPU limit (cgroup v2's
    ``cpu.max`` quota over its period, rounded up), whichever is fewer. A Kubernetes Pod with a CPU
    limit runs on every core of its node, so the affinity alone counts the node's."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not Linux)
        cores = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    return cores


def workers_argument(text: str) -> int:
    """``--workers``: a whole number from 1, or ``auto`` (0 here: resolved by :func:`resolve_workers`)."""
    if text == "auto":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number or auto") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def resolve_workers(workers: int, redis_url: str | None) -> int:
    """``workers`` as given, or (0: ``auto``) :func:`auto_workers` for this machine."""
    if workers > 0:
        return workers
    return auto_workers(available_cpus(), redis_url is not None or shutil.which("redis-server") is not None)


class PrivateRedis:
    """A ``redis-server`` on a free loopback port for one supervisor's workers (no persistence)."""

    def __init__(self, binary: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._binary = binary
        self._child: ChildProcess | None = None

    @staticmethod
    def find() -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError(
                "--workers > 1 shares the picker's state through Redis: give --redis URL, "
                "or install redis-server (e.g. apt-get install redis-server) for a private one"
            )
        return binary

    async def start(self) -> None:
        self._child = ChildProcess([
            self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--protected-mode", "yes",
        ], name="the private redis-server", keep_lines=50)
        await self._child.start()
        try:
            await self._child.wait_for_line(r".*Ready to accept connections", timeout_s=10.0)
        except ChildProcessError as exc:
            await self._child.stop()
            raise ConfigError(f"the private redis-server did not start: {exc}") from exc

    async def stop(self) -> None:
        if self._child is not None:
            await self._child.stop()


class WorkerSupervisor:
    def __init__(self, plan: WorkerPlan, redis_url: str | None) -> None:
        self.plan = plan
        self._redis_url = redis_url
        self._private: PrivateRedis | None = None
        self._processes: list[ChildProcess | None] = [None] * plan.workers
        self.admin_urls: list[str] = [""] * plan.workers
        self.own_addresses: list[str] = [""] * plan.workers
        """Each worker's own gRPC ``host:port`` (besides the shared one), as it last reported."""
        self.healths: list[str] = [""] * plan.workers
        """Each worker's gRPC health ``host:port``, as it last reported."""
        self.outcome_addresses: list[str] = [""] * plan.workers
        """Each worker's outcome-report ``host:port`` (with ``--outcome-reports``)."""

    @property
    def redis_url(self) -> str:
        assert self._redis_url is not None
        return self._redis_url

    async def start(self) -> None:
        """Start Redis (if private) and every worker (``admin_urls``, ``own_addresses`` then)."""
        if self._redis_url is None:
            self._private = PrivateRedis(PrivateRedis.find())
            await self._private.start()
            self._redis_url = self._private.url
        await asyncio.gather(*(self._start_worker(i) for i in range(self.plan.workers)))

    async def _start_worker(self, index: int) -> None:
        child = ChildProcess(
            self.plan.command(index, self.redis_url), name=f"picker worker {index}", stderr="inherit",
            keep_lines=100,
        )
        self._processes[index] = child
        await child.start()
        try:
            ready = await child.wait_for_line(re.escape(WORKER_READY) + ".*", READY_TIMEOUT_S)
        except ChildProcessError as exc:
            await child.stop()
            raise ConfigError(str(exc)) from exc
        words = dict(w.split("=", 1) for w in ready.group(0).split()[2:] if "=" in w)
        self.admin_urls[index] = words.get("admin", "")
        self.own_addresses[index] = words.get("own", "")
        self.healths[index] = words.get("health", "")
        self.outcome_addresses[index] = words.get("outcomes", "")
        child.echo = sys.stdout  # what it prints from now on (its ready line is this supervisor's to say)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart workers that die, until ``stop`` is set."""
        failures = [0] * self.plan.workers
        while not stop.is_set():
            waits = {
                asyncio.create_task(p.wait()): i for i, p in enumerate(self._processes) if p is not None
            }
            stopper = asyncio.create_task(stop.wait())
            done, pending = await asyncio.wait({*waits, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            if stop.is_set():
                return
            for task in done:
                index = waits.get(task)
                if index is None:
                    continue
                delay = RESTART_BACKOFF_S[min(failures[index], len(RESTART_BACKOFF_S) - 1)]
                failures[index] += 1
                log.warning("picker worker %d exited (%s); restarting in %.1f s", index, task.result(), delay)
                await asyncio.sleep(delay)
                try:
                    await self._start_worker(index)
                except ConfigError as exc:
                    log.error("%s", exc.message)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the workers: each drains (its ``--drain-timeout``) and is killed after ``timeout_s``."""
        await asyncio.gather(*(p.stop(timeout_s) for p in self._processes if p is not None))
        if self._private is not None:
            await self._private.stop()


def worker_base_command(argv: Sequence[str]) -> tuple[str, ...]:
    """This process's ``kvgate picker`` argv without the options the supervisor sets per worker."""
    drop_with_value = {"--grpc-port", "--admin-port", "--redis", "--workers", "--worker-index", "--own-port",
                       "--outcome-port"}
    out: list[str] = [sys.executable, "-m", "kvgate.gateway.cli", "picker"]
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in drop_with_value:
            skip = "=" not in arg
            continue
        if name == "--reuse-port":
            continue
        out.append(arg)
    return tuple(out)


class UpWorkers:
    """``kvgate up --workers N``: N - 1 picker processes beside the in-process picker."""

    def __init__(
        self, count: int, *, scrape_interval: float, stale_after: float,
        attempt_timeout: AttemptTimeout | None = None,
        skip_unread_responses: bool = False,
        shared_scrapes: bool = True,
        shared_fairness: bool = True,
        loop: str = event_loop.DEFAULT,
        tracing: TracingSettings | None = None,
        read_usage_every: int = 0,
        max_session_pins: int = DEFAULT_MAX_SESSIONS,
        max_request_body: int | None = None,
    ) -> None:
        self.count = count
        self.directory = Path(tempfile.mkdtemp(prefix="kvgate-workers-"))
        self.pools_path = self.directory / "pools.yaml"
        # chosen in advance, all distinct (two random draws can meet: seen once in CI)
        ports = free_ports(count + 1)
        self.own_ports, grpc_port = ports[:count], ports[count]
        self.addresses = tuple(f"127.0.0.1:{port}" for port in self.own_ports)
        """The workers' own gRPC addresses (for the ext_proc cluster)."""
        self.outcome_ports = (free_ports(count, taken=(*self.own_ports, grpc_port))
                              if skip_unread_responses else ())
        self.outcome_addresses = tuple(f"127.0.0.1:{port}" for port in self.outcome_ports)
        """Where the workers take Envoy's outcome reports (for the outcome cluster)."""
        self.plan = WorkerPlan(
            workers=count, grpc_port=grpc_port, admin_port=0,
            base_command=(
                sys.executable, "-m", "kvgate.gateway.cli", "picker", "--pools", str(self.pools_path),
                "--watch",
                "--host", "127.0.0.1", "--scrape-interval", f"{scrape_interval:g}",
                "--stale-after", f"{stale_after:g}", "--log-level", "WARNING", "--loop", loop,
                # kvgate up's Envoy reaches its pickers over loopback, in plaintext; its own health
                "--secure-serving=false", "--grpc-health-port", "0",
                *_attempt_flags(attempt_timeout),
                *(("--skip-unread-responses", "--outcome-reports") if skip_unread_responses else ()),
                *(() if shared_scrapes else ("--no-shared-scrapes",)),
                *(() if shared_fairness else ("--no-shared-fairness",)),
                *(tracing.args() if tracing is not None else ()),
                *(("--read-usage-every", str(read_usage_every)) if read_usage_every else ()),
                *(("--max-session-pins", str(max_session_pins))
                  if max_session_pins != DEFAULT_MAX_SESSIONS else ()),
                *(("--max-request-body", str(max_request_body)) if max_request_body is not None else ()),
            ),
            own_ports=self.own_ports,
            outcome_ports=self.outcome_ports,
        )
        self._private: PrivateRedis | None = None
        self._supervisor: WorkerSupervisor | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def admin_urls(self) -> tuple[str, ...]:
        """Each worker's admin server (``/debug/pools``, ``/metrics``), once started."""
        return tuple(self._supervisor.admin_urls) if self._supervisor is not None else ()

    async def redis_url(self, given: str | None) -> str:
        """``given``, else a private redis-server started now (every picker shares through it)."""
        if given is not None:
            return given
        self._private = PrivateRedis(PrivateRedis.find())
        await self._private.start()
        return self._private.url

    def write_pools(self, specs: Sequence[PoolSpec], default: str | None) -> None:
        """The pool table the control plane just gave the in-process picker, for the workers
        (written whole, then renamed into place; an empty table is not written)."""
        if not specs:
            return
        staged = self.pools_path.with_suffix(".tmp")
        staged.write_text(dump_pools(specs, default))
        os.replace(staged, self.pools_path)

    async def start(self, redis_url: str) -> None:
        """Start the workers (after the first ``write_pools``) and watch over them."""
        self._supervisor = WorkerSupervisor(self.plan, redis_url)
        await self._supervisor.start()
        self._task = asyncio.create_task(self._supervisor.supervise(self._stop))

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 2.0)
        if self._supervisor is not None:
            await self._supervisor.stop()
        if self._private is not None:
            await self._private.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def _attempt_flags(bound: AttemptTimeout | None) -> tuple[str, ...]:
    if bound is None:
        return ()
    return ("--attempt-timeout", f"{bound.base_s:g}", "--attempt-timeout-per-token", f"{bound.per_token_s:g}")
