"""A request held for room through the lifecycle, sans IO (flow control, issue 34): the AwaitHold step
(with Envoy's message timer extended), then the HoldEnded the servicer hands back: picked and
released when dispatched; 503 or 429 with Retry-After when its wait ends otherwise; out of the queue
when its client goes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvgate.extproc import codec
from kvgate.extproc.actions import AwaitHold, ExtendTimeout, Step
from kvgate.extproc.events import HoldEnded, StreamClosed
from kvgate.extproc.lifecycle import RequestLifecycle, State
from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.policies.flow_control import HoldOutcome
from kvgate.policies.holding_queue import Waiting
from kvgate.policies.types import EndpointView, InferenceRequest
from tests.extproc.fakes import (
    BUFFERED,
    FULL_DUPLEX,
    NONE,
    RecordingMetrics,
    completion,
    make_machine,
    make_pool,
    request_body,
    request_headers,
    set_headers,
    streamed,
)


@dataclass
class FakeHolding:
    """A holding area that holds while ``full``; records what the lifecycle tells it."""

    full: bool = True
    accept: bool = True
    timeout_s: float = 20.0
    retry_after_s: float = 3.0
    calls: list[tuple[str, str]] = field(default_factory=list)
    held: list[Waiting] = field(default_factory=list)
    room: tuple[str, ...] | None = None
    """Addresses with room (None: every one)."""

    def must_wait(self) -> bool:
        return self.full

    reserve: bool = False
    """Whether a tenant with nothing waiting may take a reserved slot now."""

    def with_room(self, endpoints: Sequence[EndpointView], *,
                  reserved: bool = False) -> Sequence[EndpointView]:
        if reserved:
            self.calls.append(("reserved pick", ""))
        return endpoints if self.room is None else tuple(v for v in endpoints if v.address in self.room)

    def may_take_reserved(self, tenant: str, band: int) -> bool:
        return self.reserve

    def passed(self, request: InferenceRequest) -> None:
        self.calls.append(("passed", request.fairness_id or ""))

    def waiting_item(self, request: InferenceRequest, now: float) -> Waiting:
        return Waiting(request.request_id, request.priority, request.fairness_id or "", 1.0,
                       now + self.timeout_s)

    def hold(self, item: Waiting) -> bool:
        self.held.append(item)
        return self.accept

    async def outcome(self, request_id: str) -> HoldOutcome:
        raise AssertionError("sans IO: the test hands the outcome to the lifecycle")

    def grant_used(self, request_id: str) -> None:
        self.calls.append(("grant_used", request_id))

    def leave(self, request_id: str) -> None:
        self.calls.append(("leave", request_id))

    def kick(self, *freed: str) -> None:
        self.calls.append(("kick", ""))


def held_request(holding: FakeHolding, *, mode: int = BUFFERED, objective: str | None = None,
                 metrics: RecordingMetrics | None = None) -> tuple[RequestLifecycle, Any, Sequence[Step]]:
    pool = make_pool("10.0.0.1:8000", holding=holding, objectives={"batch": -1})
    machine = make_machine(pool, metrics=metrics, config=LifecycleConfig(message_timeout_s=30.0))
    extra = [("x-gateway-inference-fairness-id", "tenant-a")]
    if objective:
        extra.append(("x-gateway-inference-objective", objective))
    headers = request_headers(mode=mode, response_mode=NONE, extra=extra)
    codec.encode_replies(machine.handle(codec.decode(headers)))
    steps = machine.handle(codec.decode(request_body(completion(prompt="held"), eos=True)))
    return machine, pool, steps


def test_a_request_without_room_is_held_with_envoys_timer_extended_then_picked_when_dispatched() -> None:
    holding = FakeHolding()
    machine, pool, steps = held_request(holding)
    extend, hold = steps
    assert extend == ExtendTimeout(20.0 + 30.0)  # its queue timeout plus the usual message timeout
    assert isinstance(hold, AwaitHold)
    assert hold.area is holding
    assert machine.state is State.HOLDING
    [item] = holding.held
    assert (item.request_id, item.tenant, item.band) == (hold.request_id, "tenant-a", 0)
    assert pool.scheduler.seen == []  # not picked while it waits
    [reply] = codec.encode_replies(machine.handle(HoldEnded(HoldOutcome.DISPATCHED)))
    assert set_headers(reply)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert pool.scheduler.calls == [("picked", "10.0.0.1:8000")]
    assert holding.calls == [("grant_used", hold.request_id)]  # told after the pick
    assert machine.state.value == "upstream"  # (mypy narrowed the state above)
    machine.handle(StreamClosed())
    assert holding.calls[-1] == ("kick", "")  # its end may free room for the next one


def test_the_timer_override_goes_only_where_envoy_waits_for_one_message() -> None:
    """Full duplex: the body's chunks already went to the picker; there is no message timer to extend."""
    _, _, steps = held_request(FakeHolding(), mode=FULL_DUPLEX)
    assert [type(s) for s in steps] == [AwaitHold]


