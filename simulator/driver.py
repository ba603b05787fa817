"""The IO shell around one replica's sans-IO engine: runs its steps in real time.

One asyncio task per replica loops ``begin_step`` → sleep → ``end_step``. A step of simulated
duration ``d`` lasts ``d * time_scale * faults.slowdown`` real seconds; simulated time is
``(loop.time() - t0) / time_scale``. Sleeps aim at absolute deadlines, so event-loop jitter does not
accumulate; when the loop falls behind, the next step starts at the current clock (the simulation
then runs slower than real time, which the lag monitor shows).

Requests are :class:`Delivery` handles. After each step the driver groups that step's events by
request and wakes each waiting handler once (streaming handlers on every step that made one of
their tokens, non-streaming ones only when finished), so the cost per step is one wake-up per
active stream, not one per event.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from kvgate.simulator.engine import Engine, Finished, FirstToken, SimRequest, TokenOut


class ReplicaStopped(Exception):
    """The replica was stopped while the request was in flight."""


class Delivery:
    """What a handler waits on: tokens made so far, the final event, or an error."""

    __slots__ = ("_wake", "error", "finished", "first_token_time", "request", "stream", "tokens_made")

    def __init__(self, request: SimRequest, stream: bool) -> None:
        self.request = request
        self.stream = stream
        self.tokens_made = 0
        self.first_token_time: float | None = None
        self.finished: Finished | None = None
        self.error: BaseException | None = None
        self._wake = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.finished is not None or self.error is not None

    async def wait(self) -> None:
        """Until something new happened (a token, the end or an error) since the last wait."""
        if not self.done:
            await self._wake.wait()
        self._wake.clear()

    def _notify(self) -> None:
        self._wake.set()


FinishedListener = Callable[[Finished], None]


class EngineDriver:
    """Runs one engine in real time (scaled) and delivers its tokens to waiting handlers."""

    def __init__(
        self,
        engine: Engine,
        time_scale: float,
        slowdown: Callable[[], float] = lambda: 1.0,
        on_finished: FinishedListener | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> None:
        """``on_step``: called after each engine step (the replica's KV-event publisher)."""
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.engine = engine
        self.time_scale = time_scale
        self._slowdown = slowdown
        self._on_finished = on_finished
        self._on_step = on_step
        self._deliveries: dict[str, Delivery] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self.steps = 0

    def now(self) -> float:
        """Simulated seconds since the driver started."""
        return (self._loop.time() - self._t0) / self.time_scale

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kvgate-sim-engine")

    async def stop(self) -> None:
        self.fail_all(ReplicaStopped("the replica stopped"))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, request: SimRequest, stream: bool) -> Delivery:
        """Hands ``request`` to the engine (it joins the next step); raises ValueError if it can't fit."""
        self.engine.submit(request, self.now())
        delivery = Delivery(request, stream)
        self._deliveries[request.request_id] = delivery
        self._wake.set()
        return delivery

    def abort(self, request_id: str) -> None:
        """Forget a request (client gone); the engine frees its blocks. No-op once finished."""
        if self._deliveries.pop(request_id, None) is not None:
            self.engine.abort(request_id, self.now())

    def fail_all(self, error: BaseException) -> None:
        """Ends every in-flight request with ``error`` (and aborts it in the engine)."""
        now = self.now()
        for request_id, delivery in list(self._deliveries.items()):
            self.engine.abort(request_id, now)
            delivery.error = error
            delivery._notify()
        self._deliveries.clear()

    @property
    def in_flight(self) -> int:
        return len(self._deliveries)

    async def _run(self) -> None:
        loop = self._loop
        scale = self.time_scale
        step_end = 0.0
        while True:
            if not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
            begin = max(step_end, self.now())
            duration = self.engine.begin_step(begin)
            if duration is None:
                # work that cannot be scheduled now (e.g. waiting for blocks freed by an abort):
                # wait for the next submit/abort rather than spin.
                self._wake.clear()
                await self._wake.wait()
                continue
            step_end = begin + duration * self._slowdown()
            deadline = self._t0 + step_end * scale
            delay = deadline - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            events = self.engine.end_step(step_end)
            self.steps += 1
            self._deliver(events)
            if self._on_step is not None:
                self._on_step()

    def _deliver(self, events: list[FirstToken | TokenOut | Finished]) -> None:
        touched: dict[str, Delivery] = {}
        deliveries = self._deliveries
        for event in events:
            delivery = deliveries.get(event.request_id)
            if isinstance(event, TokenOut):
                if delivery is not None:
                    delivery.tokens_made = event.index + 1
                    if delivery.stream:
                        touched[event.request_id] = delivery
            elif isinstance(event, FirstToken):
                if delivery is not None:
                    delivery.first_token_time = event.time
            else:
                if self._on_finished is not None:
                    self._on_finished(event)
                if delivery is not None:
                    delivery.finished = event
                    delivery.tokens_made = event.completion_tokens
                    touched[event.request_id] = delivery
                    del deliveries[event.request_id]
        for delivery in touched.values():
            delivery._notify()


class LagMonitor:
    """Measures event-loop lag: how late a ``sleep(interval)`` wakes up, sampled continuously.

    One per process (every replica of a fleet shares its loop). ``summary(window_s)`` gives
    percentiles over the samples of the last ``window_s`` real seconds.
    """

    def __init__(self, interval_s: float = 0.005, keep: int = 200_000) -> None:
        self.interval_s = interval_s
        self._samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kvgate-sim-lag-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.interval_s
        while True:
            before = loop.time()
            await asyncio.sleep(interval)
            after = loop.time()
            self._samples.append((after, max(0.0, after - before - interval)))

    def summary(self, window_s: float = 60.0) -> dict[str, float]:
        """p50/p99/max/mean lag in milliseconds over the last ``window_s`` seconds."""
        since = asyncio.get_running_loop().time() - window_s
        lags = sorted(lag for stamp, lag in self._samples if stamp >= since)
        if not lags:
            return {"samples": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "mean_ms": 0.0}
        n = len(lags)
        return {
            "samples": n,
            "p50_ms": 1000 * lags[min(n - 1, int(0.50 * n))],
            "p99_ms": 1000 * lags[min(n - 1, int(0.99 * n))],
            "max_ms": 1000 * lags[-1],
            "mean_ms": 1000 * sum(lags) / n,
        }
