"""extproc.codec.encode: each action's ProcessingResponse, field by field (built in place)."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2, text_format

from kvgate.extproc import codec
from kvgate.extproc.actions import (
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    HeaderEdit,
    Immediate,
    Phase,
    StreamBody,
)
from kvgate.extproc.events import BodyMode, RequestHeaders, ResponseHeaders


def expect(text: str) -> pb.ProcessingResponse:
    return text_format.Parse(text, pb.ProcessingResponse())


def test_a_plain_continue_still_names_its_phase() -> None:
    assert codec.encode(ContinueHeaders(Phase.REQUEST)) == expect("request_headers { response {} }")
    assert codec.encode(ContinueHeaders(Phase.RESPONSE)) == expect("response_headers { response {} }")
    assert codec.encode(ContinueBody(Phase.RESPONSE)) == expect("response_body { response {} }")
    assert codec.encode(ContinueTrailers(Phase.REQUEST)) == expect("request_trailers {}")
    assert codec.encode(ContinueTrailers(Phase.RESPONSE)) == expect("response_trailers {}")
    assert codec.encode(ContinueHeaders(Phase.REQUEST)).WhichOneof("response") == "request_headers"


def test_the_pick_on_a_buffered_body_sets_headers_route_cache_and_metadata() -> None:
    action = ContinueBody(
        Phase.REQUEST,
        edit=HeaderEdit(set=(("x-gateway-destination-endpoint", "10.0.0.1:8000"), ("x-model", "ü")),
                        remove=("x-forged",)),
        clear_route_cache=True,
        metadata={"envoy.lb": {"x-gateway-destination-endpoint": "10.0.0.1:8000,10.0.0.2:8000"}},
    )
    assert codec.encode(action) == expect(
        """
        request_body { response {
          header_mutation {
            set_headers { header { key: "x-gateway-destination-endpoint" raw_value: "10.0.0.1:8000" }
                          append_action: OVERWRITE_IF_EXISTS_OR_ADD }
            set_headers { header { key: "x-model" raw_value: "\\303\\274" }
                          append_action: OVERWRITE_IF_EXISTS_OR_ADD }
            remove_headers: "x-forged"
          }
          clear_route_cache: true
        } }
        dynamic_metadata { fields { key: "envoy.lb" value { struct_value { fields {
          key: "x-gateway-destination-endpoint"
          value { string_value: "10.0.0.1:8000,10.0.0.2:8000" } } } } } }
        """
    )


def test_body_replacement_and_clearing() -> None:
    assert codec.encode(ContinueBody(Phase.REQUEST, body=b"{}")) == expect(
        'request_body { response { body_mutation { body: "{}" } } }'
    )
    assert codec.encode(ContinueBody(Phase.RESPONSE, body=b"")) == expect(
        "response_body { response { body_mutation { clear_body: true } } }"
    )


def test_streamed_chunks_even_empty_ones_are_streamed_responses() -> None:
    assert codec.encode(StreamBody(Phase.REQUEST, b"", False)) == expect(
        "request_body { response { body_mutation { streamed_response {} } } }"
    )
    assert codec.encode(StreamBody(Phase.RESPONSE, b"data", True)) == expect(
        'response_body { response { body_mutation { streamed_response { body: "data" end_of_stream: true } '
        "} } }"
    )


def test_mode_overrides() -> None:
    on = codec.encode(ContinueHeaders(Phase.RESPONSE, response_body_mode=BodyMode.STREAMED))
    assert on.mode_override == text_format.Parse("response_body_mode: STREAMED", on.mode_override.__class__())
    skip = codec.encode(ContinueHeaders(Phase.REQUEST, skip_response=True))
    assert skip.mode_override == text_format.Parse(
        "request_header_mode: SEND response_header_mode: SKIP request_body_mode: BUFFERED "
        "response_body_mode: NONE request_trailer_mode: SKIP response_trailer_mode: SKIP",
        skip.mode_override.__class__(),
    )


def test_an_immediate_response() -> None:
    action = Immediate(429, b'{"error":{}}', (("content-type", "application/json"),), "tenant_limited")
    assert codec.encode(action) == expect(
        """
        immediate_response {
          status { code: TooManyRequests }
          headers { set_headers { header { key: "content-type" raw_value: "application/json" }
                                  append_action: OVERWRITE_IF_EXISTS_OR_ADD } }
          body: "{\\"error\\":{}}"
          details: "tenant_limited"
        }
        """
    )


def test_appended_headers_keep_those_of_the_same_name() -> None:
    """A new session's Set-Cookie goes beside any the model server set (append, not overwrite)."""
    edit = HeaderEdit(set=(("x-a", "1"),), append=(("set-cookie", "s=1; Path=/"),))
    message = codec.encode(ContinueHeaders(Phase.RESPONSE, edit))
    options = message.response_headers.response.header_mutation.set_headers
    actions = {option.header.key: option.append_action for option in options}
    assert actions == {"x-a": base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                       "set-cookie": base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD}


def test_the_subset_hint_and_served_endpoint_under_llm_ds_newer_keys() -> None:
    """llm-d's router renamed the protocol's metadata keys (x-llm-d-router-destination-endpoint-*),
    keeping the Inference Extension's as aliases; a data plane speaking the new names is read the same."""
    meta = base_pb2.Metadata()
    hint = struct_pb2.Struct()
    hint.fields["x-llm-d-router-destination-endpoint-subset"].list_value.extend(["10.0.0.1:8000"])
    hint.fields["x-gateway-destination-endpoint-subset"].list_value.extend(["10.0.0.9:8000"])
    meta.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    event = codec.decode(pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap()), metadata_context=meta))
    assert isinstance(event, RequestHeaders)
    assert event.subset_hint == ("10.0.0.1:8000",)  # the newer name wins
    lb = struct_pb2.Struct()
    lb.fields["x-llm-d-router-destination-endpoint-served"].string_value = "10.0.0.2:8000"
    served_meta = base_pb2.Metadata()
    served_meta.filter_metadata["envoy.lb"].CopyFrom(lb)
    served = codec.decode(pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap()), metadata_context=served_meta))
    assert isinstance(served, ResponseHeaders)
    assert served.served_endpoint == "10.0.0.2:8000"
