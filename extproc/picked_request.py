"""What a routed request tells the scheduler, the tenant limiter and the request metrics, from its
pick to its end: the lifecycle (:mod:`extproc.lifecycle`) decides *when*, this says *what*, each
exactly once where it must be (``on_picked`` at the pick, a first token once, ``on_finished`` once).

Feedback goes through the process's after-reply queue when there is one (:mod:`extproc.after_reply`:
done once the message's replies are written, and before any later pick), else at once; a failing
hook is logged and never breaks a response that is already flowing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvgate.extproc.after_reply import AfterReply, call_logged
from kvgate.extproc.decision import Decision
from kvgate.extproc.ports import Clock, RequestMetrics, TenantLimiter
from kvgate.policies.contracts import Scheduler
from kvgate.policies.latency_objectives import latency_objectives
from kvgate.policies.types import Endpoint, InferenceRequest, Usage


class PickedRequest:
    """One picked request's feedback; ``served`` follows the endpoint that really serves it."""

    __slots__ = ("_after_reply", "_clock", "_finished", "_first_token_at", "_metrics", "_output_tokens",
                 "_scheduler", "_started", "decision", "labels", "served")

    def __init__(
        self,
        decision: Decision,
        scheduler: Scheduler,
        *,
        metrics: RequestMetrics,
        clock: Clock,
        started: float,
        after_reply: AfterReply | None,
    ) -> None:
        """``started``: when the request's headers came (the clock's seconds), for its latencies."""
        self.decision = decision
        self.served: Endpoint = decision.result.pick
        self.labels = decision.labels
        self._scheduler = scheduler
        self._metrics = metrics
        self._clock = clock
        self._started = started
        self._after_reply = after_reply
        self._first_token_at: float | None = None
        self._output_tokens: int | None = None
        self._finished = False

    @property
    def request(self) -> InferenceRequest:
        return self.decision.request

    @property
    def finished(self) -> bool:
        return self._finished

    def freed_endpoints(self) -> tuple[str, ...]:
        """Where the request's end frees a place: the endpoint picked, the one that served it (a
        fallback), and its prefill half's (a prefill not reported ends with it)."""
        result = self.decision.result
        found = [result.pick.address, self.served.address]
        if result.prefill is not None:
            found.append(result.prefill.endpoint.address)
        return tuple(dict.fromkeys(found))

    def picked(self, *, first_token_unseen: bool) -> None:
        """At the pick: the request counted in flight on its endpoint; ``first_token_unseen``: no
        response will show its first token (a skipped stream), so its prefill ends at the
        scheduler's own estimate."""
        self._tell("on_picked", self._scheduler.on_picked, self.request, self.served, self._clock.now())
        if first_token_unseen:
            self.first_token_unseen()

    def served_by(self, address: str | None) -> None:
        """The data plane names the endpoint that serves: another than the pick means the data
        plane went on past the one before (it failed this request) to a fallback."""
        if address is None or address == self.served.address:
            return
        decision = self.decision
        known = next((e for e in decision.result.ranked if e.address == address), None)
        endpoint = known or Endpoint(address=address, pool=decision.request.pool)
        failed, self.served = self.served, endpoint
        self._metrics.served_by_fallback(self.labels)
        now = self._clock.now()
        self._tell("on_endpoint_failed", self._scheduler.on_endpoint_failed, self.request, failed, now)
        self._tell("on_served", self._scheduler.on_served, self.request, endpoint, now)

    def endpoint_failed(self) -> None:
        """The serving endpoint answered a server error (5xx)."""
        self._tell("on_endpoint_failed", self._scheduler.on_endpoint_failed, self.request, self.served,
                   self._clock.now())

    def first_token(self) -> None:
        """The response's first byte was seen (once: later calls do nothing)."""
        if self._first_token_at is not None:
            return
        now = self._first_token_at = self._clock.now()
        self._metrics.first_token(self.labels, now - self._started)
        self._tell("on_first_token", self._scheduler.on_first_token, self.request, self.served, now)

    def first_token_unseen(self) -> None:
        """A streamed response whose body the picker will not see: the prefill ends at the
        scheduler's own estimate."""
        self._tell("on_first_token_unseen", self._scheduler.on_first_token_unseen, self.request, self.served,
                   self._clock.now())

    def prefill_done(self, ok: bool, seconds: float, *, request_fault: bool = False) -> None:
        """The prefill half the picker ran answered (``ok``) or failed: its endpoint's bookkeeping
        ends (a failure counts against it, unless the endpoint refused the request itself:
        ``request_fault``), and the metrics count it."""
        half = self.decision.result.prefill
        if half is None:
            return
        now = self._clock.now()
        scheduler = self._scheduler
        if ok:
            self._tell("on_first_token", scheduler.on_first_token, half.request, half.endpoint, now)
        elif not request_fault:
            self._tell("on_endpoint_failed", scheduler.on_endpoint_failed, half.request, half.endpoint, now)
        self._tell("on_finished", _finished, scheduler, half.request, half.endpoint, ok, now)
        self._metrics.prefill_finished(self.labels, seconds, ok=ok)

    def usage(self, usage: Usage, limiter: TenantLimiter | None) -> None:
        """The token usage the response reported: counted in the metrics, charged to the tenant the
        request was counted against (``limiter``'s), and learned by the scheduler."""
        self._metrics.tokens(self.labels, usage.prompt_tokens, usage.completion_tokens)
        self._output_tokens = usage.completion_tokens
        result = self.decision.result
        if (usage.cached_tokens is not None and result.predicted_cached_tokens is not None
                and self.served is result.pick):
            self._metrics.prefix_checked(self.labels, result.predicted_cached_tokens,
                                         result.best_cached_tokens or 0, usage.cached_tokens,
                                         result.prefix_block_tokens)
        tenant = self.decision.tenant
        if tenant is not None and limiter is not None:
            tokens = usage.prompt_tokens + usage.completion_tokens
            self._tell("charge_tokens", limiter.charge_tokens, tenant, tokens)
        self._tell("on_usage", self._scheduler.on_usage, self.request, self.served, usage, self._clock.now())

    def finish(self, *, ok: bool, count_outcome: bool = True) -> None:
        """The request ended (once: later calls do nothing). ``count_outcome`` False: the scheduler
        is not told it went well (its outcome is reported later); the metrics still count ``ok``."""
        if self._finished:
            return
        self._finished = True
        now = self._clock.now()
        self._tell("on_finished", _finished, self._scheduler, self.request, self.served,
                   ok and count_outcome, now)
        self._metrics.request_finished(self.labels, now - self._started, ok=ok)
        if ok:
            self._check_objectives(now)

    def _check_objectives(self, now: float) -> None:
        """The request's own latency objectives, met or missed, where the response showed its
        latencies: the first token (any response read), the time per output token after it (a
        stream whose usage named more than one)."""
        objectives = latency_objectives(self.request.headers)
        first = self._first_token_at
        if not objectives or first is None:
            return
        if objectives.ttft_s is not None:
            self._metrics.slo_checked(self.labels, "ttft", first - self._started <= objectives.ttft_s)
        tokens = self._output_tokens
        if objectives.tpot_s is not None and self.request.stream and tokens is not None and tokens > 1:
            self._metrics.slo_checked(self.labels, "tpot", (now - first) / (tokens - 1) <= objectives.tpot_s)

    def _tell(self, what: str, call: Callable[..., None], *args: Any) -> None:
        if self._after_reply is not None:
            self._after_reply.defer(what, call, *args)
        else:
            call_logged(what, call, *args)


def _finished(
    scheduler: Scheduler, request: InferenceRequest, endpoint: Endpoint, ok: bool, now: float
) -> None:
    scheduler.on_finished(request, endpoint, ok=ok, now=now)
