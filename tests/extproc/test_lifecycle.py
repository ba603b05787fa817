"""Feed ext_proc message sequences (protobuf) into the lifecycle and check what comes out."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvgate.extproc.after_reply import AfterReply
from kvgate.extproc.events import StreamClosed
from kvgate.extproc.lifecycle import TRANSITIONS, RequestLifecycle, State
from kvgate.extproc.lifecycle_config import LifecycleConfig, RequestIds
from kvgate.extproc.ports import RequestLabels
from kvgate.policies.contracts import Keep, SchedulingResult
from kvgate.policies.errors import RequestShedError
from kvgate.policies.framework import SchedulingTrace
from kvgate.policies.types import EndpointView, InferenceRequest, Usage
from tests.extproc.fakes import (
    BUFFERED,
    FakeDirectory,
    FakePool,
    RecordingMetrics,
    RecordingScheduler,
    StepClock,
    body_chunks,
    completion,
    feed,
    kinds,
    make_machine,
    make_pool,
    removed_headers,
    request_body,
    request_headers,
    request_trailers,
    response_body,
    response_headers,
    set_headers,
    streamed,
)

ALL_THREE = "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"


def _metadata_value(response: pb.ProcessingResponse) -> str:
    meta = response.dynamic_metadata
    return str(meta.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value)


def test_full_duplex_holds_headers_until_end_of_body_then_resends_body() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    body = completion(prompt="x" * 150_000)
    early = feed(machine, [request_headers(), *body_chunks(body, 7_000)[:-1]])
    assert early == []
    out = feed(machine, [request_body(b"", eos=True)])
    assert kinds(out)[0] == "request_headers"
    assert set(kinds(out)[1:]) == {"request_body"}
    headers = set_headers(out[0])
    assert headers["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert headers["x-gateway-model-name"] == "m"
    assert headers["content-length"] == str(len(body))
    assert out[0].request_headers.response.clear_route_cache
    assert _metadata_value(out[0]) == ALL_THREE  # the pick, then its fallbacks
    chunks = [r.request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert all(len(c.body) <= 62_000 for c in chunks)
    assert [c.end_of_stream for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert streamed(out) == body
    assert machine.state is State.UPSTREAM
    assert pool.scheduler.seen[0][0].prompt == "x" * 150_000


def test_buffered_answers_headers_at_once_and_routes_on_the_body_response() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    forged = [("x-gateway-destination-endpoint", "6.6.6.6:1"), ("x-kvgate-forged", "1")]
    first = feed(machine, [request_headers(mode=BUFFERED, extra=forged)])
    assert kinds(first) == ["request_headers"]
    # the reply to the headers depends on none of them: it goes before they are read, changing nothing
    assert not first[0].request_headers.response.HasField("header_mutation")
    out = feed(machine, [request_body(completion(), eos=True)])
    assert kinds(out) == ["request_body"]
    common = out[0].request_body.response
    assert common.clear_route_cache
    assert not common.HasField("body_mutation")  # body untouched
    # the body's reply removes the forged headers and overwrites the destination
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert removed_headers(out[0]) == ["x-kvgate-forged"]
    assert _metadata_value(out[0]) == ALL_THREE


def test_buffered_streaming_request_gets_rewritten_body_and_content_length() -> None:
    machine = make_machine(make_pool())
    feed(machine, [request_headers(path="/v1/chat/completions", mode=BUFFERED)])
    body = json.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    out = feed(machine, [request_body(body, eos=True)])
    sent = out[0].request_body.response.body_mutation.body
    assert json.loads(sent)["stream_options"] == {"include_usage": True}
    assert set_headers(out[0])["content-length"] == str(len(sent))


def test_include_usage_injected_in_full_duplex_with_content_length() -> None:
    machine = make_machine(make_pool())
    body = completion(stream=True, stream_options={"continuous_usage_stats": False})
    out = feed(machine, [request_headers(), request_body(body), request_body(b"", eos=True)])
    sent = streamed(out)
    document = json.loads(sent)
    assert document["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert set_headers(out[0])["content-length"] == str(len(sent))


def test_bodyless_request_goes_to_an_eligible_endpoint_at_once() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    out = feed(machine, [request_headers("/v1/models", method="GET", eos=True)])
    assert kinds(out) == ["request_headers"]
    assert set_headers(out[0]) == {"x-gateway-destination-endpoint": "10.0.0.1:8000"}
    assert pool.scheduler.seen[0][0].model == ""


def test_client_system_headers_are_stripped_and_overwritten() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    forged = [
        ("x-gateway-destination-endpoint", "6.6.6.6:1"),
        ("x-gateway-destination-endpoint-served", "6.6.6.6:1"),
        ("x-gateway-destination-endpoint-subset", "6.6.6.6:1"),
        ("x-kvgate-pool", "other"),
        ("x-user", "kept"),
    ]
    out = feed(machine, [request_headers(extra=forged), request_body(completion(), eos=True)])
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert sorted(removed_headers(out[0])) == [
        "x-gateway-destination-endpoint-served",
        "x-gateway-destination-endpoint-subset",
        "x-kvgate-pool",
    ]
    seen = pool.scheduler.seen[0][0].headers
    assert "x-gateway-destination-endpoint" not in seen
    assert "x-kvgate-pool" not in seen
    assert seen["x-user"] == "kept"


@pytest.mark.parametrize("subset", [["10.0.0.2:8000", "10.0.0.3"], "10.0.0.3:8000, 10.0.0.2"])
def test_subset_hint_limits_candidates_and_reaches_the_scheduler(subset: list[str] | str) -> None:
    pool = make_pool()
    machine = make_machine(pool)
    out = feed(machine, [request_headers(subset=subset), request_body(completion(), eos=True)])
    request, candidates = pool.scheduler.seen[0]
    assert candidates == ("10.0.0.2:8000", "10.0.0.3:8000")
    expected = subset if isinstance(subset, list) else [part.strip() for part in subset.split(",")]
    assert request.subset == frozenset(expected)
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == "10.0.0.2:8000"


class SubsetBlindScheduler(RecordingScheduler):
    """A scheduler that breaks the contract: it ranks the pool's endpoints whatever the hint."""

    def schedule(self, request: InferenceRequest, candidates: Sequence[EndpointView], now: float,
                 trace: SchedulingTrace | None = None, keep: Keep | None = None) -> SchedulingResult:
        return super().schedule(dataclasses.replace(request, subset=None), candidates, now, trace, keep)


