"""The picker's spans (``extproc.tracing``) without sockets: the SDK's in-memory exporter, the real
scheduler and the lifecycle driven by ext_proc messages."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import StatusCode

from kvgate.extproc.tracing import SPAN_NAME, RequestSpan, RequestTracer
from kvgate.policies.schedulers import make_scheduler
from kvgate.policies.types import Usage
from tests.extproc.fakes import (
    body_chunks,
    completion,
    feed,
    make_machine,
    make_pool,
    request_body,
    request_headers,
)
from tests.policies.helpers import NOW, request, text, view
from tests.policies.test_pd_scheduler import FLEET, LONG, scheduler

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exported: InMemorySpanExporter) -> RequestTracer:
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON))
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return RequestTracer(provider.get_tracer("test"))


def by_name(exported: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exported.get_finished_spans() if s.name.startswith(prefix)]


def test_the_stream_span_is_a_child_of_the_callers_span(tracer: RequestTracer,
                                                        exported: InMemorySpanExporter) -> None:
    span = tracer.start([("traceparent", f"00-{TRACE_ID}-{PARENT}-01"), ("x-kvgate-pool", "p")])
    assert span is not None
    assert span.trace_id == TRACE_ID
    span.end(cancelled=False)
    (done,) = by_name(exported, SPAN_NAME)
    assert done.parent is not None
    assert format(done.parent.span_id, "016x") == PARENT
    assert format(done.context.trace_id, "032x") == TRACE_ID


def test_a_caller_that_did_not_sample_gets_no_span(
    tracer: RequestTracer, exported: InMemorySpanExporter
) -> None:
    assert tracer.start([("traceparent", f"00-{TRACE_ID}-{PARENT}-00")]) is None
    assert exported.get_finished_spans() == ()
    assert tracer.start([]) is not None  # no caller: the provider's sampler decides (always, here)


def test_scheduling_makes_a_profile_span_with_the_pick_and_a_span_per_plugin(
    tracer: RequestTracer, exported: InMemorySpanExporter
) -> None:
    span = tracer.start([])
    assert isinstance(span, RequestSpan)
    scheduler = make_scheduler("default")
    doc = text(7, 4000)
    scheduler.on_picked(request("warm", doc), view(2).endpoint, NOW)  # endpoint 2 holds the prefix
    result = scheduler.schedule(request("r", doc + " and a question"), [view(1), view(2), view(3)], NOW, span)
    span.end(cancelled=False)
    (profile,) = by_name(exported, "kvgate.schedule ")
    assert profile.name == "kvgate.schedule default"
    attributes = dict(profile.attributes or {})
    assert attributes["kvgate.endpoint"] == result.pick.address
    assert attributes["kvgate.candidates"] == 3
    assert list(attributes["kvgate.fallbacks"]) == [e.address for e in result.ranked[1:]]  # type: ignore[arg-type]
    assert result.pick.address == view(2).address  # prefix affinity
    assert attributes["kvgate.prefix.predicted_tokens"] == 15 * 64  # 4,000 characters: 15 whole blocks
    assert "kvgate.score.ttft" in attributes
    assert "kvgate.ttft.estimated_s" in attributes
    plugins = [s for s in exported.get_finished_spans() if s.parent is not None
               and s.parent.span_id == profile.context.span_id]
    kinds = {s.name.split(" ", 1)[0] for s in plugins}
    assert kinds == {"kvgate.filter", "kvgate.scorer", "kvgate.picker"}
    assert all(profile.start_time <= s.start_time <= s.end_time <= profile.end_time  # type: ignore[operator]
               for s in plugins)


def test_a_split_request_notes_why_and_each_half_has_its_profile_span(
    tracer: RequestTracer, exported: InMemorySpanExporter
) -> None:
    span = tracer.start([])
    assert span is not None
    scheduler().schedule(request("r", LONG), FLEET, NOW, span)
    span.end(cancelled=False)
    names = sorted(s.name for s in by_name(exported, "kvgate.schedule "))
    assert names == ["kvgate.schedule pd-decode", "kvgate.schedule pd-prefill"]
    (stream,) = by_name(exported, SPAN_NAME)
    assert (stream.attributes or {})["kvgate.pd.split"] is True


def test_the_lifecycle_describes_the_request_and_marks_a_refusal_as_an_error(
    tracer: RequestTracer, exported: InMemorySpanExporter
) -> None:
    pool = make_pool(served_models=frozenset({"m"}))
    ok = tracer.start([])
    feed(make_machine(pool, trace=ok), [request_headers(extra=[("x-request-id", "client-1")]),
                                         request_body(completion(max_tokens=5), eos=True)])
    refused = tracer.start([])
    feed(make_machine(pool, trace=refused), [request_headers(), *body_chunks(b"{not json", 3)])
    assert ok is not None
    assert refused is not None
    ok.end(cancelled=False)
    refused.end(cancelled=False)
    first, second = by_name(exported, SPAN_NAME)
    attributes = dict(first.attributes or {})
    assert attributes["http.request.header.x-request-id"] == "client-1"
    assert attributes["gen_ai.operation.name"] == "text_completion"
    assert attributes["gen_ai.request.model"] == "m"
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["kvgate.endpoint"] == "10.0.0.1:8000"
    assert first.status.status_code is StatusCode.UNSET
    assert second.status.status_code is StatusCode.ERROR
    assert (second.attributes or {})["error.type"] == "invalid_json"
    assert (second.attributes or {})["http.response.status_code"] == 400


def test_usage_and_a_fallback_are_recorded(tracer: RequestTracer, exported: InMemorySpanExporter) -> None:
    span = tracer.start([])
    assert span is not None
    span.served("10.0.0.2:8000", 200)
    span.usage(Usage(prompt_tokens=7, completion_tokens=3))
    span.end(cancelled=False)
    (done,) = by_name(exported, SPAN_NAME)
    assert (done.attributes or {})["gen_ai.usage.output_tokens"] == 3
    assert json.dumps(dict(done.attributes or {})["kvgate.endpoint.served"]) == '"10.0.0.2:8000"'


def test_the_pickers_log_lines_about_a_request_carry_its_request_id_and_trace_id(
    tracer: RequestTracer, caplog: pytest.LogCaptureFixture
) -> None:
    pool = make_pool(served_models=frozenset({"m"}))
    caplog.set_level(logging.DEBUG, logger="kvgate.extproc.lifecycle")
    picked = tracer.start([])
    refused = tracer.start([])
    assert picked is not None
    assert refused is not None
    feed(make_machine(pool, trace=picked), [request_headers(extra=[("x-request-id", "client-1")]),
                                             request_body(completion(), eos=True)])
    feed(make_machine(pool, trace=refused), [request_headers(extra=[("x-request-id", "client-2")]),
                                              *body_chunks(b"{not json", 3)])
    lines = [r.getMessage() for r in caplog.records]
    assert any("x-request-id client-1" in line and picked.trace_id in line and "picked" in line
               for line in lines)
    assert any(line.startswith("request refused (x-request-id client-2, trace " + refused.trace_id + "): 400")
               for line in lines)
