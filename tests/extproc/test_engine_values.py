"""Request fields the picker reads as the engines' pydantic request models read them (lax mode)."""

from __future__ import annotations

import json

import pytest

from kvgate.extproc.engine_values import engine_bool, engine_int
from kvgate.extproc.openai_request import parse_request_body, upstream_body
from kvgate.policies.types import ApiKind


@pytest.mark.parametrize(("value", "expected"), [
    (True, True), (False, False), (None, False), ("true", True), ("True", True), ("yes", True),
    ("on", True), ("1", True), (1, True), (1.0, True), ("false", False), ("0", False), (0, False),
    ("maybe", False), (2, False), ([True], False), ({}, False),  # the engine's 400s: not a stream
])
def test_engine_bool_is_pydantics_lax_bool(value: object, expected: bool) -> None:
    assert engine_bool(value) is expected


@pytest.mark.parametrize(("value", "expected"), [
    (16, 16), ("16", 16), (" 16 ", 16), (16.0, 16), ("16.0", 16), (True, 1), ("4_000", 4000),
    (16.5, None), ("sixteen", None), (None, None), ([16], None), ({"n": 16}, None),
])
def test_engine_int_is_pydantics_lax_int(value: object, expected: int | None) -> None:
    assert engine_int(value) == expected


def test_a_stream_the_engine_reads_from_a_string_is_a_stream_to_the_picker_too() -> None:
    # vLLM streams {"stream": "true"}: the picker must inject usage and read the first token as a stream's
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "true",
                      "max_completion_tokens": "12"}).encode()
    parsed = parse_request_body(ApiKind.CHAT_COMPLETIONS, raw)
    assert parsed.stream
    assert parsed.max_tokens == 12
    assert not parsed.usage_requested
    body = json.loads(upstream_body(parsed, raw, "m", inject_usage=True).data)
    assert body["stream_options"] == {"include_usage": True}
    assert body["stream"] == "true"
    options = {"include_usage": "yes"}
    raw = json.dumps({"model": "m", "prompt": "x", "stream": 1, "stream_options": options}).encode()
    parsed = parse_request_body(ApiKind.COMPLETIONS, raw)
    assert parsed.stream
    assert parsed.usage_requested
    assert upstream_body(parsed, raw, "m", inject_usage=True).rewritten is False