def test_a_pick_outside_the_subset_hint_is_refused_not_routed() -> None:
    pool = make_pool(scheduler=SubsetBlindScheduler())
    out = feed(make_machine(pool), [request_headers(subset=["10.0.0.3:8000"]),
                                    request_body(completion(), eos=True)])
    assert out[0].immediate_response.status.code == 503
    assert "outside the subset hint" in out[0].immediate_response.body.decode()
    assert pool.scheduler.count("picked") == 0


def test_subset_hint_outside_the_pool_is_503() -> None:
    pool = make_pool()
    out = feed(
        make_machine(pool), [request_headers(subset=["9.9.9.9:1"]), request_body(completion(), eos=True)]
    )
    assert out[0].immediate_response.status.code == 503
    assert pool.scheduler.seen == []


def test_the_fallback_list_has_its_configured_length_in_the_metadata_and_the_header_names_the_pick() -> None:
    machine = make_machine(make_pool(), config=LifecycleConfig(fallback_count=2))
    out = feed(machine, [request_headers(), request_body(completion(), eos=True)])
    # one address in the header: an ORIGINAL_DST cluster (GIE's reference configuration) reads it
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    assert _metadata_value(out[0]) == "10.0.0.1:8000,10.0.0.2:8000"
    single = make_machine(make_pool(), config=LifecycleConfig(fallback_count=1))
    out = feed(single, [request_headers(), request_body(completion(), eos=True)])
    assert _metadata_value(out[0]) == "10.0.0.1:8000"


