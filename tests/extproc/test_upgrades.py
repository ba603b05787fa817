"""WebSocket sessions (vLLM's realtime API) through the lifecycle: picked on their headers, then a
tunnel that sends nothing more to the picker; what is refused, and why. Real Envoy carries a session
in tests/e2e/test_up_realtime.py."""

from __future__ import annotations

import json

import pytest

from kvgate.extproc.events import StreamClosed
from kvgate.extproc.lifecycle import State
from kvgate.extproc.upgrades import realtime_model, upgrade_of
from tests.extproc.fakes import (
    BUFFERED,
    feed,
    kinds,
    make_machine,
    make_pool,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
)

UPGRADE = (("upgrade", "websocket"), ("connection", "Upgrade"), ("sec-websocket-version", "13"))
NONE_MODE = 0  # ProcessingMode.BodySendMode NONE


def test_a_realtime_session_is_picked_on_its_headers_then_tunnelled() -> None:
    pool = make_pool(served_models=frozenset({"whisper"}))
    machine = make_machine(pool)
    out = feed(machine, [request_headers("/v1/realtime?model=whisper", method="GET", extra=UPGRADE,
                                         mode=BUFFERED)])
    assert kinds(out) == ["request_headers"]
    assert set_headers(out[0])["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
    mode = out[0].mode_override
    assert (mode.request_body_mode, mode.response_body_mode) == (NONE_MODE, NONE_MODE)
    assert mode.response_header_mode == 2  # SKIP: nothing of the session comes back to the picker
    request = pool.scheduler.seen[0][0]
    assert (request.model, request.target_model) == ("whisper", "whisper")
    assert machine.state is State.TUNNEL
    machine.handle(StreamClosed(cancelled=True))  # Envoy is done with the stream: not a failure
    assert machine.state.value == State.DONE.value
    assert ("finished", ("10.0.0.1:8000", True)) in pool.scheduler.calls


def test_frames_a_gateway_sends_anyway_pass_back_unchanged() -> None:
    """A gateway that ignores ``mode_override`` (the Inference Extension's full-duplex configuration)
    sends the session's frames as bodies: each goes back as it came, the session unbroken."""
    pool = make_pool()
    machine = make_machine(pool)
    feed(machine, [request_headers("/v1/realtime", method="GET", extra=UPGRADE)])  # (full duplex)
    out = feed(machine, [request_body(b"\x81\x05hello"), response_headers(status=101),
                         response_body(b"\x81\x02ok"), request_body(b"", eos=True)])
    assert kinds(out) == ["request_body", "response_headers", "response_body", "request_body"]
    echoed = [r.request_body.response.body_mutation.streamed_response for r in (out[0], out[3])]
    assert [(c.body, c.end_of_stream) for c in echoed] == [(b"\x81\x05hello", False), (b"", True)]
    assert out[2].response_body.response.body_mutation.streamed_response.body == b"\x81\x02ok"
    machine.handle(StreamClosed())
    assert ("finished", ("10.0.0.1:8000", True)) in pool.scheduler.calls


def test_a_session_without_a_model_goes_to_any_endpoint() -> None:
    pool = make_pool(served_models=frozenset({"whisper"}))
    out = feed(make_machine(pool), [request_headers("/v1/realtime", method="GET", extra=UPGRADE)])
    assert "x-gateway-destination-endpoint" in set_headers(out[0])
    assert pool.scheduler.seen[0][0].model == ""


@pytest.mark.parametrize(("path", "method", "extra", "status", "text"), [
    ("/v1/realtime?model=nope", "GET", UPGRADE, 404, "nope"),
    ("/v1/completions", "GET", UPGRADE, 405, "this path takes POST"),
    ("/v1/chat/completions", "POST", UPGRADE, 400, "served on /v1/realtime only"),
    ("/v1/realtime", "GET", (("upgrade", "h2c"),), 400, "is not served"),
    ("/v1/realtime", "GET", (), 400, "opens a WebSocket session"),
])
def test_what_is_refused_gets_a_json_error(path: str, method: str, extra: tuple[tuple[str, str], ...],
                                           status: int, text: str) -> None:
    pool = make_pool(served_models=frozenset({"whisper"}))
    out = feed(make_machine(pool), [request_headers(path, method=method, extra=extra, eos=not extra)])
    assert kinds(out) == ["immediate_response"]
    assert out[0].immediate_response.status.code == status
    assert text in json.loads(out[0].immediate_response.body)["error"]["message"]
    assert pool.scheduler.seen == []


def test_reading_the_upgrade_and_the_model() -> None:
    assert upgrade_of((("upgrade", " WebSocket "),)) == "websocket"
    assert upgrade_of(((":path", "/v1/realtime"),)) is None
    assert realtime_model("/v1/realtime?intent=transcription&model=a%2Fb") == "a/b"
    assert realtime_model("/v1/realtime") == ""
