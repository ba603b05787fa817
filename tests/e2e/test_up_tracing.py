"""One request, one trace (issue 36): ``kvgate up --sim 2 --otlp-endpoint URL`` with real Envoy and
an OTLP/gRPC receiver started here (``tests.e2e.otlp_receiver``, the published OTLP protos).

Envoy's spans (the request, its ext_proc call, each upstream attempt) and the picker's (the ext_proc
stream, the scheduling profile, each plugin) share the trace id, the picker's stream span is a
child of Envoy's ext_proc span, a retried request shows both upstream attempts, and a request the
picker refuses (400) has the error status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kvgate.bench.otlp_receiver import OtlpReceiver, ReceivedSpan
from kvgate.extproc.tracing import SPAN_NAME
from kvgate.gateway.picker.tracing import TracingSettings
from kvgate.gateway.processes.envoy_process import free_port
from kvgate.gateway.up import KvgateUp
from kvgate.gateway.up_options import EXAMPLE_MODEL, UpOptions
from tests.e2e.conftest import SimFleet
from tests.e2e.picker_harness import fleet_admin_url
from tests.e2e.test_up_faults import ROUTE, three_replicas_configured
from tests.e2e.test_up_routing import gateway_yaml, pool_yaml, wait_ready

pytestmark = pytest.mark.e2e
REPLICA_POD = """
apiVersion: v1
kind: Pod
metadata: {name: replica-0, labels: {app: pool}}
status: {phase: Running, podIP: 127.0.0.1}
"""
VLLM_PAGE = """vllm:num_requests_waiting{model_name="m"} 0
vllm:num_requests_running{model_name="m"} 0
vllm:kv_cache_usage_perc{model_name="m"} 0.1
"""


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    started = OtlpReceiver()
    await started.start()
    yield started
    await started.stop()


def picker_span(spans: list[ReceivedSpan], request_id: str) -> ReceivedSpan | None:
    return next((s for s in spans if s.name == SPAN_NAME
                 and s.attribute("http.request.header.x-request-id") == request_id), None)


def upstream_attempts(trace: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """Envoy's spans of its upstream attempts (``spawn_upstream_span``: one per try)."""
    return [s for s in trace if s.service == "kvgate-envoy" and s.name.startswith("router ")
            and "kvgate_pool" in s.name]


async def post(
    http: aiohttp.ClientSession, url: str, request_id: str, model: str, body: str | None = None
) -> int:
    data = body if body is not None else json.dumps({"model": model, "prompt": "hello", "max_tokens": 4})
    async with http.post(f"{url}/v1/completions", data=data,
                         headers={"content-type": "application/json", "x-request-id": request_id}) as r:
        await r.read()
        return r.status


async def test_one_request_gives_one_trace_through_envoy_and_the_picker(
    receiver: OtlpReceiver, http: aiohttp.ClientSession
) -> None:
    up = KvgateUp(UpOptions(port=free_port(), admin_port=0, sim=2, sim_hosts_from="127.0.9.1",
                            sim_time_scale=0.01, tracing=TracingSettings(receiver.endpoint)))
    try:
        await up.start()
        await wait_ready(http, up, ["default"])
        assert await post(http, up.url, "traced-ok", EXAMPLE_MODEL) == 200
        assert await post(http, up.url, "traced-400", EXAMPLE_MODEL, body='{"model": ') == 400
        # the picker's spans, then Envoy's (its exporter flushes every 5 s)
        await receiver.wait_for(lambda spans: picker_span(spans, "traced-400") is not None, "picker span")
        ok = picker_span(receiver.spans, "traced-ok")
        assert ok is not None
        await receiver.wait_for(lambda _: len(upstream_attempts(receiver.trace(ok.trace_id))) >= 1,
                                "Envoy's upstream span of the request", timeout_s=15.0)
    finally:
        await up.stop()

    trace = receiver.trace(ok.trace_id)
    by_id = {s.span_id: s for s in trace}
    envoy = [s for s in trace if s.service == "kvgate-envoy"]
    assert envoy, "Envoy's spans are in the same trace"
    # the picker's stream span is a child of Envoy's span of the ext_proc call
    parent = by_id.get(ok.parent_id)
    assert parent is not None, (ok.parent_id, sorted(by_id))
    assert parent.service == "kvgate-envoy"
    assert "ExternalProcessor" in parent.name
    assert ok.attribute("gen_ai.operation.name") == "text_completion"
    assert ok.attribute("gen_ai.request.model") == EXAMPLE_MODEL
    picked = ok.attribute("kvgate.endpoint")
    assert isinstance(picked, str)
    assert picked.startswith("127.0.9.")
    assert not ok.error
    schedule = [s for s in trace if s.parent_id == ok.span_id and s.name.startswith("kvgate.schedule ")]
    assert len(schedule) == 1
    assert schedule[0].attribute("kvgate.endpoint") == picked
    assert schedule[0].attribute("kvgate.candidates") == 2
    plugins = [s for s in trace if s.parent_id == schedule[0].span_id]
    assert {s.name.split(" ", 1)[0] for s in plugins} >= {"kvgate.filter", "kvgate.scorer", "kvgate.picker"}
    assert all(s.span.end_time_unix_nano >= s.span.start_time_unix_nano for s in plugins)
    assert len(upstream_attempts(trace)) == 1

    refused = picker_span(receiver.spans, "traced-400")  # the picker's own answer: a malformed body
    assert refused is not None
    assert refused.error
    assert refused.attribute("http.response.status_code") == 400
    assert refused.attribute("error.type") == "invalid_json"
    envoy_ingress = [s for s in receiver.trace(refused.trace_id) if s.name == "ingress"]
    assert envoy_ingress
    assert envoy_ingress[0].attribute("http.status_code") == "400"


