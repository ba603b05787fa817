"""The one-pass data path: request body BUFFERED, response body NONE unless the request turns it on.

Message sequences as Envoy 1.40 sends them for the configuration kvgate writes (measured: the
ext_proc stream stays open until the HTTP request ends, then Envoy half-closes it; ``mode_override``
counts only in the reply to the response headers).
"""

from __future__ import annotations

import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvgate.extproc.events import StreamClosed
from kvgate.extproc.lifecycle import RequestLifecycle, State
from kvgate.extproc.lifecycle_config import EveryNth, LifecycleConfig
from kvgate.gateway.picker.ratelimit.limiter import TenantLimits, TenantRateLimiter
from kvgate.gateway.picker.ratelimit.stores import InProcessCounters
from tests.extproc.fakes import (
    BUFFERED,
    NONE,
    STREAMED,
    RecordingMetrics,
    completion,
    feed,
    kinds,
    make_machine,
    make_pool,
    removed_headers,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
)

SSE = "text/event-stream"


def _start(
    machine: RequestLifecycle, body: bytes, path: str = "/v1/completions"
) -> list[pb.ProcessingResponse]:
    out = feed(machine, [request_headers(path, mode=BUFFERED, response_mode=NONE)])
    return out + feed(machine, [request_body(body, eos=True)])


def _override(response: pb.ProcessingResponse) -> int | None:
    return response.mode_override.response_body_mode if response.HasField("mode_override") else None


def test_a_streamed_response_never_reaches_the_picker_and_ends_with_the_stream() -> None:
    pool = make_pool()
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    out = _start(machine, completion(stream=True))
    assert kinds(out) == ["request_headers", "request_body"]
    assert set_headers(out[1])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert not out[1].request_body.response.HasField("body_mutation")  # no include_usage injected
    reply = feed(machine, [response_headers(200, SSE)])
    assert kinds(reply) == ["response_headers"]
    assert _override(reply[0]) is None  # the body stays off
    assert machine.state is State.RESPONSE_PASSTHROUGH
    assert pool.scheduler.unseen_first_tokens == ["10.0.0.1:8000"]
    assert pool.scheduler.count("finished") == 0  # still streaming
    machine.handle(StreamClosed(cancelled=False))
    assert pool.scheduler.calls[-1] == ("finished", ("10.0.0.1:8000", True))
    assert ("finished", True) in metrics.events


def test_a_non_streamed_response_counts_its_headers_as_the_first_token() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    _start(machine, completion())
    feed(machine, [response_headers(200, "application/json")])
    assert pool.scheduler.first_tokens == ["10.0.0.1:8000"]
    assert pool.scheduler.unseen_first_tokens == []


def test_a_reset_or_an_error_status_finishes_as_failed() -> None:
    for status, cancelled in ((200, True), (503, False)):
        pool = make_pool()
        machine = make_machine(pool)
        _start(machine, completion(stream=True))
        feed(machine, [response_headers(status, SSE)])
        machine.handle(StreamClosed(cancelled=cancelled))
        assert pool.scheduler.calls[-1] == ("finished", ("10.0.0.1:8000", False))
        assert pool.scheduler.count("finished") == 1


def test_a_model_rewrite_turns_the_response_body_on_to_rename_the_model_back() -> None:
    pool = make_pool(rewrites={"m": "m-v2"})
    machine = make_machine(pool)
    _start(machine, completion(stream=True))
    reply = feed(machine, [response_headers(200, SSE)])
    assert _override(reply[0]) == STREAMED
    assert machine.state is State.RESPONSE_BODY
    chunk = b'data: {"model":"m-v2","choices":[{"text":"a"}]}\n\n'
    out = feed(machine, [response_body(chunk)])
    assert kinds(out) == ["response_body"]
    assert out[0].response_body.response.body_mutation.body == chunk.replace(b"m-v2", b"m")
    assert pool.scheduler.first_tokens == ["10.0.0.1:8000"]  # seen exactly
    feed(machine, [response_body(b"data: [DONE]\n\n", eos=True)])
    assert pool.scheduler.calls[-1] == ("finished", ("10.0.0.1:8000", True))


def test_a_pool_with_a_token_limit_reads_usage_and_charges_it() -> None:
    limiter = TenantRateLimiter(InProcessCounters())
    limiter.configure("llama", TenantLimits(tokens=1_000_000))
    pool = make_pool()
    machine = make_machine(pool, config=LifecycleConfig(tenant_limiter=limiter))
    tenant = [("x-gateway-inference-fairness-id", "t")]
    out = feed(machine, [request_headers(mode=BUFFERED, response_mode=NONE, extra=tenant)])
    out += feed(machine, [request_body(completion(stream=True), eos=True)])
    sent = json.loads(out[1].request_body.response.body_mutation.body)
    assert sent["stream_options"] == {"include_usage": True}  # injected: the usage is needed
    reply = feed(machine, [response_headers(200, SSE)])
    assert _override(reply[0]) == STREAMED
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    tail = b'data: {"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\ndata: [DONE]\n\n"
    first = response_body(b'data: {"choices":[{"text":"a"}]}\n\n')
    out = feed(machine, [first, response_body(tail, eos=True)])
    assert b"usage" not in b"".join(r.response_body.response.body_mutation.body for r in out)
    assert pool.scheduler.count("usage") == 1


