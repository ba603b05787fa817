"""Outcome reports: Envoy's access-log entries of skipped requests, read and applied without sockets."""

from __future__ import annotations

import grpc
import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvgate.extproc.events import StreamClosed
from kvgate.extproc.lifecycle import RequestLifecycle
from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.extproc.outcomes import Outcome, OutcomeReports, outcome_header, outcome_of
from kvgate.extproc.ports import RequestLabels
from kvgate.extproc.server import ExtProcServer
from tests.extproc.fakes import (
    BUFFERED,
    NONE,
    FakeDirectory,
    RecordingMetrics,
    StepClock,
    completion,
    feed,
    make_machine,
    make_pool,
    request_body,
    request_headers,
    set_headers,
)

LABELS = RequestLabels(pool="default/llama", model="meta-llama/Llama-3.1-8B-Instruct", target_model="lora a")


def _entry(outcome: str | None, *, destination: str = "10.0.0.1:8000,10.0.0.2:8000",
           upstream: str | None = "10.0.0.1:8000", status: int = 200,
           first_byte_s: float | None = 0.25) -> accesslog_pb2.HTTPAccessLogEntry:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    if outcome is not None:
        entry.request.request_headers["x-kvgate-outcome"] = outcome
    entry.request.request_headers["x-gateway-destination-endpoint"] = destination
    if upstream is not None:
        host, port = upstream.rsplit(":", 1)
        entry.common_properties.upstream_remote_address.socket_address.address = host
        entry.common_properties.upstream_remote_address.socket_address.port_value = int(port)
    if first_byte_s is not None:
        entry.common_properties.time_to_first_upstream_rx_byte.FromNanoseconds(int(first_byte_s * 1e9))
    if status:
        entry.response.response_code.value = status
    return entry


def test_an_entry_reads_back_what_the_picker_marked() -> None:
    outcome = outcome_of(_entry(outcome_header(LABELS, streamed=False), upstream="10.0.0.2:8000", status=503))
    assert outcome == Outcome(labels=LABELS, streamed=False, picked="10.0.0.1:8000", served="10.0.0.2:8000",
                              status=503, first_byte_s=0.25)
    header = outcome_header(LABELS, streamed=True)
    streamed = outcome_of(_entry(header, upstream=None, status=0, first_byte_s=None))
    assert streamed is not None
    assert (streamed.streamed, streamed.served, streamed.status) == (True, None, 0)
    assert streamed.first_byte_s is None
    assert outcome_of(_entry(None)) is None  # not one of the picker's: ignored
    assert outcome_of(_entry("a b")) is None  # malformed: ignored


@pytest.mark.parametrize(
    "labels",
    [
        RequestLabels("default/llama", "meta/llama-3:8b@v1", "m"),
        RequestLabels("p", "a model", "m"),  # a space inside a name
        RequestLabels("p", "100%", "50% off"),
        RequestLabels("p", "modèle", "m"),
        RequestLabels("p", "", "tab\there"),
        RequestLabels("p", "", ""),
    ],
)
def test_every_name_reads_back_and_plain_names_are_sent_as_they_are(labels: RequestLabels) -> None:
    header = outcome_header(labels, streamed=True)
    assert header.count(" ") == 3
    outcome = outcome_of(_entry(header))
    assert outcome is not None
    assert outcome.labels == labels
    assert outcome.streamed
    names = (labels.pool, labels.model, labels.target_model)
    plain = all(p.isascii() and p.isprintable() and " " not in p and "%" not in p for p in names)
    assert (header == f"{labels.pool} {labels.model} {labels.target_model} s") is plain


def _reports() -> tuple[OutcomeReports, list[tuple[str, bool]], RecordingMetrics]:
    pool = make_pool(name="default/llama")
    metrics = RecordingMetrics()
    reports = OutcomeReports(FakeDirectory({pool.name: pool}, default=pool.name), clock=StepClock(),
                             metrics=metrics)
    return reports, pool.scheduler.outcomes, metrics


def _outcome(**changes: object) -> Outcome:
    base = {"labels": LABELS, "streamed": False, "picked": "10.0.0.1:8000", "served": "10.0.0.1:8000",
            "status": 200, "first_byte_s": 0.25}
    return Outcome(**{**base, **changes})  # type: ignore[arg-type]