def test_full_duplex_streams_the_body_once_dispatched() -> None:
    machine, _, _ = held_request(FakeHolding(), mode=FULL_DUPLEX)
    replies = codec.encode_replies(machine.handle(HoldEnded(HoldOutcome.DISPATCHED)))
    assert json.loads(streamed(replies))["prompt"] == "held"


def test_a_request_with_room_is_picked_at_once() -> None:
    holding = FakeHolding(full=False)
    machine, _pool, steps = held_request(holding)
    assert set_headers(codec.encode_replies(steps)[0])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert holding.held == []
    assert holding.calls[0] == ("passed", "tenant-a")  # its work counts for fairness
    assert machine.state is State.UPSTREAM


def answer(machine: RequestLifecycle, outcome: HoldOutcome) -> pb.ProcessingResponse:
    [reply] = codec.encode_replies(machine.handle(HoldEnded(outcome)))
    return reply


def error_of(reply: pb.ProcessingResponse) -> tuple[int, dict[str, str], dict[str, Any]]:
    immediate = reply.immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
    return immediate.status.code, headers, json.loads(immediate.body)["error"]


def test_a_timed_out_request_gets_503_with_retry_after() -> None:
    holding = FakeHolding()
    metrics = RecordingMetrics()
    machine, pool, steps = held_request(holding, metrics=metrics)
    [reply] = codec.encode_replies(machine.handle(HoldEnded(HoldOutcome.EVICTED_TTL)))
    status, headers, error = error_of(reply)
    assert (status, headers["retry-after"], error["code"]) == (503, "3", "queue_timeout")
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"  # (llm-d's clients read it)
    assert "20 s" in error["message"]
    assert pool.scheduler.seen == []
    assert machine.state is State.DONE
    assert ("leave", steps[-1].request_id) in holding.calls  # type: ignore[union-attr]
    assert ("error", "queue_timeout") in metrics.events


def test_a_sheddable_request_that_times_out_or_any_request_shed_gets_429() -> None:
    machine, _, _ = held_request(FakeHolding(), objective="batch")
    status, headers, error = error_of(answer(machine, HoldOutcome.EVICTED_TTL))
    assert (status, headers["retry-after"], error["code"]) == (429, "3", "request_shed")
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    machine, _, _ = held_request(FakeHolding())
    status, _, error = error_of(answer(machine, HoldOutcome.REJECTED_CAPACITY))
    assert (status, error["code"]) == (429, "request_shed")


def test_a_full_queue_sheds_the_arrival_at_once() -> None:
    holding = FakeHolding(accept=False)
    machine, _, steps = held_request(holding)
    status, headers, error = error_of(codec.encode_replies(steps)[0])
    assert (status, headers["retry-after"], error["code"]) == (429, "3", "request_shed")
    assert machine.state is State.DONE


def test_a_client_gone_while_held_leaves_the_queue_and_nothing_is_picked() -> None:
    holding = FakeHolding()
    machine, pool, steps = held_request(holding)
    assert machine.handle(StreamClosed(cancelled=True)) == []
    assert holding.calls == [("leave", steps[-1].request_id)]  # type: ignore[union-attr]
    assert pool.scheduler.calls == []
    assert machine.state is State.DONE


def test_a_pick_that_fails_after_dispatch_still_reports_the_grant() -> None:
    """The scheduler refuses the dispatched request (every endpoint went away meanwhile): the client
    gets its error and the queue goes on (the grant is reported used)."""
    holding = FakeHolding()
    machine, pool, steps = held_request(holding)
    pool.addresses = ()
    status, _, error = error_of(codec.encode_replies(machine.handle(HoldEnded(HoldOutcome.DISPATCHED)))[0])
    assert (status, error["code"]) == (503, "no_eligible_endpoint")
    assert holding.calls == [("grant_used", steps[-1].request_id)]  # type: ignore[union-attr]