def test_a_sampler_reads_one_response_in_n() -> None:
    sampler = EveryNth(3)
    overrides = []
    for _ in range(6):
        machine = make_machine(make_pool(), config=LifecycleConfig(observe_usage=sampler))
        _start(machine, completion())
        overrides.append(_override(feed(machine, [response_headers(200, "application/json")])[0]))
    assert overrides == [STREAMED, None, None, STREAMED, None, None]


def test_every_nth_rejects_zero() -> None:
    with pytest.raises(ValueError, match="n must be"):
        EveryNth(0)


def test_a_fallback_that_served_reports_the_pick_as_failed_and_counts_it() -> None:
    pool = make_pool()
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    _start(machine, completion())
    feed(machine, [response_headers(200, "application/json", served="10.0.0.2:8000")])
    assert pool.scheduler.failed_endpoints == ["10.0.0.1:8000"]
    assert ("fallback", "llama") in metrics.events
    machine.handle(StreamClosed(cancelled=False))
    assert pool.scheduler.calls[-1] == ("finished", ("10.0.0.2:8000", True))


def test_a_5xx_from_the_replica_reports_it_as_failed() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    _start(machine, completion())
    feed(machine, [response_headers(500, "application/json")])
    assert pool.scheduler.failed_endpoints == ["10.0.0.1:8000"]
    machine.handle(StreamClosed(cancelled=False))
    assert pool.scheduler.calls[-1] == ("finished", ("10.0.0.1:8000", False))


def test_a_streamed_request_is_marked_for_the_stream_route_and_a_client_cannot_forge_it() -> None:
    streamed = _start(make_machine(make_pool()), completion(stream=True))
    assert set_headers(streamed[1])["x-kvgate-stream"] == "1"
    plain = _start(make_machine(make_pool()), completion())
    assert "x-kvgate-stream" not in set_headers(plain[1])
    machine = make_machine(make_pool())
    client = [("x-kvgate-stream", "1")]
    forged = feed(machine, [request_headers(mode=BUFFERED, response_mode=NONE, extra=client)])
    forged += feed(machine, [request_body(completion(), eos=True)])
    assert "x-kvgate-stream" not in set_headers(forged[1])
    assert "x-kvgate-stream" in removed_headers(forged[1])  # a client's copy goes with the pick


def test_in_full_duplex_a_forged_stream_mark_goes_unless_the_pick_sets_it() -> None:
    """GIE's mode (a gateway that is not kvgate's: nothing stripped the client's headers before the
    picker): the one reply to the headers is the destination's; it removes a forged mark the pick
    does not set and overwrites one it does."""
    client = [("x-kvgate-stream", "1")]
    for stream, kept in ((False, False), (True, True)):
        machine = make_machine(make_pool())
        body = request_body(completion(stream=stream), eos=True)
        out = feed(machine, [request_headers(extra=client), body])
        assert ("x-kvgate-stream" in set_headers(out[0])) is kept
        assert ("x-kvgate-stream" in removed_headers(out[0])) is not kept


LEAN = LifecycleConfig(skip_unread_responses=True)


def _skips(response: pb.ProcessingResponse) -> bool:
    mode = response.mode_override
    skip, buffered = 2, 2  # HeaderSendMode.SKIP, BodySendMode.BUFFERED
    return response.HasField("mode_override") and (mode.response_header_mode, mode.request_body_mode) == (
        skip, buffered,
    )


def test_a_request_nothing_reads_the_response_of_skips_the_response_headers_round_trip() -> None:
    for stream in (False, True):
        pool = make_pool()
        machine = make_machine(pool, config=LEAN)
        out = _start(machine, completion(stream=stream))
        assert _skips(out[0])  # the whole mode, in the reply to the request headers
        assert set_headers(out[1])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
        # a streamed request's prefill ends at the scheduler's estimate: no first chunk will come
        assert pool.scheduler.unseen_first_tokens == (["10.0.0.1:8000"] if stream else [])
        machine.handle(StreamClosed(cancelled=False))  # Envoy closes the stream at the request's end
        assert pool.scheduler.calls[-1] == ("finished", ("10.0.0.1:8000", True))
        assert pool.scheduler.count("finished") == 1


def test_requests_that_need_their_response_keep_the_round_trip() -> None:
    rewriting = make_machine(make_pool(rewrites={"m": "m-v2"}), config=LEAN)
    assert not _skips(_start(rewriting, completion())[0])
    limiter = TenantRateLimiter(InProcessCounters())
    limiter.configure("llama", TenantLimits(tokens=1_000_000))
    config = LifecycleConfig(skip_unread_responses=True, tenant_limiter=limiter)
    limited = make_machine(make_pool(), config=config)
    assert not _skips(_start(limited, completion())[0])
    sampler = EveryNth(2)
    skipped = []
    for _ in range(4):
        machine = make_machine(make_pool(), config=LifecycleConfig(skip_unread_responses=True,
                                                                   observe_usage=sampler))
        skipped.append(_skips(_start(machine, completion())[0]))
    assert skipped == [False, True, False, True]  # the sampler is asked once per request
    full_duplex = make_machine(make_pool(), config=LEAN)
    out = feed(full_duplex, [request_headers(), request_body(completion(), eos=True)])
    assert not any(r.HasField("mode_override") for r in out)  # GIE's mode: never
