"""The lifecycle with a tenant limiter: checked before scheduling, counted once routed, charged with
the response's usage; over the limit → 429 with the rate-limit headers and no scheduling."""

from __future__ import annotations

import json

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.extproc.ports import TenantKey
from kvgate.gateway.picker.ratelimit import InProcessCounters, TenantLimits, TenantRateLimiter
from kvgate.policies.errors import RequestShedError
from tests.extproc.fakes import (
    FakePool,
    completion,
    feed,
    make_machine,
    make_pool,
    request_body,
    request_headers,
    response_body,
    response_headers,
)

ACME = [("x-gateway-inference-fairness-id", "acme")]
GLOBEX = [("x-gateway-inference-fairness-id", "globex")]


def _send(
    pool: FakePool, config: LifecycleConfig, tenant: list[tuple[str, str]]
) -> list[pb.ProcessingResponse]:
    messages = [request_headers(extra=tenant), request_body(completion(), eos=True)]
    return feed(make_machine(pool, config=config), messages)


def _limiter(**limits: int) -> TenantRateLimiter:
    limiter = TenantRateLimiter(InProcessCounters())
    limiter.configure("llama", TenantLimits(**limits))  # type: ignore[arg-type]
    return limiter


def _immediate(out: list[pb.ProcessingResponse]) -> tuple[int, dict[str, str], str]:
    assert len(out) == 1
    immediate = out[0].immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
    return int(immediate.status.code), headers, json.loads(immediate.body)["error"]["code"]


def test_over_the_request_limit_is_429_with_headers_and_never_scheduled() -> None:
    pool = make_pool()
    limiter = _limiter(requests=2)
    config = LifecycleConfig(tenant_limiter=limiter)
    for _ in range(2):
        out = _send(pool, config, ACME)
        assert out[0].HasField("request_headers")
    out = _send(pool, config, ACME)
    status, headers, code = _immediate(out)
    assert (status, code) == (429, "rate_limit_exceeded")
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-reset-requests" in headers
    assert int(headers["retry-after"]) >= 1
    assert pool.scheduler.count("picked") == 2
    assert len(pool.scheduler.seen) == 2  # the refused request never reached the scheduler
    out = _send(pool, config, GLOBEX)
    assert out[0].HasField("request_headers")  # another tenant is unaffected


def test_tokens_are_charged_from_usage_and_shed_requests_are_not_counted() -> None:
    pool = make_pool()
    limiter = _limiter(requests=10, tokens=100)
    config = LifecycleConfig(tenant_limiter=limiter)
    machine = make_machine(pool, config=config)
    feed(machine, [request_headers(extra=ACME), request_body(completion(), eos=True)])
    usage = {"prompt_tokens": 70, "completion_tokens": 40}
    payload = json.dumps({"model": "m", "choices": [], "usage": usage}).encode()
    feed(machine, [response_headers(), response_body(payload, eos=True)])
    assert limiter.usage(TenantKey("llama", "acme")) == (1.0, 110.0)
    out = _send(pool, config, ACME)
    status, headers, _ = _immediate(out)
    assert status == 429
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    pool.scheduler.error = RequestShedError("saturated")
    other = _send(pool, config, GLOBEX)
    assert _immediate(other)[2] == "request_shed"
    assert limiter.usage(TenantKey("llama", "globex")) == (0.0, 0.0)
