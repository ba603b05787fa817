"""Run an ``Engine`` over timed arrivals in virtual time: no clock, no sleeping, no event loop.

The driver is the same loop the server runs in real time: when the engine is idle it submits every
arrival due by ``now`` and begins a step; a step of duration ``d`` ends at ``now + d``; arrivals that
fall inside a step are submitted at their own time and join the next step (as in vLLM). When the
engine has nothing to do, time jumps to the next arrival. Aborts can be scheduled the same way.

Use ``run_virtual`` for one replica (tests, what-if runs) and ``run_fleet_virtual`` for several
replicas behind a routing function (a benchmark's what-if run of a routing policy, in virtual time).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kvgate.simulator.engine import Engine, EngineEvent, EngineMetrics, Finished, SimRequest, StepPlan


@dataclass(frozen=True)
class Arrival:
    """``request`` is submitted at simulated ``time``."""

    time: float
    request: SimRequest


@dataclass(frozen=True)
class Abort:
    """``request_id`` is aborted at simulated ``time``."""

    time: float
    request_id: str


@dataclass(frozen=True)
class StepRecord:
    """One step as it ran: when, what it did, and the engine's gauges right after scheduling it."""

    start: float
    plan: StepPlan
    metrics: EngineMetrics | None  # only when the run records metrics


@dataclass
class VirtualRun:
    """Everything a virtual-time run produced."""

    end_time: float = 0.0
    events: list[EngineEvent] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    finished: dict[str, Finished] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # request id -> ValueError message


StepObserver = Callable[[float, StepPlan, Engine], None]


def run_virtual(
    engine: Engine,
    arrivals: Iterable[Arrival | Abort],
    *,
    record_metrics: bool = False,
    record_events: bool = True,
    on_step: StepObserver | None = None,
    max_steps: int = 10_000_000,
    start: float = 0.0,
) -> VirtualRun:
    """Play ``arrivals`` (any order) through ``engine`` until every request is done.

    ``on_step(start, plan, engine)`` is called right after each step is scheduled (the engine may be
    read, e.g. ``engine.metrics()``, but not driven). Raises ``RuntimeError`` after ``max_steps``.
    """
    heap: list[tuple[float, int, Arrival | Abort]] = [(a.time, i, a) for i, a in enumerate(arrivals)]
    heapq.heapify(heap)
    run = VirtualRun()
    now = start

    def deliver(until: float, inclusive: bool) -> None:
        while heap and (heap[0][0] <= until if inclusive else heap[0][0] < until):
            t, _, item = heapq.heappop(heap)
            at = max(t, start)
            if isinstance(item, Abort):
                engine.abort(item.request_id, at)
                continue
            try:
                engine.submit(item.request, at)
            except ValueError as exc:
                run.rejected[item.request.request_id] = str(exc)

    steps = 0
    while heap or engine.has_work():
        deliver(now, inclusive=True)
        duration = engine.begin_step(now)
        if duration is None:
            if not heap:
                break
            now = max(now, heap[0][0])
            continue
        steps += 1
        if steps > max_steps:
            raise RuntimeError(f"virtual run exceeded {max_steps} steps")
        plan = engine.last_step
        assert plan is not None
        run.steps.append(StepRecord(now, plan, engine.metrics() if record_metrics else None))
        if on_step is not None:
            on_step(now, plan, engine)
        end = now + duration
        deliver(end, inclusive=False)
        for event in engine.end_step(end):
            if record_events:
                run.events.append(event)
            if isinstance(event, Finished):
                run.finished[event.request_id] = event
        now = end
    run.end_time = now
    return run


Router = Callable[[SimRequest, float, Sequence[Engine]], int]


@dataclass
class FleetRun:
    """Everything a virtual-time fleet run produced; events carry the replica index."""

    end_time: float = 0.0
    events: list[tuple[int, EngineEvent]] = field(default_factory=list)
    finished: dict[str, tuple[int, Finished]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)  # steps run per replica


def run_fleet_virtual(
    engines: Sequence[Engine],
    arrivals: Iterable[Arrival],
    route: Router,
    *,
    record_events: bool = True,
    max_steps: int = 10_000_000,
) -> FleetRun:
    """Play ``arrivals`` through several engines; ``route(request, now, engines)`` picks the index.

    At each instant, steps that end then are applied first, then arrivals are routed (the router may
    read ``peek``/``metrics``), then every idle replica with work begins a step: the same order as
    ``run_virtual`` and as the real-time server.
    """
    pending = sorted(arrivals, key=lambda a: a.time)
    ends: list[tuple[float, int]] = []
    run = FleetRun(steps=[0] * len(engines))
    next_arrival = 0
    now = pending[0].time if pending else 0.0
    total_steps = 0
    while next_arrival < len(pending) or ends:
        now = min(
            pending[next_arrival].time if next_arrival < len(pending) else float("inf"),
            ends[0][0] if ends else float("inf"),
        )
        while ends and ends[0][0] == now:
            _, index = heapq.heappop(ends)
            for event in engines[index].end_step(now):
                if record_events:
                    run.events.append((index, event))
                if isinstance(event, Finished):
                    run.finished[event.request_id] = (index, event)
        while next_arrival < len(pending) and pending[next_arrival].time <= now:
            request = pending[next_arrival].request
            next_arrival += 1
            try:
                engines[route(request, now, engines)].submit(request, now)
            except ValueError as exc:
                run.rejected[request.request_id] = str(exc)
        for index, engine in enumerate(engines):
            if not engine.in_step and engine.has_work():
                duration = engine.begin_step(now)
                if duration is not None:
                    heapq.heappush(ends, (now + duration, index))
                    run.steps[index] += 1
                    total_steps += 1
        if total_steps > max_steps:
            raise RuntimeError(f"virtual fleet run exceeded {max_steps} steps")
    run.end_time = now
    return run
