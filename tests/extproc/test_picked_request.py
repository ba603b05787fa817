"""A picked request's feedback: each hook told once where it must be, deferred when queued."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvgate.extproc.after_reply import AfterReply
from kvgate.extproc.decision import Decision
from kvgate.extproc.picked_request import PickedRequest
from kvgate.extproc.ports import RequestLabels, TenantKey
from kvgate.policies.contracts import SchedulingResult
from kvgate.policies.types import Endpoint, InferenceRequest, Usage
from tests.extproc.fakes import RecordingMetrics, RecordingScheduler, StepClock

PICK, FALLBACK = "10.0.0.1:8000", "10.0.0.2:8000"
TENANT = TenantKey("llama", "team-a")


@dataclass
class RecordingLimiter:
    charged: list[tuple[TenantKey, int]] = field(default_factory=list)

    def check(self, pool: str, headers: Mapping[str, str]) -> TenantKey | None:
        return None

    def record_request(self, key: TenantKey) -> None:
        pass

    def counts_tokens(self, pool: str) -> bool:
        return True

    def charge_tokens(self, key: TenantKey, tokens: int) -> None:
        self.charged.append((key, tokens))


def decision(*, tenant: TenantKey | None = None, stream: bool = False,
             headers: Mapping[str, str] | None = None) -> Decision:
    request = InferenceRequest("r1", "llama", "m", "m-lora", stream=stream, headers=headers or {})
    ranked = (Endpoint(PICK, "llama"), Endpoint(FALLBACK, "llama"))
    labels = RequestLabels("llama", "m", "m-lora")
    return Decision(request, SchedulingResult(ranked, "test"), b"{}", False, False, labels, tenant)


def picked(
    scheduler: RecordingScheduler, metrics: RecordingMetrics, *, queue: AfterReply | None = None,
    tenant: TenantKey | None = None, clock: StepClock | None = None, stream: bool = False,
    headers: Mapping[str, str] | None = None,
) -> PickedRequest:
    return PickedRequest(decision(tenant=tenant, stream=stream, headers=headers), scheduler, metrics=metrics,
                         clock=clock or StepClock(), started=100.0, after_reply=queue)


def test_labels_name_the_pool_and_both_models() -> None:
    p = picked(RecordingScheduler(), RecordingMetrics())
    assert p.labels == RequestLabels("llama", "m", "m-lora")
    assert p.served.address == PICK


def test_finished_once_with_the_endpoint_that_served_and_the_metrics_counted_once() -> None:
    scheduler, metrics = RecordingScheduler(), RecordingMetrics()
    p = picked(scheduler, metrics)
    p.picked(first_token_unseen=False)
    p.finish(ok=True)
    p.finish(ok=False)
    assert scheduler.calls == [("picked", PICK), ("finished", (PICK, True))]
    assert [e for e in metrics.events if e[0] == "finished"] == [("finished", True)]


def test_an_outcome_reported_later_is_not_told_as_ok_but_counted_ok_in_the_metrics() -> None:
    scheduler, metrics = RecordingScheduler(), RecordingMetrics()
    picked(scheduler, metrics).finish(ok=True, count_outcome=False)
    assert scheduler.calls == [("finished", (PICK, False))]
    assert metrics.events == [("finished", True)]


def test_a_skipped_stream_ends_its_prefill_at_the_estimate() -> None:
    scheduler = RecordingScheduler()
    picked(scheduler, RecordingMetrics()).picked(first_token_unseen=True)
    assert scheduler.unseen_first_tokens == [PICK]


def test_the_first_token_is_told_once() -> None:
    scheduler, metrics = RecordingScheduler(), RecordingMetrics()
    p = picked(scheduler, metrics)
    p.first_token()
    p.first_token()
    assert scheduler.first_tokens == [PICK]
    assert [kind for kind, _ in metrics.events] == ["ttft"]


def test_a_fallback_serving_fails_the_pick_and_moves_the_request() -> None:
    scheduler, metrics = RecordingScheduler(), RecordingMetrics()
    p = picked(scheduler, metrics)
    p.served_by(None)
    p.served_by(PICK)
    assert scheduler.calls == []
    assert scheduler.failed_endpoints == []
    p.served_by(FALLBACK)
    p.served_by(FALLBACK)  # told once
    assert scheduler.failed_endpoints == [PICK]
    assert scheduler.calls == [("served", FALLBACK)]
    assert metrics.events == [("fallback", "llama")]
    p.finish(ok=True)
    assert scheduler.calls[-1] == ("finished", (FALLBACK, True))


def test_an_address_outside_the_ranking_is_still_followed() -> None:
    scheduler = RecordingScheduler()
    p = picked(scheduler, RecordingMetrics())
    p.served_by("10.0.0.9:8000")
    assert p.served == Endpoint("10.0.0.9:8000", "llama")
    assert scheduler.calls == [("served", "10.0.0.9:8000")]


def test_usage_is_counted_learned_and_charged_to_the_tenant_only_when_there_is_one() -> None:
    scheduler, metrics, limiter = RecordingScheduler(), RecordingMetrics(), RecordingLimiter()
    usage = Usage(prompt_tokens=30, completion_tokens=12)
    picked(scheduler, metrics).usage(usage, limiter)
    assert limiter.charged == []
    picked(scheduler, metrics, tenant=TENANT).usage(usage, limiter)
    assert limiter.charged == [(TENANT, 42)]
    assert scheduler.calls == [("usage", usage), ("usage", usage)]
    assert metrics.events == [("tokens", (30, 12)), ("tokens", (30, 12))]


def test_feedback_waits_for_the_queue_and_a_failing_hook_breaks_nothing() -> None:
    scheduler, metrics, queue = RecordingScheduler(), RecordingMetrics(), AfterReply()
    p = picked(scheduler, metrics, queue=queue)
    p.picked(first_token_unseen=False)
    p.endpoint_failed()
    assert scheduler.calls == []
    assert scheduler.failed_endpoints == []
    queue.flush()
    assert scheduler.calls == [("picked", PICK)]
    assert scheduler.failed_endpoints == [PICK]

    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    setattr(scheduler, "on_finished", broken)  # noqa: B010 (a method replaced on this instance only)
    p.finish(ok=True)
    queue.flush()  # logged, not raised
    assert metrics.events[-1] == ("finished", True)


def test_a_reported_cache_hit_is_checked_against_the_prediction_for_the_pick_only() -> None:
    """The regret check: the index's expected hit on the pick and on the best endpoint against the
    replica's ``cached_tokens``; a response served by a fallback, or without cached tokens, is not
    checked (the prediction was for another endpoint / there is nothing to check)."""
    base = decision()
    result = SchedulingResult(base.result.ranked, "test", predicted_cached_tokens=256, best_cached_tokens=512)
    predicted = Decision(base.request, result, base.body, False, False, base.labels)
    metrics = RecordingMetrics()

    def make() -> PickedRequest:
        return PickedRequest(predicted, RecordingScheduler(), metrics=metrics, clock=StepClock(),
                             started=100.0, after_reply=None)

    p = make()
    p.usage(Usage(prompt_tokens=600, completion_tokens=1, cached_tokens=240), None)
    p.usage(Usage(prompt_tokens=600, completion_tokens=1), None)  # no cached_tokens reported
    assert [e for e in metrics.events if e[0] == "prefix"] == [("prefix", (256, 512, 240))]
    elsewhere = make()
    elsewhere.served_by(FALLBACK)
    elsewhere.usage(Usage(prompt_tokens=600, completion_tokens=1, cached_tokens=0), None)
    assert len([e for e in metrics.events if e[0] == "prefix"]) == 1


def slo_events(metrics: RecordingMetrics) -> list[object]:
    return [value for kind, value in metrics.events if kind == "slo"]


def test_latency_objectives_are_checked_at_a_good_end() -> None:
    """A stream asking TTFT ≤ 300 ms and TPOT ≤ 20 ms: first token at 0.25 s (met), 11 tokens over
    the next 0.5 s = 50 ms a token (missed); a failed request and one without objectives count none."""
    clock, metrics = StepClock(), RecordingMetrics()
    clock.t = 100.0
    p = picked(RecordingScheduler(), metrics, clock=clock, stream=True,
               headers={"x-slo-ttft-ms": "300", "x-slo-tpot-ms": "20"})
    clock.t = 100.25
    p.first_token()
    p.usage(Usage(prompt_tokens=8, completion_tokens=11), None)
    clock.t = 100.75
    p.finish(ok=True)
    assert slo_events(metrics) == [("ttft", True), ("tpot", False)]
    failed = RecordingMetrics()
    q = picked(RecordingScheduler(), failed, stream=True, headers={"x-slo-ttft-ms": "300"})
    q.first_token()
    q.finish(ok=False)
    plain = RecordingMetrics()
    r = picked(RecordingScheduler(), plain, stream=True)
    r.first_token()
    r.finish(ok=True)
    assert slo_events(failed) == slo_events(plain) == []


def test_tpot_is_judged_on_streams_alone_and_needs_two_tokens() -> None:
    """A whole response's first byte is its last: its TTFT is checked, not its TPOT; a stream of one
    token has no time per token."""
    clock, metrics = StepClock(), RecordingMetrics()
    clock.t = 100.0
    whole = picked(RecordingScheduler(), metrics, clock=clock, headers={"x-slo-ttft-ms": "100",
                                                                          "x-slo-tpot-ms": "5"})
    clock.t = 100.2
    whole.first_token()
    whole.usage(Usage(prompt_tokens=8, completion_tokens=40), None)
    whole.finish(ok=True)
    assert slo_events(metrics) == [("ttft", False)]
    single = RecordingMetrics()
    one = picked(RecordingScheduler(), single, clock=clock, stream=True, headers={"x-slo-tpot-ms": "5"})
    one.first_token()
    one.usage(Usage(prompt_tokens=8, completion_tokens=1), None)
    one.finish(ok=True)
    assert slo_events(single) == []