def test_a_response_counts_for_its_endpoint_and_a_non_streamed_one_is_its_first_token() -> None:
    reports, outcomes, metrics = _reports()
    reports.apply(_outcome())
    assert outcomes == [("10.0.0.1:8000", True)]
    assert metrics.events == [("ttft", 0.25)]
    reports.apply(_outcome(streamed=True))  # a stream's first byte is not its first token
    assert metrics.events == [("ttft", 0.25)]


def test_a_5xx_a_fallback_and_a_refused_connection_count_against_the_endpoints_that_failed() -> None:
    reports, outcomes, metrics = _reports()
    reports.apply(_outcome(status=500))
    assert outcomes == [("10.0.0.1:8000", False)]
    outcomes.clear()
    reports.apply(_outcome(served="10.0.0.2:8000"))  # Envoy went on past the pick, and it served
    assert outcomes == [("10.0.0.1:8000", False), ("10.0.0.2:8000", True)]
    assert ("fallback", "default/llama") in metrics.events
    outcomes.clear()
    reports.apply(_outcome(served=None, status=503))  # no connection to the pick
    assert outcomes == [("10.0.0.1:8000", False)]


def test_no_response_blames_nobody_and_what_cannot_be_applied_is_counted() -> None:
    reports, outcomes, _ = _reports()
    reports.apply(_outcome(status=0))  # the client went away first
    assert outcomes == []
    reports.apply(_outcome(labels=RequestLabels("gone", "m", "m")))
    reports.apply_entry(_entry(None))
    reports.apply_entry(_entry(outcome_header(LABELS, streamed=False), status=502, upstream=None))
    assert outcomes == [("10.0.0.1:8000", False)]
    assert reports.counts == {"applied": 2, "unknown_pool": 1, "unreadable": 1}


def test_a_skipped_request_is_marked_and_its_close_leaves_the_verdict_to_the_report() -> None:
    config = LifecycleConfig(skip_unread_responses=True, outcome_reports=True)
    pool = make_pool()
    machine = make_machine(pool, config=config)
    out = _start(machine)
    marked = set_headers(out[1])["x-kvgate-outcome"]
    assert marked == outcome_header(RequestLabels("llama", "m", "m"), streamed=False)
    machine.handle(StreamClosed(cancelled=False))
    assert pool.scheduler.calls[-1] == ("finished", ("10.0.0.1:8000", False))  # no success counted yet
    unmarked = make_machine(make_pool(), config=LifecycleConfig(skip_unread_responses=True))
    assert "x-kvgate-outcome" not in set_headers(_start(unmarked)[1])


def _start(machine: RequestLifecycle) -> list[pb.ProcessingResponse]:
    out = feed(machine, [request_headers(mode=BUFFERED, response_mode=NONE)])
    return out + feed(machine, [request_body(completion(), eos=True)])


async def _report_500s(port: int) -> grpc.StatusCode:
    """Forged reports of 500 from 10.0.0.1 sent to ``port``; the status the call ended with."""
    entry = _entry(outcome_header(LABELS, streamed=False), status=500)
    message = als_pb2.StreamAccessLogsMessage()
    message.http_logs.log_entry.extend([entry] * 10)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = als_pb2_grpc.AccessLogServiceStub(channel)
        try:
            await stub.StreamAccessLogs(iter([message]))
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def test_reports_are_taken_on_the_loopback_outcome_port_alone_never_on_the_ext_proc_port() -> None:
    """Forged 500s sent to the port other gateways reach took a replica out of picking."""
    pool = make_pool(name="default/llama")
    server = ExtProcServer(FakeDirectory({pool.name: pool}, default=pool.name), address="127.0.0.1:0",
                           outcome_address="127.0.0.1:0")
    await server.start()
    try:
        assert server.outcome_port not in (0, server.port)
        assert await _report_500s(server.port) is grpc.StatusCode.UNIMPLEMENTED
        assert pool.scheduler.outcomes == []
        assert await _report_500s(server.outcome_port) is grpc.StatusCode.OK
        assert pool.scheduler.outcomes == [("10.0.0.1:8000", False)] * 10
    finally:
        await server.stop(0)
    bare = ExtProcServer(FakeDirectory({pool.name: pool}, default=pool.name), address="127.0.0.1:0")
    await bare.start()
    try:
        assert bare.outcome_port == 0  # a picker not behind kvgate's own Envoy takes no reports at all
        assert await _report_500s(bare.port) is grpc.StatusCode.UNIMPLEMENTED
    finally:
        await bare.stop(0)
