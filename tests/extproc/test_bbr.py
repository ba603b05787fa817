"""The body-based router: sans-IO (events in, actions out) and over a loopback gRPC stream."""

from __future__ import annotations

import json

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from kvgate.extproc import codec
from kvgate.extproc.actions import (
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    HeaderEdit,
    Immediate,
    Phase,
)
from kvgate.extproc.bbr import BBR_ROLE, ROLE_METADATA_KEY, BodyBasedRouter, model_of
from kvgate.extproc.events import (
    RequestBodyChunk,
    RequestHeaders,
    RequestTrailers,
    ResponseBodyChunk,
    ResponseHeaders,
    StreamClosed,
)
from kvgate.extproc.server import ExtProcServer
from kvgate.gateway.controlplane.translate import names as translate_names
from tests.extproc.fakes import FakeDirectory, completion, make_pool, request_body, request_headers

BUFFERED = 2


def _set_model(model: str) -> ContinueBody:
    return ContinueBody(
        Phase.REQUEST, edit=HeaderEdit(set=(("x-gateway-model-name", model),)), clear_route_cache=True
    )


def test_role_names_match_the_translator() -> None:
    assert ROLE_METADATA_KEY == translate_names.ROLE_METADATA_KEY
    assert BBR_ROLE == translate_names.BBR_ROLE


def test_headers_answered_at_once_then_model_set_on_body_end() -> None:
    router = BodyBasedRouter()
    assert router.handle(RequestHeaders((("x-gateway-model-name", "forged"),))) == (
        ContinueHeaders(Phase.REQUEST),
    )
    body = json.dumps({"model": "Model-A", "prompt": "hi"}).encode()
    assert router.handle(RequestBodyChunk(body, end_of_stream=True)) == (_set_model("Model-A"),)
    assert router.model == "Model-A"
    assert router.handle(StreamClosed()) == ()


@pytest.mark.parametrize("headers", [
    (("content-type", "application/grpc"),), (("content-type", "application/grpc+proto"),),
    (("content-type", "application/grpc-web"),), (("upgrade", "websocket"), ("connection", "upgrade")),
])
def test_a_streamed_body_is_turned_off_at_its_headers(headers: tuple[tuple[str, str], ...]) -> None:
    """A gRPC call or a WebSocket: nothing to read, and buffering would hold a stream that waits
    for answers: the reply to its headers turns its body off (``tunnel``: a ``mode_override``)."""
    router = BodyBasedRouter()
    (reply,) = router.handle(RequestHeaders(((":path", "/pkg.Svc/Call"), *headers)))
    assert reply == ContinueHeaders(Phase.REQUEST, tunnel=True)
    encoded = codec.encode(reply)
    assert encoded.mode_override.request_body_mode == 0  # NONE


def test_body_in_several_chunks_is_parsed_whole() -> None:
    router = BodyBasedRouter()
    router.handle(RequestHeaders(()))
    body = json.dumps({"prompt": "x" * 100, "model": "b"}).encode()
    assert router.handle(RequestBodyChunk(body[:40])) == (ContinueBody(Phase.REQUEST),)
    assert router.handle(RequestBodyChunk(body[40:])) == (ContinueBody(Phase.REQUEST),)
    assert router.handle(RequestBodyChunk(b"", end_of_stream=True)) == (_set_model("b"),)


def test_bodyless_request_gets_only_the_headers_answer() -> None:
    router = BodyBasedRouter()
    assert router.handle(RequestHeaders((), end_of_stream=True)) == (ContinueHeaders(Phase.REQUEST),)
    assert router.handle(StreamClosed(cancelled=False)) == ()
    assert router.model is None


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1, 2]", b'{"prompt": "no model"}', b'{"model": ""}', b'{"model": 7}', b"\xff\xfe"],
)
def test_no_usable_model_leaves_the_request_alone(body: bytes) -> None:
    router = BodyBasedRouter()
    router.handle(RequestHeaders(()))
    assert router.handle(RequestBodyChunk(body, end_of_stream=True)) == (ContinueBody(Phase.REQUEST),)
    assert model_of(body) is None


def test_body_over_the_limit_is_not_parsed() -> None:
    router = BodyBasedRouter(max_body_bytes=10)
    router.handle(RequestHeaders(()))
    router.handle(RequestBodyChunk(b'{"model": '))
    assert router.handle(RequestBodyChunk(b'"a"}', end_of_stream=True)) == (ContinueBody(Phase.REQUEST),)


def test_trailers_and_unexpected_response_messages_pass_through() -> None:
    router = BodyBasedRouter()
    assert router.handle(RequestTrailers()) == (ContinueTrailers(Phase.REQUEST),)
    assert router.handle(ResponseHeaders(())) == (ContinueHeaders(Phase.RESPONSE),)
    assert router.handle(ResponseBodyChunk(b"x", end_of_stream=True)) == (ContinueBody(Phase.RESPONSE),)


def test_encoded_body_response_sets_header_and_clears_route_cache_without_metadata() -> None:
    response = codec.encode(_set_model("m"))
    common = response.request_body.response
    assert common.clear_route_cache
    [option] = common.header_mutation.set_headers
    assert (option.header.key, option.header.raw_value) == ("x-gateway-model-name", b"m")
    assert not response.HasField("dynamic_metadata")


async def test_servicer_dispatches_bbr_streams_and_never_picks() -> None:
    pool = make_pool("10.0.0.1:8000", name="llama")
    server = ExtProcServer(FakeDirectory({"llama": pool}, default="llama"), address="127.0.0.1:0")
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            call = stub.Process(metadata=((ROLE_METADATA_KEY, BBR_ROLE),))
            await call.write(request_headers(mode=BUFFERED))
            first: pb.ProcessingResponse = await call.read()
            assert first.WhichOneof("response") == "request_headers"
            assert not first.request_headers.response.HasField("header_mutation")
            await call.write(request_body(completion(model="model-b"), eos=True))
            second: pb.ProcessingResponse = await call.read()
            mutation = second.request_body.response.header_mutation
            assert {h.header.key: h.header.raw_value for h in mutation.set_headers} == {
                "x-gateway-model-name": b"model-b"
            }
            assert second.request_body.response.clear_route_cache
            assert not second.HasField("dynamic_metadata")
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
        assert pool.scheduler.calls == []
    finally:
        await server.stop(0)


def test_a_request_with_no_room_for_the_model_header_is_answered_431() -> None:
    router = BodyBasedRouter()
    [reply] = router.handle(RequestHeaders(tuple((f"x-{i}", "v") for i in range(120))))
    assert isinstance(reply, Immediate)
    assert reply.status == 431


@pytest.mark.parametrize(("path", "shape"),
                         [("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai")])
def test_a_refused_model_name_is_said_in_the_shape_of_the_requests_api(path: str, shape: str) -> None:
    router = BodyBasedRouter()
    router.handle(RequestHeaders(((":path", path),)))
    (reply,) = router.handle(RequestBodyChunk(b'{"model": "a\\nb"}', end_of_stream=True))
    assert isinstance(reply, Immediate)
    assert reply.status == 400
    error = json.loads(reply.body)
    assert (error.get("type") == "error") is (shape == "anthropic")
    assert error["error"]["message"]