def _error_of(
    responses: list[pb.ProcessingResponse],
) -> tuple[int, dict[str, dict[str, str]], dict[str, str]]:
    assert len(responses) == 1
    immediate = responses[0].immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
    return int(immediate.status.code), json.loads(immediate.body), headers


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/completions", b"{not json", 400, "invalid_json"),
        ("/v1/completions", b"", 400, "invalid_json"),
        ("/v1/completions", b'{"prompt": "x"}', 400, "bad_request"),
        ("/v1/completions", b'{"model": "m", "prompt": ""}', 400, "bad_request"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', 400, "bad_request"),
        ("/v1/completions", b'{"model": "unknown", "prompt": "x"}', 404, "model_not_found"),
    ],
)
def test_request_errors_are_openai_json(path: str, body: bytes, status: int, code: str) -> None:
    pool = make_pool(served_models=frozenset({"m"}))
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    out = feed(machine, [request_headers(path), *body_chunks(body, 3)])
    got_status, document, headers = _error_of(out)
    assert got_status == status
    assert document["error"]["code"] == code
    assert headers["content-type"] == "application/json"
    assert ("error", code) in metrics.events
    assert machine.state is State.DONE
    assert feed(machine, [response_headers()]) == []  # late messages are ignored
    assert pool.scheduler.calls == []


def test_body_over_the_limit_is_413_while_chunks_arrive() -> None:
    machine = make_machine(make_pool(), config=LifecycleConfig(max_body_bytes=1000))
    assert feed(machine, [request_headers(), request_body(b"x" * 600)]) == []
    status, document, _ = _error_of(feed(machine, [request_body(b"x" * 600)]))
    assert status == 413
    assert document["error"]["code"] == "payload_too_large"


def test_declared_content_length_over_the_limit_is_413_at_headers() -> None:
    machine = make_machine(make_pool(), config=LifecycleConfig(max_body_bytes=1000))
    status, _, _ = _error_of(feed(machine, [request_headers(extra=[("content-length", "5000")])]))
    assert status == 413


def test_buffered_declared_length_over_the_limit_is_413_on_the_body() -> None:
    """The reply to BUFFERED headers goes before they are read: what reading them finds answers the
    body (Envoy holds the request until then)."""
    machine = make_machine(make_pool(), config=LifecycleConfig(max_body_bytes=1000))
    first = feed(machine, [request_headers(mode=BUFFERED, extra=[("content-length", "5000")])])
    assert kinds(first) == ["request_headers"]
    status, document, _ = _error_of(feed(machine, [request_body(b"{}", eos=True)]))
    assert (status, document["error"]["code"]) == (413, "payload_too_large")
    assert machine.state is State.DONE


def test_buffered_headers_of_an_unknown_pool_are_refused_at_once() -> None:
    directory = FakeDirectory({"p": make_pool()}, default="p")
    machine = RequestLifecycle(directory, StepClock(), pool_name="nowhere")
    status, document, _ = _error_of(feed(machine, [request_headers(mode=BUFFERED)]))
    assert (status, document["error"]["code"]) == (503, "pool_not_found")


def test_buffered_headers_are_read_after_the_reply_when_the_queue_is_flushed() -> None:
    pool = make_pool()
    queue = AfterReply()
    machine = RequestLifecycle(
        FakeDirectory({pool.name: pool}, default=pool.name), StepClock(), after_reply=queue,
        config=LifecycleConfig(max_body_bytes=1000),
    )
    feed(machine, [request_headers(mode=BUFFERED, extra=[("content-length", "5000")])])
    assert queue.pending == 1  # reading the headers waits for the reply to be written
    queue.flush()  # what it found (413) is kept for the body, never raised into the queue
    assert queue.pending == 0
    status, _, _ = _error_of(feed(machine, [request_body(b"{}", eos=True)]))
    assert status == 413


def test_buffered_stream_closed_before_its_headers_were_read_ends_quietly() -> None:
    pool = make_pool()
    queue = AfterReply()
    directory = FakeDirectory({pool.name: pool}, default=pool.name)
    machine = RequestLifecycle(directory, StepClock(), after_reply=queue)
    feed(machine, [request_headers(mode=BUFFERED)])
    assert machine.handle(StreamClosed(cancelled=True)) == []
    queue.flush()
    assert machine.state is State.DONE
    assert pool.scheduler.calls == []


