"""No request body reaches an unhandled exception in the parser: every refusal is a 4xx KvgateError.

Property tests (Hypothesis) over the OpenAI request schema's shapes, for every API kvgate reads:
well-typed fields, wrongly typed fields, deep nesting, odd bytes. A body is either parsed (and can
be prepared for upstream, with and without a model rewrite) or refused with a client error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.extproc.bbr import model_of
from kvgate.extproc.openai_request import TOO_DEEP, parse_request_body, upstream_body
from kvgate.policies.errors import KvgateError, MalformedBodyError
from kvgate.policies.types import ApiKind

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)
part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])}, optional={"text": json_values})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]) | json_values},
    optional={"content": st.text(max_size=40) | st.lists(part | json_values, max_size=3) | json_values},
)
fields: dict[str, Any] = {
    "model": st.text(max_size=20) | json_values,
    "prompt": st.text(max_size=40) | st.lists(st.text(max_size=10), max_size=3)
    | st.lists(st.integers(0, 50_000), max_size=5) | json_values,
    "messages": st.lists(message | json_values, max_size=3) | json_values,
    "input": st.text(max_size=40) | st.lists(message | st.text(max_size=10), max_size=3) | json_values,
    "instructions": st.text(max_size=20) | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | json_values})
    | json_values,
    "cache_salt": st.text(max_size=10) | json_values,
    "max_tokens": st.integers(-5, 10_000) | json_values,
}
documents = st.fixed_dictionaries({}, optional=fields) | json_values
apis = st.sampled_from(list(ApiKind))


def _check(api: ApiKind, raw: bytes) -> None:
    try:
        parsed = parse_request_body(api, raw)
    except KvgateError as error:
        status = error.status
        if not 400 <= status < 500:
            raise AssertionError(f"refused with {status}: {error}") from error
        return
    for target in (parsed.model, parsed.model + "-v2"):
        for inject in (True, False):
            upstream = upstream_body(parsed, raw, target, inject_usage=inject)
            assert json.loads(upstream.data)["model"] == target
    model_of(raw)  # the body-based router never raises either


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(api=apis, document=documents)
def test_any_json_document_is_parsed_or_refused_with_a_client_error(api: ApiKind, document: object) -> None:
    _check(api, json.dumps(document).encode())


@settings(max_examples=200, deadline=None)
@given(api=apis, raw=st.binary(max_size=200))
def test_any_bytes_are_parsed_or_refused_with_a_client_error(api: ApiKind, raw: bytes) -> None:
    _check(api, raw)


def test_a_body_nested_100000_levels_deep_is_a_400_not_a_crash() -> None:
    raw = b'{"model":"m","prompt":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for api in (ApiKind.COMPLETIONS, ApiKind.CHAT_COMPLETIONS, ApiKind.OTHER):
        with pytest.raises(MalformedBodyError) as raised:
            parse_request_body(api, raw)
        assert raised.value.status == 400
        assert raised.value.message == TOO_DEEP
    assert model_of(raw) is None


def test_content_nested_near_the_limit_is_refused_when_hashing_it_would_recurse() -> None:
    depth = 990  # parses (under the limit) but its serialisation for prefix hashing goes deeper
    content = "[" * depth + "]" * depth
    raw = ('{"model":"m","messages":[{"role":"user","content":[' + content + "]}]}").encode()
    refusal: str | None = None
    try:
        parsed = parse_request_body(ApiKind.CHAT_COMPLETIONS, raw)
    except MalformedBodyError as error:
        refusal = error.message
    else:  # or it is parsed and can be forwarded (any other exception fails the test)
        upstream_body(parsed, raw, "m-v2", inject_usage=True)
    assert refusal in (None, TOO_DEEP)
