"""A request held for room in its pool, and one sent down its pool's spill chain (flow control,
issue 34), sans IO: the lifecycle (``extproc.lifecycle``) asks these what to return.

- :func:`hold_steps`: queue the request in its pool's holding area (``extproc.holding``) and the
  steps that make the servicer await its outcome (Envoy's message timer extended first, where
  Envoy waits for one message);
- :func:`hold_refusal`: the error a request gets when its wait ended other than dispatched;
- :func:`spill_target`: the pool a request is scheduled in: its own, or while that is full the first
  pool down its spill chain with room.
"""

from __future__ import annotations

from kvgate.extproc.actions import AwaitHold, ExtendTimeout, Step
from kvgate.extproc.ports import HoldingPort, Pool, RequestMetrics
from kvgate.policies.errors import KvgateError, QueueTimeoutError, RequestShedError
from kvgate.policies.flow_control import HoldOutcome, queue_budget_s
from kvgate.policies.types import InferenceRequest

MAX_MESSAGE_TIMEOUT_S = 3600.0
"""Envoy's ceiling on an ext_proc message timeout (``max_message_timeout``)."""


def hold_steps(area: HoldingPort, request: InferenceRequest, now: float, *, message_timeout_s: float,
               extend_timer: bool) -> list[Step]:
    """Queue ``request`` in ``area``; the steps that await its outcome. Raises ``RequestShedError``
    (429) when the queue is full of requests that rank above it."""
    if not area.hold(area.waiting_item(request, now)):
        raise RequestShedError(f"pool {request.pool!r} is full and its queue too; request shed",
                               retry_after=area.retry_after_s)
    steps: list[Step] = []
    if extend_timer:  # Envoy's timer for this message must outlast the wait
        steps.append(ExtendTimeout(min(area.timeout_s + message_timeout_s, MAX_MESSAGE_TIMEOUT_S)))
    steps.append(AwaitHold(request.request_id, area))
    return steps


def hold_refusal(outcome: HoldOutcome, request: InferenceRequest, area: HoldingPort) -> KvgateError:
    """What a request whose wait ended ``outcome`` (not dispatched) is answered: 429 when it was
    shed or is sheddable, else 503 ``queue_timeout``; both with ``Retry-After``."""
    if request.sheddable or outcome is HoldOutcome.REJECTED_CAPACITY:
        why = "bound" if outcome is HoldOutcome.REJECTED_CAPACITY else "timeout"
        return RequestShedError(f"pool {request.pool!r} had no room for this request within its queue "
                                f"{why}; request shed", retry_after=area.retry_after_s)
    waited = queue_budget_s(request.headers, area.timeout_s)
    return QueueTimeoutError(f"pool {request.pool!r} had no room for this request within "
                             f"{waited:g} s", retry_after=area.retry_after_s)


def spill_target(pool: Pool, metrics: RequestMetrics) -> Pool:
    """``pool``, or while it has no room the first pool down its spill chain that has (counted as
    a spill); ``pool`` when none has."""
    tier = pool.fallback
    if tier is None or pool.has_room():
        return pool
    while tier is not None:
        if tier.has_room():
            metrics.spilled(pool.name, tier.name)
            return tier
        tier = tier.fallback
    return pool