def test_shed_request_is_429_with_retry_after() -> None:
    pool = make_pool()
    pool.scheduler.error = RequestShedError("pool saturated", retry_after=3)
    out = feed(make_machine(pool), [request_headers(), request_body(completion(), eos=True)])
    status, document, headers = _error_of(out)
    assert status == 429
    assert headers["retry-after"] == "3"
    assert document["error"]["type"] == "rate_limit_error"


def test_empty_pool_is_503_and_scheduler_bug_is_500() -> None:
    empty = make_pool("1.1.1.1:1")
    empty.addresses = ()
    status, document, _ = _error_of(
        feed(make_machine(empty), [request_headers(), request_body(completion(), eos=True)])
    )
    assert status == 503
    assert document["error"]["code"] == "no_eligible_endpoint"
    broken = make_pool()
    broken.scheduler.error = ZeroDivisionError("bug")
    status, document, _ = _error_of(
        feed(make_machine(broken), [request_headers(), request_body(completion(), eos=True)])
    )
    assert status == 500
    assert "bug" not in json.dumps(document)


def test_unknown_pool_is_503() -> None:
    machine = RequestLifecycle(FakeDirectory({}, default="none"), StepClock(), pool_name="missing")
    status, document, _ = _error_of(feed(machine, [request_headers()]))
    assert status == 503
    assert document["error"]["code"] == "pool_not_found"


def _routed(
    pool: FakePool | None = None, body: bytes | None = None
) -> tuple[FakePool, RequestLifecycle, RecordingMetrics]:
    pool = pool or make_pool()
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    feed(machine, [request_headers(), request_body(body or completion(), eos=True)])
    return pool, machine, metrics


def test_json_response_usage_reported_and_finished_once() -> None:
    pool, machine, metrics = _routed()
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}
    payload = json.dumps({"model": "m", "choices": [], "usage": usage}).encode()
    out = feed(
        machine,
        [
            response_headers(),
            response_body(payload[:10]),
            response_body(payload[10:]),
            response_body(b"", eos=True),
        ],
    )
    assert kinds(out) == ["response_headers", "response_body", "response_body", "response_body"]
    assert streamed(out, "response_body") == payload
    calls = pool.scheduler.calls
    assert [k for k, _ in calls] == ["picked", "usage", "finished"]
    reported = calls[1][1]
    assert isinstance(reported, Usage)
    assert reported.cached_tokens == 4
    assert calls[2][1] == ("10.0.0.1:8000", True)
    machine.handle(StreamClosed())
    assert pool.scheduler.count("finished") == 1
    assert ("tokens", (7, 3)) in metrics.events
    assert ("finished", True) in metrics.events
    assert sum(1 for k, _ in metrics.events if k == "ttft") == 1


def test_sse_passes_through_unbuffered_and_usage_chunk_dropped_when_injected() -> None:
    pool, machine, _ = _routed(body=completion(stream=True))
    events = [
        b'data: {"model":"m","choices":[{"text":"a"}],"usage":null}\n\n',
        b'data: {"model":"m","choices":[{"text":"b"}],"usage":null}\n\n',
        b'data: {"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
        b"data: [DONE]\n\n",
    ]
    out = feed(machine, [response_headers(content_type="text/event-stream")])
    assert removed_headers(out[0]) == ["content-length"]
    first = feed(machine, [response_body(events[0])])
    assert streamed(first, "response_body") == events[0]  # forwarded at once
    rest = b"".join(events[1:])
    tail = feed(machine, [response_body(rest[:30]), response_body(rest[30:]), response_body(b"", eos=True)])
    forwarded = events[0] + streamed(tail, "response_body")
    assert forwarded == events[0] + events[1] + events[3]
    usage = [u for k, u in pool.scheduler.calls if k == "usage"]
    assert isinstance(usage[0], Usage)
    assert usage[0].completion_tokens == 2


def test_sse_usage_kept_when_client_asked_for_it() -> None:
    body = completion(stream=True, stream_options={"include_usage": True})
    pool, machine, _ = _routed(body=body)
    usage_event = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
    feed(machine, [response_headers(content_type="text/event-stream")])
    out = feed(
        machine,
        [response_body(usage_event[:17]), response_body(usage_event[17:] + b"data: [DONE]\n\n", eos=True)],
    )
    assert streamed(out, "response_body") == usage_event + b"data: [DONE]\n\n"
    assert pool.scheduler.count("usage") == 1


