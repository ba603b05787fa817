"""extproc.deferred_metrics: request metrics queued during a reply and recorded after it, in order."""

from __future__ import annotations

import logging

import pytest

from extproc.deferred_metrics import DeferredMetrics
from extproc.ports import RequestLabels

LABELS = RequestLabels(pool="p", model="m", target_model="m")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def request_picked(self, labels: RequestLabels, body_size: int) -> None:
        self.calls.append(("picked", labels, body_size))

    def request_error(self, labels: RequestLabels, code: str) -> None:
        raise RuntimeError("a metrics bug")

    def scheduled(self, pool: str, seconds: float) -> None:
        self.calls.append(("scheduled", pool, seconds))

    def served_by_fallback(self, labels: RequestLabels) -> None:
        self.calls.append(("fallback", labels))

    def first_token(self, labels: RequestLabels, seconds: float) -> None:
        self.calls.append(("first_token", labels, seconds))

    def tokens(self, labels: RequestLabels, prompt_tokens: int, completion_tokens: int) -> None:
        self.calls.append(("tokens", labels, prompt_tokens, completion_tokens))

    def request_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self.calls.append(("finished", labels, seconds, ok))


def test_calls_wait_for_flush_and_keep_their_order() -> None:
    target = Recorder()
    deferred = DeferredMetrics(target)
    deferred.scheduled("p", 0.001)
    deferred.request_picked(LABELS, 1024)
    deferred.first_token(LABELS, 0.02)
    deferred.tokens(LABELS, 10, 5)
    deferred.served_by_fallback(LABELS)
    deferred.request_finished(LABELS, 0.5, ok=False)
    assert target.calls == []
    assert deferred.pending == 6
    deferred.flush()
    assert target.calls == [
        ("scheduled", "p", 0.001), ("picked", LABELS, 1024), ("first_token", LABELS, 0.02),
        ("tokens", LABELS, 10, 5), ("fallback", LABELS), ("finished", LABELS, 0.5, False),
    ]
    assert deferred.pending == 0
    deferred.flush()  # nothing queued: nothing again
    assert len(target.calls) == 6


def test_a_failing_call_is_logged_and_the_rest_are_made(caplog: pytest.LogCaptureFixture) -> None:
    target = Recorder()
    deferred = DeferredMetrics(target)
    deferred.request_error(LABELS, "bad_request")
    deferred.request_picked(LABELS, 1)
    with caplog.at_level(logging.ERROR, logger="extproc.deferred_metrics"):
        deferred.flush()
    assert target.calls == [("picked", LABELS, 1)]
    assert "request metrics call failed" in caplog.text
