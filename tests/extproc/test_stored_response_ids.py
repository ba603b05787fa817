"""A Responses API request's ids for the engine's response store: the picker gives the request the
id its response will be stored under (vLLM's ``request_id``, added to the body when the client sent
none: spliced in, the rest of the body byte for byte), and tells the scheduler which stored response
a request continues."""

from __future__ import annotations

import json

import pytest

from tests.extproc.fakes import (
    BUFFERED,
    feed,
    make_machine,
    make_pool,
    request_body,
    request_headers,
    set_headers,
)


def sent(body: dict[str, object]) -> tuple[bytes | None, object]:
    """(the body sent upstream where it changed, the request the scheduler saw)."""
    pool = make_pool()
    machine = make_machine(pool)
    raw = json.dumps(body).encode()
    out = feed(machine, [request_headers("/v1/responses", mode=BUFFERED), request_body(raw, eos=True)])
    response = out[-1].request_body.response
    mutated = response.body_mutation.body if response.HasField("body_mutation") else None
    if mutated is not None:
        assert set_headers(out[-1])["content-length"] == str(len(mutated))
    return mutated, pool.scheduler.seen[0][0]


def test_a_request_without_an_id_is_given_one_spliced_into_its_body() -> None:
    body: dict[str, object] = {"model": "m", "input": "hello " * 100, "previous_response_id": "resp_0"}
    mutated, request = sent(body)
    assert mutated is not None
    document = json.loads(mutated)
    assert document["request_id"].startswith("resp_")
    assert request.response_id == document["request_id"]  # type: ignore[attr-defined]
    assert request.previous_response_id == "resp_0"  # type: ignore[attr-defined]
    assert {k: v for k, v in document.items() if k != "request_id"} == body
    assert mutated.endswith(json.dumps(body).encode()[1:])  # the client's bytes after it, untouched


@pytest.mark.parametrize(("body", "response_id"), [
    ({"model": "m", "input": "hi", "request_id": "resp_mine"}, "resp_mine"),  # the client named it
    ({"model": "m", "input": "hi", "store": False}, None),  # not to be stored: nothing to remember
    ({"model": "m", "input": "hi", "store": "false"}, None),  # the engine's pydantic reads it so too
    ({"model": "m", "input": "hi", "request_id": 5}, None),  # not a name: the engine answers it, as sent
])
def test_a_request_that_names_its_id_or_is_not_stored_is_sent_as_it_came(
    body: dict[str, object], response_id: str | None
) -> None:
    mutated, request = sent(body)
    assert mutated is None
    assert request.response_id == response_id  # type: ignore[attr-defined]


def test_other_apis_carry_no_response_ids() -> None:
    pool = make_pool()
    machine = make_machine(pool)
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "request_id": "x"})
    feed(machine, [request_headers("/v1/chat/completions", mode=BUFFERED),
                   request_body(raw.encode(), eos=True)])
    request = pool.scheduler.seen[0][0]
    assert request.response_id is None
    assert request.previous_response_id is None


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/responses/resp_7"),
                                              ("POST", "/v1/responses/resp_7/cancel")])
def test_reading_or_cancelling_a_stored_response_names_it_for_the_pick(method: str, path: str) -> None:
    pool = make_pool()
    machine = make_machine(pool)
    out = feed(machine, [request_headers(path, method=method, eos=True)])
    assert set_headers(out[0])["x-gateway-destination-endpoint"]
    request = pool.scheduler.seen[0][0]
    assert request.previous_response_id == "resp_7"
    assert request.response_id is None