def test_cancelled_stream_finishes_once_not_ok() -> None:
    pool, machine, metrics = _routed()
    feed(machine, [response_headers(), response_body(b'{"partial')])
    machine.handle(StreamClosed(cancelled=True))
    machine.handle(StreamClosed(cancelled=True))
    assert pool.scheduler.calls[-1] == ("finished", ("10.0.0.1:8000", False))
    assert pool.scheduler.count("finished") == 1
    assert metrics.events[-1] == ("finished", False)


def test_stream_closed_before_response_finishes_not_ok_and_unpicked_never_finishes() -> None:
    pool, machine, _ = _routed()
    machine.handle(StreamClosed())
    assert pool.scheduler.calls == [("picked", "10.0.0.1:8000"), ("finished", ("10.0.0.1:8000", False))]
    other = make_pool()
    early = make_machine(other)
    feed(early, [request_headers(), request_body(b"{")])
    early.handle(StreamClosed(cancelled=True))
    assert other.scheduler.calls == []


def test_upstream_error_status_finishes_not_ok_and_served_endpoint_reported() -> None:
    pool, machine, _ = _routed()
    feed(machine, [response_headers(503, served="10.0.0.2:8000"), response_body(b"{}", eos=True)])
    assert pool.scheduler.calls[1:] == [("served", "10.0.0.2:8000"), ("finished", ("10.0.0.2:8000", False))]


def test_request_trailers_in_full_duplex_end_the_body() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    body = completion()
    out = feed(machine, [request_headers(), request_body(body), request_trailers()])
    assert kinds(out) == ["request_headers", "request_body", "request_trailers"]
    assert out[1].request_body.response.body_mutation.streamed_response.end_of_stream is False
    assert streamed(out) == body


def test_response_model_renamed_back_to_the_client_name() -> None:
    pool = make_pool(rewrites={"alias": "real-model"})
    _, machine, _ = _routed(pool, body=completion(model="alias"))
    sent = pool.scheduler.seen[0][0]
    assert (sent.model, sent.target_model) == ("alias", "real-model")
    payload = b'{"id":"1","model":"real-model","choices":[]}'
    out = feed(
        machine, [response_headers(), response_body(payload[:20]), response_body(payload[20:], eos=True)]
    )
    assert streamed(out, "response_body") == b'{"id":"1","model":"alias","choices":[]}'


def test_the_model_name_rewrite_header_names_the_model_served_and_is_not_forwarded() -> None:
    """``x-gateway-model-name-rewrite`` (llm-d's picker): the replica serves the header's model, the
    response names the client's, the header goes no further, the metrics name a known model only."""
    pool = make_pool(served_models=frozenset({"m", "m-lora"}), honors_model_rewrite_header=True)
    metrics = RecordingMetrics()
    machine = make_machine(pool, metrics=metrics)
    out = feed(machine, [request_headers(extra=[("x-gateway-model-name-rewrite", "m-lora")]),
                         request_body(completion(model="auto"), eos=True)])
    sent = pool.scheduler.seen[0][0]
    assert (sent.model, sent.target_model) == ("auto", "m-lora")
    assert "x-gateway-model-name-rewrite" in removed_headers(out[0])
    assert json.loads(streamed(out))["model"] == "m-lora"
    picked_labels = next(labels for kind, labels in metrics.events if kind == "picked")
    assert isinstance(picked_labels, RequestLabels)
    assert (picked_labels.model, picked_labels.target_model) == ("__other__", "m-lora")  # "auto": unknown
    payload = b'{"id":"1","model":"m-lora","choices":[]}'
    reply = feed(machine, [response_headers(), response_body(payload, eos=True)])
    assert streamed(reply, "response_body") == b'{"id":"1","model":"auto","choices":[]}'


@pytest.mark.parametrize(("override", "honored", "status", "code"), [
    ("unknown-lora", True, 404, "model_not_found"), ("bad\nname", True, 400, "invalid_model_name"),
    ("m", False, 400, "bad_request")])
