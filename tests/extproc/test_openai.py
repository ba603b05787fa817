"""OpenAI request parsing / body preparation and response usage parsing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import pytest

from kvgate.extproc.openai_request import BodyBuffer, api_kind, parse_request_body, upstream_body
from kvgate.extproc.openai_response import ResponseBodyProcessor, usage_from_document
from kvgate.policies.errors import BadRequestError, MalformedBodyError, PayloadTooLargeError
from kvgate.policies.types import ApiKind


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/v1/chat/completions", ApiKind.CHAT_COMPLETIONS),
        ("/v1/completions?x=1", ApiKind.COMPLETIONS),
        ("/openai/v1/embeddings/", ApiKind.EMBEDDINGS),
        ("/v1/responses", ApiKind.RESPONSES),
        ("/v1/models", ApiKind.OTHER),
    ],
)
def test_api_kind_from_path_suffix(path: str, kind: ApiKind) -> None:
    assert api_kind(path) is kind


@pytest.mark.parametrize(
    ("prompt", "text"),
    [("abc", "abc"), (["a", "b"], "a\nb"), ([1, 2, 3], "1 2 3"), ([[1, 2], [3]], "1 2\n3")],
)
def test_completion_prompt_forms(prompt: object, text: str) -> None:
    parsed = parse_request_body(ApiKind.COMPLETIONS, json.dumps({"model": "m", "prompt": prompt}).encode())
    assert parsed.prompt == text


def test_chat_messages_flatten_in_order_with_parts() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look: "},
                    {"type": "image_url", "image_url": {"url": "u"}},
                ],
            },
        ],
        "max_completion_tokens": 5,
    }
    parsed = parse_request_body(ApiKind.CHAT_COMPLETIONS, json.dumps(body).encode())
    assert parsed.prompt.startswith("system: be brief\nuser: look: {")
    assert '"url":"u"' in parsed.prompt
    assert parsed.max_tokens == 5
    again = parse_request_body(ApiKind.CHAT_COMPLETIONS, json.dumps(body).encode())
    assert again.prompt == parsed.prompt


def chat_with(part: Mapping[str, object]) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "see "}, part]}]}
    return parse_request_body(ApiKind.CHAT_COMPLETIONS, json.dumps(body).encode()).prompt


def test_an_inline_image_is_hashed_as_a_short_stand_in_not_as_prompt_text() -> None:
    """A 300 KB data URL read as text made a 75,000-token prompt estimate; its stand-in is a digest
    that tells images apart; an item the client named (vLLM's ``uuid``) is its name, with its data
    or without."""
    big = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 300_000}}
    other = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "B" * 300_000}}
    prompt = chat_with(big)
    assert len(prompt) < 100
    assert prompt == chat_with(dict(big))
    assert prompt != chat_with(other)
    named = chat_with({**big, "uuid": "photo-1"})
    assert named == chat_with({"type": "image_url", "image_url": None, "uuid": "photo-1"})
    assert named == "user: see <image_url photo-1>"


@pytest.mark.parametrize(
    ("api", "body", "error"),
    [
        (ApiKind.COMPLETIONS, b"\xff\xfe{", MalformedBodyError),
        (ApiKind.COMPLETIONS, b"[1]", BadRequestError),
        (ApiKind.COMPLETIONS, b'{"model": 3, "prompt": "x"}', BadRequestError),
        (ApiKind.COMPLETIONS, b'{"model": "m", "prompt": []}', BadRequestError),
        (ApiKind.COMPLETIONS, b'{"model": "m", "prompt": [{"a": 1}]}', BadRequestError),
        (ApiKind.CHAT_COMPLETIONS, b'{"model": "m"}', BadRequestError),
        (ApiKind.CHAT_COMPLETIONS, b'{"model": "m", "messages": ["x"]}', BadRequestError),
        (ApiKind.EMBEDDINGS, b'{"model": "m"}', BadRequestError),
    ],
)
def test_bad_bodies(api: ApiKind, body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_request_body(api, body)


def test_body_left_alone_unless_it_must_change() -> None:
    raw = b'{"model": "m", "prompt": "x", "stream": true, "stream_options": {"include_usage": true}}'
    parsed = parse_request_body(ApiKind.COMPLETIONS, raw)
    assert upstream_body(parsed, raw, "m", inject_usage=True).data is raw
    renamed = upstream_body(parsed, raw, "lora-a", inject_usage=True)
    assert json.loads(renamed.data)["model"] == "lora-a"
    assert not renamed.usage_injected
    embeddings = b'{"model": "m", "input": "x", "stream": true}'
    parsed = parse_request_body(ApiKind.EMBEDDINGS, embeddings)
    assert upstream_body(parsed, embeddings, "m", inject_usage=True).data is embeddings


def test_body_buffer_refuses_past_the_limit() -> None:
    buffer = BodyBuffer(10)
    buffer.append(b"12345")
    buffer.append(b"67890")
    with pytest.raises(PayloadTooLargeError):
        buffer.append(b"x")


def test_usage_from_documents() -> None:
    usage = usage_from_document({"usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (3, 4, None)
    responses = usage_from_document(
        {
            "type": "response.completed",
            "response": {
                "usage": {"input_tokens": 8, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 6}}
            },
        }
    )
    assert responses is not None
    assert (responses.prompt_tokens, responses.completion_tokens, responses.cached_tokens) == (8, 2, 6)
    assert usage_from_document({"usage": None}) is None


def test_sse_usage_split_across_many_chunks_passes_through_unchanged() -> None:
    stream = (
        b'data: {"choices":[{"text":"a"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )
    processor = ResponseBodyProcessor(sse=True)
    out = b"".join(processor.feed(stream[i : i + 3], False) for i in range(0, len(stream), 3))
    out += processor.feed(b"", True)
    assert out == stream
    assert processor.usage is not None
    assert processor.usage.prompt_tokens == 11


def test_sse_crlf_events_and_usage_chunk_dropped_byte_by_byte() -> None:
    stream = (
        b'data: {"choices":[{"text":"a"}],"usage":null}\r\n\r\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    processor = ResponseBodyProcessor(sse=True, drop_usage_chunk=True)
    out = b"".join(processor.feed(stream[i : i + 1], False) for i in range(len(stream)))
    out += processor.feed(b"", True)
    assert out == b'data: {"choices":[{"text":"a"}],"usage":null}\r\n\r\ndata: [DONE]\r\n\r\n'
    assert processor.usage is not None


def test_large_json_response_usage_found_in_the_tail() -> None:
    body = json.dumps(
        {"data": [{"embedding": [0.5] * 5000}], "usage": {"prompt_tokens": 9, "completion_tokens": 0}}
    )
    processor = ResponseBodyProcessor(sse=False, copy_limit=1000)
    data = body.encode()
    out = b"".join(processor.feed(data[i : i + 4096], False) for i in range(0, len(data), 4096))
    out += processor.feed(b"", True)
    assert out == data
    assert processor.usage is not None
    assert processor.usage.prompt_tokens == 9


def test_large_json_response_with_rename_is_forwarded_unchanged() -> None:
    data = json.dumps({"model": "real", "data": "x" * 5000}).encode()
    processor = ResponseBodyProcessor(sse=False, rename_model=("real", "alias"), copy_limit=1000)
    out = b"".join(processor.feed(data[i : i + 700], False) for i in range(0, len(data), 700))
    out += processor.feed(b"", True)
    assert out == data


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (123, "'model' must be a string, not a number"),
        (True, "'model' must be a string, not a boolean"),
        (["m"], "'model' must be a string, not an array"),
        ({"name": "m"}, "'model' must be a string, not an object"),
        (None, "'model' is required"),
        ("", "'model' is required"),
    ],
)
def test_a_model_that_is_not_a_string_says_so(model: object, message: str) -> None:
    with pytest.raises(BadRequestError) as raised:
        parse_request_body(ApiKind.COMPLETIONS, json.dumps({"model": model, "prompt": "hi"}).encode())
    assert raised.value.message == message
    assert raised.value.status == 400


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (b'{"model":"m","prompt":"\\ud800"}', True),  # a high surrogate alone
        (b'{"model":"m","prompt":"x\\udc00y"}', True),  # a low one alone
        (b'{"model":"m","prompt":"\\ud83d\\ud83d\\ude00"}', True),  # a pair after a lone high one
        (b'{"model":"m","prompt":"p","user":"\\uDFFF"}', True),  # anywhere in the body
        (b'{"model":"m","prompt":"\\ud83d\\ude00"}', False),  # an emoji as an ASCII client sends it
        (b'{"model":"m","prompt":"\\uD83D\\uDE00"}', False),
        (b'{"model":"m","prompt":"\\\\ud800"}', False),  # a backslash, then the text "ud800"
    ],
)
def test_unpaired_surrogates_are_refused_400(body: bytes, refused: bool) -> None:
    if not refused:
        parse_request_body(ApiKind.COMPLETIONS, body)
        return
    with pytest.raises(BadRequestError, match="unpaired UTF-16 surrogate") as caught:
        parse_request_body(ApiKind.COMPLETIONS, body)
    assert caught.value.status == 400


def test_inline_media_is_named_with_its_digest_when_asked_and_urls_are_left_to_the_engine() -> None:
    data = "data:image/png;base64," + "Q" * 1000
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "image_url", "image_url": {"url": data}, "uuid": "mine"},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "text", "text": "what are these"}]}]}
    raw = json.dumps(body).encode()
    plain = parse_request_body(ApiKind.CHAT_COMPLETIONS, raw)
    assert plain.media_named == 0
    assert upstream_body(plain, raw, "m", inject_usage=True).rewritten is False
    named = parse_request_body(ApiKind.CHAT_COMPLETIONS, raw, name_media=True)
    assert named.media_named == 2
    parts = named.document["messages"][0]["content"]
    assert parts[0]["uuid"] == "kvgate-" + hashlib.sha256(data.encode()).hexdigest()
    assert "uuid" not in parts[1]  # a URL's content may change behind it
    assert parts[2]["uuid"] == "mine"
    assert parts[3]["uuid"].startswith("kvgate-")
    assert f"<image_url {parts[0]['uuid']}>" in named.prompt
    upstream = upstream_body(named, raw, "m", inject_usage=True)
    assert upstream.rewritten is True
    sent = json.loads(upstream.data)["messages"][0]["content"]
    assert [p.get("uuid") for p in sent] == [parts[0]["uuid"], None, "mine", parts[3]["uuid"], None]
    again = parse_request_body(ApiKind.CHAT_COMPLETIONS, raw, name_media=True)
    assert again.document["messages"][0]["content"][0]["uuid"] == parts[0]["uuid"]
    completion = parse_request_body(ApiKind.COMPLETIONS, b'{"model": "m", "prompt": "x"}', name_media=True)
    assert completion.media_named == 0


def test_a_chats_template_inputs_reach_the_routing_view() -> None:
    """``prepare`` hands the picker what vLLM hands the chat template besides the messages."""
    from types import MappingProxyType

    from kvgate.extproc.decision import prepare
    from tests.extproc.fakes import FakePool

    tools = [{"type": "function", "function": {"name": "f"}}]
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools,
            "chat_template_kwargs": {"enable_thinking": False}, "temperature": 0}
    prepared = prepare(pool=FakePool("p", ("10.0.0.1:8000",)), api=ApiKind.CHAT_COMPLETIONS,
                       headers=MappingProxyType({}), body=json.dumps(body).encode(), subset=None,
                       inject_usage=False, request_id="r")
    kwargs = {"enable_thinking": False}
    assert prepared.request.prompt_options == {"tools": tools, "chat_template_kwargs": kwargs}
    plain = prepare(pool=FakePool("p", ("10.0.0.1:8000",)), api=ApiKind.CHAT_COMPLETIONS,
                    headers=MappingProxyType({}), body=b'{"model": "m", "messages": [{"role": "user"}]}',
                    subset=None, inject_usage=False, request_id="r")
    assert plain.request.prompt_options is None


@pytest.mark.parametrize(("prompt", "expected"), [
    ("a text", "a text"),
    ([1, 2, 3], (1, 2, 3)),
    (["one text"], "one text"),
    ([[4, 5]], (4, 5)),
    (["a", "b"], ()),
    ([[1], [2]], ()),
])
def test_a_completions_prompt_as_the_engine_receives_it(prompt: object, expected: object) -> None:
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    assert parse_request_body(ApiKind.COMPLETIONS, body).engine_prompt == expected
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    assert parse_request_body(ApiKind.CHAT_COMPLETIONS, chat).engine_prompt is None
