"""Work done after a reply is written: request metrics and the scheduler's feedback, in order.

The lifecycle records its metrics (prometheus_client histograms and counters: a lock and a Python
bucket search each) and tells the scheduler what happened (the pick counted in flight and its
prompt in the prefix index, the first token, the end) while it answers Envoy. None of it changes the
reply, so it waits in one :class:`AfterReply` queue per process: the servicer writes the message's
replies, then calls :meth:`AfterReply.flush`. At concurrency 1 the request's path runs with cold
caches (``python -m kvgate.bench.datapath.offline --cold-mb 32``), where this work costs several times
what it costs warm.

Ordering: one FIFO for every stream of the process, so the scheduler hears each request's events
in the order they happened. The lifecycle flushes the queue before every pick, so a pick always sees
every earlier pick (in-flight counts, the prefix index: the anti-herding signal) whichever stream
it came from and whether or not that stream's reply has been written yet. The counts are the same,
in the same order, a message later. Single-threaded (the servicer's event loop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kvgate.extproc.ports import RequestLabels, RequestMetrics

_log = logging.getLogger(__name__)


class AfterReply:
    """A FIFO of calls made at :meth:`flush` (one that raises is logged and the rest go on)."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = []

    def defer(self, what: str, call: Callable[..., None], *args: Any) -> None:
        """Queue ``call(*args)``; ``what`` names it in the log if it raises."""
        self._pending.append((what, call, args))

    def flush(self) -> None:
        """Make the queued calls, in order (also those queued while flushing)."""
        while self._pending:
            pending, self._pending = self._pending, []
            for what, call, args in pending:
                call_logged(what, call, *args)

    @property
    def pending(self) -> int:
        return len(self._pending)


def call_logged(what: str, call: Callable[..., None], *args: Any) -> None:
    """``call(*args)``; an exception is logged as ``what`` failing, never raised: feedback and
    metrics must not break a response that is already flowing."""
    try:
        call(*args)
    except Exception:
        _log.exception("%s failed", what)


class DeferredMetrics:
    """A :class:`RequestMetrics` that queues every call for ``target`` on ``queue``."""

    def __init__(self, target: RequestMetrics, queue: AfterReply | None = None) -> None:
        self.target = target
        self.queue = queue or AfterReply()

    def flush(self) -> None:
        self.queue.flush()

    @property
    def pending(self) -> int:
        return self.queue.pending

    def request_picked(self, labels: RequestLabels, body_size: int) -> None:
        self.queue.defer("request metrics", self.target.request_picked, labels, body_size)

    def request_error(self, labels: RequestLabels, code: str) -> None:
        self.queue.defer("request metrics", self.target.request_error, labels, code)

    def scheduled(self, pool: str, seconds: float) -> None:
        self.queue.defer("request metrics", self.target.scheduled, pool, seconds)

    def served_by_fallback(self, labels: RequestLabels) -> None:
        self.queue.defer("request metrics", self.target.served_by_fallback, labels)

    def first_token(self, labels: RequestLabels, seconds: float) -> None:
        self.queue.defer("request metrics", self.target.first_token, labels, seconds)

    def tokens(self, labels: RequestLabels, prompt_tokens: int, completion_tokens: int) -> None:
        self.queue.defer("request metrics", self.target.tokens, labels, prompt_tokens, completion_tokens)

    def request_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self.queue.defer("request metrics", self._finished, labels, seconds, ok)

    def _finished(self, labels: RequestLabels, seconds: float, ok: bool) -> None:
        self.target.request_finished(labels, seconds, ok=ok)

    def prefill_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self.queue.defer("request metrics", self._prefill_finished, labels, seconds, ok)

    def prefix_checked(
        self, labels: RequestLabels, predicted: int, best: int, actual: int, block: int
    ) -> None:
        self.queue.defer("request metrics", self.target.prefix_checked, labels, predicted, best, actual,
                         block)

    def _prefill_finished(self, labels: RequestLabels, seconds: float, ok: bool) -> None:
        self.target.prefill_finished(labels, seconds, ok=ok)

    def spilled(self, pool: str, to_pool: str) -> None:
        self.queue.defer("request metrics", self.target.spilled, pool, to_pool)

    def slo_checked(self, labels: RequestLabels, objective: str, met: bool) -> None:
        self.queue.defer("request metrics", self.target.slo_checked, labels, objective, met)
