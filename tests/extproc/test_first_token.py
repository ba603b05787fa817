"""``Scheduler.on_first_token``: called once, at the first response body bytes, with the served endpoint."""

from __future__ import annotations

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