async def test_a_retried_request_shows_both_attempts_in_its_trace(
    tmp_path: Path, receiver: OtlpReceiver, start_fleet: Callable[..., Awaitable[SimFleet]],
    http: aiohttp.ClientSession,
) -> None:
    """One of three replicas answers 500 to everything: a request the picker sent there is retried
    on its next endpoint, and Envoy's trace of it has two upstream attempts, the first an error."""
    fleet = await three_replicas_configured(start_fleet, tmp_path, "127.0.9.11")
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=0,
                            tracing=TracingSettings(receiver.endpoint)))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        async with http.post(f"{fleet_admin_url(fleet)}/replicas/0/faults", json={"error_rate": 1.0}) as r:
            assert r.status == 200
        for i in range(24):  # the failing replica is ejected after a few: the first ones meet it
            assert await post(http, up.url, f"retry-{i}", "base") == 200

        def retried(spans: list[ReceivedSpan]) -> bool:
            traces = {s.trace_id for s in spans if s.name == SPAN_NAME}
            return any(len(upstream_attempts(receiver.trace(t))) >= 2 for t in traces)

        await receiver.wait_for(retried, "a trace with two upstream attempts", timeout_s=15.0)
    finally:
        await up.stop()
    trace_id = next(t for t in {s.trace_id for s in receiver.spans if s.name == SPAN_NAME}
                    if len(upstream_attempts(receiver.trace(t))) >= 2)
    attempts = sorted(upstream_attempts(receiver.trace(trace_id)), key=lambda s: s.span.start_time_unix_nano)
    assert attempts[0].error or attempts[0].attribute("http.status_code") == "500"
    assert not attempts[-1].error


async def test_the_trace_context_reaches_the_model_server(
    tmp_path: Path, receiver: OtlpReceiver, http: aiohttp.ClientSession
) -> None:
    """Envoy forwards the W3C ``traceparent`` to the replica (vLLM's own spans join the trace there):
    a replica that echoes its request's headers (and serves a vLLM metrics page) shows the picker's
    trace id."""
    seen: dict[str, str] = {}

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=VLLM_PAGE, content_type="text/plain")

    async def completion(request: web.Request) -> web.Response:
        seen.update({k.lower(): v for k, v in request.headers.items()})
        return web.json_response({"object": "text_completion", "model": "m", "choices": []})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completion)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    (tmp_path / "gateway.yaml").write_text(gateway_yaml())
    forwarding = 'metadata: {name: pool, annotations: {"kvgate.io/model-check": "false"}}'
    pool = pool_yaml("pool", port).replace("metadata: {name: pool}", forwarding)
    (tmp_path / "pool.yaml").write_text(pool + "---" + REPLICA_POD + "---" + ROUTE)
    up = KvgateUp(UpOptions(directory=tmp_path, port=free_port(), admin_port=0, sim=0,
                            tracing=TracingSettings(receiver.endpoint)))
    try:
        await up.start()
        await wait_ready(http, up, ["pool"])
        async with http.post(f"{up.url}/v1/completions", data=json.dumps({"model": "m", "prompt": "hi"}),
                             headers={"content-type": "application/json", "x-request-id": "echoed"}) as r:
            assert r.status == 200
        await receiver.wait_for(lambda spans: picker_span(spans, "echoed") is not None, "picker span")
    finally:
        await up.stop()
        await runner.cleanup()
    span = picker_span(receiver.spans, "echoed")
    assert span is not None
    traceparent = seen.get("traceparent", "")
    assert traceparent.split("-")[1:2] == [span.trace_id], (traceparent, span.trace_id)
