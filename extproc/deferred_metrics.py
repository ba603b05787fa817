"""Request metrics recorded after the reply: a :class:`~extproc.ports.RequestMetrics` that queues.

The lifecycle records its metrics (prometheus_client histograms and counters: a lock and a Python
bucket search each) while it decides; the servicer writes the reply first and then calls
:meth:`DeferredMetrics.flush`, so that the observations leave the request's critical path. At
concurrency 1 that path runs with cold caches (``python -m bench.datapath_offline --cold-mb 32``),
where the observations cost several times what they cost warm. The counts are the same, in the
same order, a message later. Single-threaded (the servicer's event loop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from extproc.ports import RequestLabels, RequestMetrics

_log = logging.getLogger(__name__)


class DeferredMetrics:
    """Queues every :class:`RequestMetrics` call for ``target`` until :meth:`flush`."""

    def __init__(self, target: RequestMetrics) -> None:
        self.target = target
        self._pending: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def flush(self) -> None:
        """Make the queued calls, in order (one that raises is logged and the rest go on)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for call, args in pending:
            try:
                call(*args)
            except Exception:
                _log.exception("request metrics call failed")

    @property
    def pending(self) -> int:
        return len(self._pending)

    def request_picked(self, labels: RequestLabels, body_size: int) -> None:
        self._pending.append((self.target.request_picked, (labels, body_size)))

    def request_error(self, labels: RequestLabels, code: str) -> None:
        self._pending.append((self.target.request_error, (labels, code)))

    def scheduled(self, pool: str, seconds: float) -> None:
        self._pending.append((self.target.scheduled, (pool, seconds)))

    def served_by_fallback(self, labels: RequestLabels) -> None:
        self._pending.append((self.target.served_by_fallback, (labels,)))

    def first_token(self, labels: RequestLabels, seconds: float) -> None:
        self._pending.append((self.target.first_token, (labels, seconds)))

    def tokens(self, labels: RequestLabels, prompt_tokens: int, completion_tokens: int) -> None:
        self._pending.append((self.target.tokens, (labels, prompt_tokens, completion_tokens)))

    def request_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self._pending.append((self._finished, (labels, seconds, ok)))

    def _finished(self, labels: RequestLabels, seconds: float, ok: bool) -> None:
        self.target.request_finished(labels, seconds, ok=ok)
