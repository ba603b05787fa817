"""The per-attempt bound of non-streamed requests (issue 14: a replica that accepts and never
answers): what the picker computes, and the Envoy router header it writes."""

from __future__ import annotations

import dataclasses

import pytest

from kvgate.extproc.attempt_timeout import ATTEMPT_TIMEOUT_HEADER, AttemptTimeout
from kvgate.extproc.lifecycle_config import LifecycleConfig
from tests.extproc.fakes import (
    completion,
    feed,
    make_machine,
    make_pool,
    request_body,
    request_headers,
    set_headers,
)

BOUND = LifecycleConfig(attempt_timeout=AttemptTimeout(base_s=30.0, per_token_s=0.1))


def test_the_bound_is_the_base_plus_a_per_token_allowance_for_what_the_request_asks() -> None:
    bound = AttemptTimeout(base_s=2.0, per_token_s=0.05)
    assert bound.milliseconds(100, streamed=False) == 7_000
    assert bound.milliseconds(1, streamed=False) == 2_050
    assert bound.milliseconds(None, streamed=False) is None  # generates up to the context length
    assert bound.milliseconds(0, streamed=False) is None
    assert bound.milliseconds(100, streamed=True) is None  # the route's idle bound applies instead


@pytest.mark.parametrize(("base", "per_token"), [(0.0, 0.1), (-1.0, 0.1), (1.0, -0.1)])
def test_a_bound_that_cannot_work_is_refused(base: float, per_token: float) -> None:
    with pytest.raises(ValueError, match="attempt timeout"):
        AttemptTimeout(base, per_token)


def _headers_for(body: bytes, config: LifecycleConfig) -> dict[str, str]:
    out = feed(make_machine(make_pool(), config=config), [request_headers(), request_body(body, eos=True)])
    return set_headers(out[0])


def test_a_non_streamed_request_with_max_tokens_carries_its_bound_to_envoys_router() -> None:
    headers = _headers_for(completion(max_tokens=200), BOUND)
    assert headers[ATTEMPT_TIMEOUT_HEADER] == "50000"
    assert "x-kvgate-stream" not in headers


@pytest.mark.parametrize("body", [
    completion(max_tokens=200, stream=True),  # streamed: the idle bound of the stream route
    completion(),  # no max_tokens: no duration is too long
])
def test_no_bound_where_none_applies(body: bytes) -> None:
    assert ATTEMPT_TIMEOUT_HEADER not in _headers_for(body, BOUND)


def test_a_picker_configured_without_a_bound_writes_none() -> None:
    # kvgate picker behind a gateway configured by others: their routes keep their own timeouts
    assert ATTEMPT_TIMEOUT_HEADER not in _headers_for(completion(max_tokens=200), LifecycleConfig())


def test_max_completion_tokens_counts_as_max_tokens() -> None:
    headers = _headers_for(completion(max_completion_tokens=10), BOUND)
    assert headers[ATTEMPT_TIMEOUT_HEADER] == "31000"


def test_a_route_rules_backend_request_caps_the_bound() -> None:
    # the header overrides the route's per_try_timeout in Envoy: the picker writes the smaller one
    capped = dataclasses.replace(BOUND, attempt_cap_ms=600)
    assert _headers_for(completion(max_tokens=200), capped)[ATTEMPT_TIMEOUT_HEADER] == "600"
    loose = dataclasses.replace(BOUND, attempt_cap_ms=120_000)
    assert _headers_for(completion(max_tokens=200), loose)[ATTEMPT_TIMEOUT_HEADER] == "50000"
    # no bound of its own (streamed, no max_tokens): none written, the route's per-try timeout applies
    assert ATTEMPT_TIMEOUT_HEADER not in _headers_for(completion(max_tokens=200, stream=True), capped)