def test_a_model_name_rewrite_header_is_checked_as_a_model(override: str, honored: bool, status: int,
                                                           code: str) -> None:
    """... and refused where the pool does not take it (``kvgate.io/model-rewrite-header``)."""
    pool = make_pool(served_models=frozenset({"m"}), honors_model_rewrite_header=honored)
    machine = make_machine(pool)
    out = feed(machine, [request_headers(extra=[("x-gateway-model-name-rewrite", override)]),
                         request_body(completion(model="m"), eos=True)])
    got_status, document, _ = _error_of(out[-1:])
    assert (got_status, document["error"]["code"]) == (status, code)
    assert pool.scheduler.calls == []


def test_a_rewrite_rule_wins_over_the_model_name_rewrite_header() -> None:
    """As in llm-d's director: an InferenceModelRewrite for the request's model decides."""
    pool = make_pool(rewrites={"alias": "real-model"}, honors_model_rewrite_header=True)
    machine = make_machine(pool)
    feed(machine, [request_headers(extra=[("x-gateway-model-name-rewrite", "other")]),
                   request_body(completion(model="alias"), eos=True)])
    assert pool.scheduler.seen[0][0].target_model == "real-model"


def test_objective_priority_and_fairness_reach_the_request() -> None:
    pool = make_pool(objectives={"batch": -1})
    machine = make_machine(pool)
    extra = [("x-gateway-inference-objective", "batch"), ("x-gateway-inference-fairness-id", "tenant-a")]
    feed(
        machine,
        [request_headers(extra=extra), request_body(completion(cache_salt="s", max_tokens=9), eos=True)],
    )
    request = pool.scheduler.seen[0][0]
    assert request.sheddable
    assert request.fairness_id == "tenant-a"
    assert (request.cache_salt, request.max_tokens) == ("s", 9)


@pytest.mark.parametrize("prefix", ["x-llm-d-", "x-llm-d-router-"])
def test_llm_ds_header_names_reach_the_request(prefix: str) -> None:
    """What llm-d's guides and MaaS gateways send (its router's names for the Inference Extension's
    headers): the objective's priority, the tenant and the model override are honoured."""
    pool = make_pool(objectives={"batch": -1}, honors_model_rewrite_header=True)
    machine = make_machine(pool)
    extra = [(f"{prefix}inference-objective", "batch"), (f"{prefix}inference-fairness-id", "tenant-a"),
             (f"{prefix}model-name-rewrite", "served-model")]
    feed(machine, [request_headers(extra=extra), request_body(completion(), eos=True)])
    request = pool.scheduler.seen[0][0]
    assert request.sheddable
    assert request.fairness_id == "tenant-a"
    assert request.target_model == "served-model"


def test_unexpected_message_is_a_500_and_table_is_data() -> None:
    machine = make_machine(make_pool())
    status, _, _ = _error_of(feed(machine, [request_body(b"{}", eos=True)]))
    assert status == 500
    assert all(isinstance(state, State) for state, _ in TRANSITIONS)


def test_envoys_own_reply_before_the_pick_passes_unchanged_and_routes_nothing() -> None:
    """Envoy's 413 for a body over its buffer limit comes while the body is still arriving."""
    pool = make_pool()
    machine = make_machine(pool)
    [headers_reply] = feed(machine, [request_headers(mode=BUFFERED)])
    assert headers_reply.WhichOneof("response") == "request_headers"
    [reply] = feed(machine, [response_headers(413, "text/plain")])
    assert reply.WhichOneof("response") == "response_headers"
    assert not reply.response_headers.response.HasField("header_mutation")
    assert machine.state is State.DONE
    machine = make_machine(pool)  # before any request message (Envoy answered the headers itself)
    [reply] = feed(machine, [response_headers(431, "text/plain")])
    assert reply.WhichOneof("response") == "response_headers"
    assert pool.scheduler.seen == []


def test_request_ids_are_unique_within_a_process_and_across_processes() -> None:
    ours, theirs = RequestIds(), RequestIds()
    mine = [ours.next_id() for _ in range(1000)]
    assert len(set(mine)) == 1000
    assert not set(mine) & {theirs.next_id() for _ in range(1000)}  # another process's prefix
