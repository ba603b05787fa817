"""extproc.after_reply: request metrics and the scheduler's feedback queued during a reply and done
after it, in order; a pick first makes every earlier pick's feedback."""

from __future__ import annotations

import logging

import pytest

from kvgate.extproc.after_reply import AfterReply, DeferredMetrics
from kvgate.extproc.events import StreamClosed
from kvgate.extproc.lifecycle import RequestLifecycle
from kvgate.extproc.ports import RequestLabels
from tests.extproc.fakes import (
    BUFFERED,
    NONE,
    FakeDirectory,
    RecordingScheduler,
    StepClock,
    completion,
    feed,
    make_pool,
    request_body,
    request_headers,
    set_headers,
)

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

    def prefill_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self.calls.append(("prefill", labels, seconds, ok))

    def prefix_checked(
        self, labels: RequestLabels, predicted: int, best: int, actual: int, block: int
    ) -> None:
        self.calls.append(("prefix", labels, predicted, best, actual))

    def spilled(self, pool: str, to_pool: str) -> None:
        self.calls.append(("spilled", pool, to_pool))

    def slo_checked(self, labels: RequestLabels, objective: str, met: bool) -> None:
        self.calls.append(("slo", labels, objective, met))


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
    with caplog.at_level(logging.ERROR, logger="kvgate.extproc.after_reply"):
        deferred.flush()
    assert target.calls == [("picked", LABELS, 1)]
    assert "request metrics failed" in caplog.text


def test_calls_queued_while_flushing_are_made_in_the_same_flush() -> None:
    queue = AfterReply()
    made: list[str] = []

    def first() -> None:
        made.append("first")
        queue.defer("later", made.append, "later")

    queue.defer("first", first)
    queue.flush()
    assert made == ["first", "later"]
    assert queue.pending == 0


def _one_pass_machine(pool: object, scheduler_queue: AfterReply) -> RequestLifecycle:
    directory = FakeDirectory({"llama": pool}, default="llama")  # type: ignore[dict-item]
    return RequestLifecycle(directory, StepClock(), after_reply=scheduler_queue)


def _pick(machine: RequestLifecycle) -> str:
    feed(machine, [request_headers(mode=BUFFERED, response_mode=NONE)])
    reply = feed(machine, [request_body(completion(stream=True), eos=True)])
    return set_headers(reply[0])["x-gateway-destination-endpoint"]


def test_the_scheduler_hears_of_a_pick_after_the_reply_and_before_the_next_pick() -> None:
    pool = make_pool("10.0.0.1:8000")
    scheduler: RecordingScheduler = pool.scheduler
    queue = AfterReply()
    first, second = _one_pass_machine(pool, queue), _one_pass_machine(pool, queue)
    assert _pick(first) == "10.0.0.1:8000"
    assert scheduler.calls == []  # the reply is out; the pick waits for the flush
    assert queue.pending >= 1
    _pick(second)  # another stream's pick: the first one's feedback is made before it is scored
    assert scheduler.calls == [("picked", "10.0.0.1:8000")]
    assert len(scheduler.seen) == 2
    queue.flush()
    assert scheduler.calls == [("picked", "10.0.0.1:8000"), ("picked", "10.0.0.1:8000")]


def test_feedback_keeps_each_requests_order_across_streams() -> None:
    pool = make_pool("10.0.0.1:8000")
    scheduler: RecordingScheduler = pool.scheduler
    queue = AfterReply()
    machine = _one_pass_machine(pool, queue)
    _pick(machine)
    machine.handle(StreamClosed(cancelled=False))  # ends before the servicer flushed: still in order
    assert scheduler.calls == []
    queue.flush()
    assert [kind for kind, _ in scheduler.calls] == ["picked", "finished"]


def test_a_failing_scheduler_call_is_logged_after_the_reply(caplog: pytest.LogCaptureFixture) -> None:
    pool = make_pool("10.0.0.1:8000")
    scheduler: RecordingScheduler = pool.scheduler

    def broken(*_args: object) -> None:
        raise RuntimeError("a scheduler bug")

    scheduler.on_picked = broken  # type: ignore[method-assign,assignment]
    queue = AfterReply()
    machine = _one_pass_machine(pool, queue)
    assert _pick(machine) == "10.0.0.1:8000"  # the request is routed; the bug cannot fail it
    with caplog.at_level(logging.ERROR, logger="kvgate.extproc.after_reply"):
        queue.flush()
    assert "on_picked failed" in caplog.text
