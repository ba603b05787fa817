"""Protobuf ⇄ lifecycle: ``ProcessingRequest`` → event, action → ``ProcessingResponse``.

The only module of the request path that touches Envoy's protobuf types.
"""

from __future__ import annotations

from collections.abc import Mapping

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from extproc import names
from extproc.actions import (
    Action,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    HeaderEdit,
    Immediate,
    Phase,
    StreamBody,
)
from extproc.events import (
    BodyMode,
    BodyModes,
    Event,
    Headers,
    RequestBodyChunk,
    RequestHeaders,
    RequestTrailers,
    ResponseBodyChunk,
    ResponseHeaders,
    ResponseTrailers,
)

_SEND = 1  # ProcessingMode.HeaderSendMode.SEND
_SKIP = 2  # ProcessingMode.HeaderSendMode.SKIP

EXT_PROC_ATTRIBUTES = "envoy.filters.http.ext_proc"
UPSTREAM_ADDRESS = "upstream.address"
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


class UnknownMessage(ValueError):
    """A ProcessingRequest with no request/response part set."""


def decode(message: pb.ProcessingRequest) -> Event:
    kind = message.WhichOneof("request")
    if kind == "request_headers":
        part = message.request_headers
        return RequestHeaders(
            headers=_headers(part.headers),
            end_of_stream=part.end_of_stream,
            subset_hint=_subset_hint(message),
            modes=_modes(message),
        )
    if kind == "request_body":
        return RequestBodyChunk(
            data=message.request_body.body,
            end_of_stream=message.request_body.end_of_stream,
            subset_hint=_subset_hint(message),
        )
    if kind == "request_trailers":
        return RequestTrailers(_headers(message.request_trailers.trailers))
    if kind == "response_headers":
        part = message.response_headers
        return ResponseHeaders(
            headers=_headers(part.headers), end_of_stream=part.end_of_stream, served_endpoint=_served(message)
        )
    if kind == "response_body":
        return ResponseBodyChunk(
            data=message.response_body.body,
            end_of_stream=message.response_body.end_of_stream,
            served_endpoint=_served(message),
        )
    if kind == "response_trailers":
        return ResponseTrailers(_headers(message.response_trailers.trailers))
    raise UnknownMessage(f"ProcessingRequest without a known part: {kind}")


def _headers(header_map: base_pb2.HeaderMap) -> Headers:
    return tuple(
        (h.key.lower(), h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
        for h in header_map.headers
    )


def _modes(message: pb.ProcessingRequest) -> BodyModes | None:
    if not message.HasField("protocol_config"):
        return None
    config = message.protocol_config
    return BodyModes(BodyMode(config.request_body_mode), BodyMode(config.response_body_mode))


def _subset_hint(message: pb.ProcessingRequest) -> tuple[str, ...] | None:
    namespaces = message.metadata_context.filter_metadata
    if names.SUBSET_NAMESPACE not in namespaces:
        return None
    fields = namespaces[names.SUBSET_NAMESPACE].fields
    if names.SUBSET_KEY not in fields:
        return None
    value = fields[names.SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        values = value.list_value.values
        items = [v.string_value.strip() for v in values if v.WhichOneof("kind") == "string_value"]
    elif kind == "string_value":
        items = [part.strip() for part in value.string_value.split(",")]
    else:
        return ()
    return tuple(item for item in items if item)


def _served(message: pb.ProcessingRequest) -> str | None:
    """The endpoint that served: ``envoy.lb`` / served-key metadata, else the ``upstream.address``
    response attribute (Envoy's ``response_attributes: ["upstream.address"]``)."""
    namespaces = message.metadata_context.filter_metadata
    if names.LB_NAMESPACE in namespaces:
        fields = namespaces[names.LB_NAMESPACE].fields
        if names.SERVED_KEY in fields:
            served: str = fields[names.SERVED_KEY].string_value.split(",", 1)[0].strip()
            if served:
                return served
    if EXT_PROC_ATTRIBUTES in message.attributes:
        fields = message.attributes[EXT_PROC_ATTRIBUTES].fields
        if UPSTREAM_ADDRESS in fields:
            address: str = fields[UPSTREAM_ADDRESS].string_value
            return address or None
    return None


def encode(action: Action) -> pb.ProcessingResponse:
    if isinstance(action, ContinueHeaders):
        common = _common(action.edit, action.clear_route_cache)
        response = _phase_response(action.phase, headers=pb.HeadersResponse(response=common))
        _set_metadata(response, action.metadata)
        if action.response_body_mode is not None:
            response.mode_override.response_body_mode = action.response_body_mode.value
        if action.skip_response:  # Envoy replaces the whole mode: every field must be set
            mode = response.mode_override
            mode.request_header_mode = _SEND
            mode.request_body_mode = BodyMode.BUFFERED.value
            mode.response_header_mode = _SKIP
            mode.response_body_mode = BodyMode.NONE.value
            mode.request_trailer_mode = _SKIP
            mode.response_trailer_mode = _SKIP
        return response
    if isinstance(action, StreamBody):
        mutation = pb.BodyMutation(
            streamed_response=pb.StreamedBodyResponse(body=action.data, end_of_stream=action.end_of_stream)
        )
        body = pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
        return _phase_response(action.phase, body=body)
    if isinstance(action, ContinueBody):
        common = _common(action.edit, action.clear_route_cache)
        if action.body is not None:
            if action.body:
                common.body_mutation.body = action.body
            else:
                common.body_mutation.clear_body = True
        response = _phase_response(action.phase, body=pb.BodyResponse(response=common))
        _set_metadata(response, action.metadata)
        return response
    if isinstance(action, ContinueTrailers):
        return _phase_response(action.phase, trailers=pb.TrailersResponse())
    return _immediate(action)


def _phase_response(
    phase: Phase,
    *,
    headers: pb.HeadersResponse | None = None,
    body: pb.BodyResponse | None = None,
    trailers: pb.TrailersResponse | None = None,
) -> pb.ProcessingResponse:
    request = phase is Phase.REQUEST
    if headers is not None:
        return pb.ProcessingResponse(request_headers=headers) if request else pb.ProcessingResponse(
            response_headers=headers
        )
    if body is not None:
        if request:
            return pb.ProcessingResponse(request_body=body)
        return pb.ProcessingResponse(response_body=body)
    return pb.ProcessingResponse(request_trailers=trailers) if request else pb.ProcessingResponse(
        response_trailers=trailers
    )


def _common(edit: HeaderEdit, clear_route_cache: bool) -> pb.CommonResponse:
    common = pb.CommonResponse(clear_route_cache=clear_route_cache)
    if edit.set or edit.remove:
        common.header_mutation.CopyFrom(_header_mutation(edit.set, edit.remove))
    return common


def _header_mutation(set_headers: Headers, remove: tuple[str, ...]) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE
            )
            for key, value in set_headers
        ],
        remove_headers=list(remove),
    )


def _set_metadata(response: pb.ProcessingResponse, metadata: Mapping[str, Mapping[str, str]]) -> None:
    if not metadata:
        return
    root = struct_pb2.Struct()
    for namespace, values in metadata.items():
        inner = root.fields[namespace].struct_value
        for key, value in values.items():
            inner.fields[key].string_value = value
    response.dynamic_metadata.CopyFrom(root)


def _immediate(action: Immediate) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=action.status),
            headers=_header_mutation(action.headers, ()),
            body=action.body,
            details=action.details,
        )
    )
