"""``Scheduler.on_first_token``: called once, at the first response body bytes, with the served endpoint."""

from __future__ import annotations

import json

from kvgate.extproc.events import StreamClosed
from tests.extproc.fakes import (
    completion,
    feed,
    make_machine,
    make_pool,
    request_body,
    request_headers,
    response_body,
    response_headers,
)


def test_first_token_reported_once_at_the_first_body_bytes_to_the_served_endpoint() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    feed(machine, [request_headers(), request_body(completion(), eos=True)])
    feed(machine, [response_headers(served="10.0.0.2:8000"), response_body(b"")])
    assert pool.scheduler.first_tokens == []  # headers and an empty chunk are not a token
    feed(machine, [response_body(b'{"choices": '), response_body(b"[]}"), response_body(b"", eos=True)])
    assert pool.scheduler.first_tokens == ["10.0.0.2:8000"]
    machine.handle(StreamClosed())
    assert pool.scheduler.first_tokens == ["10.0.0.2:8000"]
    assert pool.scheduler.count("finished") == 1


def test_no_first_token_when_the_response_never_sends_a_body() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    feed(machine, [request_headers(), request_body(completion(), eos=True), response_headers(eos=True)])
    machine.handle(StreamClosed())
    assert pool.scheduler.first_tokens == []
    assert pool.scheduler.count("finished") == 1


def _event(kind: str, **fields: object) -> bytes:
    """One event of a Responses API stream as vLLM writes it (``event:`` line, compact JSON)."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, separators=(',', ':'))}\n\n".encode()


def test_a_responses_stream_has_its_first_token_at_its_first_output_event_not_its_preamble() -> None:
    # vLLM sends response.created and response.in_progress as the request starts, before the
    # prompt's prefill: read as the first token, a long prompt's prefill counted done at once
    pool = make_pool()
    machine = make_machine(pool)
    body = json.dumps({"model": "m", "input": "hello", "stream": True}).encode()
    feed(machine, [request_headers("/v1/responses"), request_body(body, eos=True)])
    envelope = {"id": "resp_1", "object": "response", "status": "in_progress", "output": [],
                "tools": [{"type": "function", "name": "f"}], "text": {"format": {"type": "text"}}}
    feed(machine, [response_headers(content_type="text/event-stream"),
                   response_body(_event("response.created", sequence_number=0, response=envelope))])
    feed(machine, [response_body(_event("response.in_progress", sequence_number=1, response=envelope))])
    assert pool.scheduler.first_tokens == []
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    feed(machine, [response_body(_event("response.output_item.added", sequence_number=2, output_index=0,
                                        item=item))])
    assert pool.scheduler.first_tokens == ["10.0.0.1:8000"]
    feed(machine, [response_body(_event("response.output_text.delta", sequence_number=3, delta='"type":"x"'),
                                 eos=True)])
    assert pool.scheduler.first_tokens == ["10.0.0.1:8000"]


def test_a_chat_stream_has_its_first_token_at_its_first_bytes() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    feed(machine, [request_headers("/v1/chat/completions"), request_body(body.encode(), eos=True)])
    feed(machine, [response_headers(content_type="text/event-stream"),
                   response_body(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')])
    assert pool.scheduler.first_tokens == ["10.0.0.1:8000"]