def test_the_pick_is_made_among_the_endpoints_with_room() -> None:
    """The scheduler's favourite may be full (its prefix, its adapter): a request released into the
    pool goes where there is room; when none has (a grant raced), among all."""
    holding = FakeHolding(full=False, room=("10.0.0.2:8000",))
    pool = make_pool("10.0.0.1:8000", "10.0.0.2:8000", holding=holding)
    machine = make_machine(pool)
    machine.handle(codec.decode(request_headers(mode=BUFFERED, response_mode=NONE)))
    [reply] = codec.encode_replies(machine.handle(codec.decode(request_body(completion(), eos=True))))
    assert set_headers(reply)["x-gateway-destination-endpoint"] == "10.0.0.2:8000"
    assert pool.scheduler.seen[-1][1] == ("10.0.0.2:8000",)
    holding.room = ()
    machine = make_machine(pool)
    machine.handle(codec.decode(request_headers(mode=BUFFERED, response_mode=NONE)))
    machine.handle(codec.decode(request_body(completion(), eos=True)))
    assert len(pool.scheduler.seen[-1][1]) == 2


def test_a_full_pool_spills_to_the_first_pool_down_its_chain_with_room() -> None:
    spot = make_pool("10.0.1.1:8000", name="spot", room=False)
    reserve = make_pool("10.0.2.1:8000", name="reserve")
    spot.fallback = reserve
    pool = make_pool("10.0.0.1:8000", room=False, fallback=spot)
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    machine.handle(codec.decode(request_headers(mode=BUFFERED, response_mode=NONE)))
    [reply] = codec.encode_replies(machine.handle(codec.decode(request_body(completion(), eos=True))))
    assert set_headers(reply)["x-gateway-destination-endpoint"] == "10.0.2.1:8000"
    assert ("spilled", ("llama", "reserve")) in metrics.events
    assert reserve.scheduler.calls == [("picked", "10.0.2.1:8000")]  # its own scheduler's bookkeeping
    assert pool.scheduler.calls == []
    machine.handle(StreamClosed())
    assert reserve.scheduler.count("finished") == 1
    pool.room = True  # recovered: back to it
    machine = make_machine(pool, metrics=metrics)
    machine.handle(codec.decode(request_headers(mode=BUFFERED, response_mode=NONE)))
    [reply] = codec.encode_replies(machine.handle(codec.decode(request_body(completion(), eos=True))))
    assert set_headers(reply)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"


def test_a_full_pool_whose_chain_is_full_too_keeps_its_requests() -> None:
    spot = make_pool("10.0.1.1:8000", name="spot", room=False)
    pool = make_pool("10.0.0.1:8000", room=False, fallback=spot)
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    machine.handle(codec.decode(request_headers(mode=BUFFERED, response_mode=NONE)))
    [reply] = codec.encode_replies(machine.handle(codec.decode(request_body(completion(), eos=True))))
    assert set_headers(reply)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert not any(kind == "spilled" for kind, _ in metrics.events)


def test_a_request_that_may_take_a_reserved_slot_goes_at_once() -> None:
    holding = FakeHolding(reserve=True)
    _, _, steps = held_request(holding)
    [reply] = codec.encode_replies(steps)
    assert set_headers(reply)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert holding.held == []
    assert holding.calls == [("passed", "tenant-a"), ("reserved pick", "")]


def test_a_request_continuing_a_stored_response_is_neither_moved_for_room_nor_spilled() -> None:
    """Only the endpoint that stored a response answers a request continuing it (vLLM: 404 anywhere
    else): the scheduler sees the whole pool, not those with room, and the pool keeps it."""
    body = json.dumps({"model": "m", "input": "and then?", "previous_response_id": "resp_1"}).encode()
    holding = FakeHolding(full=False, room=("10.0.0.2:8000",))
    pool = make_pool("10.0.0.1:8000", "10.0.0.2:8000", holding=holding)
    machine = make_machine(pool)
    machine.handle(codec.decode(request_headers("/v1/responses", mode=BUFFERED, response_mode=NONE)))
    machine.handle(codec.decode(request_body(body, eos=True)))
    assert pool.scheduler.seen[-1][1] == ("10.0.0.1:8000", "10.0.0.2:8000")
    reserve = make_pool("10.0.2.1:8000", name="reserve")
    full = make_pool("10.0.0.1:8000", room=False, fallback=reserve)
    machine = make_machine(full)
    machine.handle(codec.decode(request_headers("/v1/responses", mode=BUFFERED, response_mode=NONE)))
    [reply] = codec.encode_replies(machine.handle(codec.decode(request_body(body, eos=True))))
    assert set_headers(reply)["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert reserve.scheduler.seen == []
