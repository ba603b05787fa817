"""Protobuf ⇄ lifecycle: ``ProcessingRequest`` → event, action → ``ProcessingResponse``.

The only module of the request path that touches Envoy's protobuf types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvgate.extproc import names
from kvgate.extproc.actions import (
    Action,
    AwaitHold,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    ExtendTimeout,
    HeaderEdit,
    Immediate,
    Phase,
    RunPrefill,
    Step,
    StreamBody,
)
from kvgate.extproc.events import (
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
_APPEND = base_pb2.HeaderValueOption.APPEND_IF_EXISTS_OR_ADD


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
    pairs: list[tuple[str, str]] = []
    append = pairs.append
    for header in header_map.headers:
        raw = header.raw_value
        append((header.key.lower(), raw.decode("utf-8", "replace") if raw else header.value))
    return tuple(pairs)


_BODY_MODES = MappingProxyType({
    (request.value, response.value): BodyModes(request, response)
    for request in BodyMode
    for response in BodyMode
})
"""Every (request, response) pair of Envoy's body mode numbers, decoded once."""


def _modes(message: pb.ProcessingRequest) -> BodyModes | None:
    if not message.HasField("protocol_config"):
        return None
    config = message.protocol_config
    request, response = config.request_body_mode, config.response_body_mode
    modes = _BODY_MODES.get((request, response))
    return modes if modes is not None else BodyModes(BodyMode(request), BodyMode(response))


def _subset_hint(message: pb.ProcessingRequest) -> tuple[str, ...] | None:
    namespaces = message.metadata_context.filter_metadata
    if names.SUBSET_NAMESPACE not in namespaces:
        return None
    fields = namespaces[names.SUBSET_NAMESPACE].fields
    key = next((k for k in names.SUBSET_KEYS if k in fields), None)
    if key is None:
        return None
    value = fields[key]
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
        for key in names.SERVED_KEYS:
            if key in fields:
                served: str = fields[key].string_value.split(",", 1)[0].strip()
                if served:
                    return served
    if EXT_PROC_ATTRIBUTES in message.attributes:
        fields = message.attributes[EXT_PROC_ATTRIBUTES].fields
        if UPSTREAM_ADDRESS in fields:
            address: str = fields[UPSTREAM_ADDRESS].string_value
            return address or None
    return None


def encode_replies(steps: Sequence[Step]) -> list[pb.ProcessingResponse]:
    """The replies of a lifecycle's steps that need nothing run (what tests and the offline benchmark
    feed: a ``RunPrefill`` needs the servicer, ``extproc.servicer``, and is refused here)."""
    out = []
    for step in steps:
        if isinstance(step, (RunPrefill, AwaitHold)):
            raise TypeError(f"a {type(step).__name__} step needs the servicer to run it")
        out.append(encode(step))
    return out


def encode(action: Action) -> pb.ProcessingResponse:
    """The reply for one action, built in place (a third of the CPU of nesting built messages, each
    of which protobuf copies into its parent: ``python -m kvgate.bench.datapath.offline --lean``)."""
    response = pb.ProcessingResponse()
    if isinstance(action, ContinueHeaders):
        headers = response.request_headers if action.phase is Phase.REQUEST else response.response_headers
        _fill_common(headers.response, action.edit, action.clear_route_cache)
        _set_metadata(response, action.metadata)
        if action.response_body_mode is not None:
            response.mode_override.response_body_mode = action.response_body_mode.value
        if action.skip_response or action.tunnel:  # Envoy replaces the whole mode: every field set
            mode = response.mode_override
            mode.request_header_mode = _SEND
            mode.request_body_mode = (BodyMode.NONE if action.tunnel else BodyMode.BUFFERED).value
            mode.response_header_mode = _SKIP
            mode.response_body_mode = BodyMode.NONE.value
            mode.request_trailer_mode = _SKIP
            mode.response_trailer_mode = _SKIP
        return response
    if isinstance(action, StreamBody):
        body = response.request_body if action.phase is Phase.REQUEST else response.response_body
        streamed = body.response.body_mutation.streamed_response
        streamed.SetInParent()
        streamed.body = action.data
        streamed.end_of_stream = action.end_of_stream
        return response
    if isinstance(action, ContinueBody):
        body = response.request_body if action.phase is Phase.REQUEST else response.response_body
        common = body.response
        _fill_common(common, action.edit, action.clear_route_cache)
        if action.body is not None:
            if action.body:
                common.body_mutation.body = action.body
            else:
                common.body_mutation.clear_body = True
        _set_metadata(response, action.metadata)
        return response
    if isinstance(action, ExtendTimeout):
        response.override_message_timeout.FromNanoseconds(round(action.seconds * 1e9))
        return response
    if isinstance(action, ContinueTrailers):
        trailers = response.request_trailers if action.phase is Phase.REQUEST else response.response_trailers
        trailers.SetInParent()
        return response
    return _immediate(action)


def _fill_common(common: pb.CommonResponse, edit: HeaderEdit, clear_route_cache: bool) -> None:
    common.SetInParent()
    if clear_route_cache:
        common.clear_route_cache = True
    if edit.set or edit.remove or edit.append:
        _fill_header_mutation(common.header_mutation, edit.set, edit.remove, edit.append)


def _fill_header_mutation(
    mutation: pb.HeaderMutation, set_headers: Headers, remove: tuple[str, ...], append: Headers = ()
) -> None:
    mutation.SetInParent()
    add = mutation.set_headers.add
    for key, value in set_headers:
        option = add()
        option.header.key = key
        option.header.raw_value = value.encode()
        option.append_action = _OVERWRITE
    for key, value in append:
        option = add()
        option.header.key = key
        option.header.raw_value = value.encode()
        option.append_action = _APPEND
    if remove:
        mutation.remove_headers.extend(remove)


def _set_metadata(response: pb.ProcessingResponse, metadata: Mapping[str, Mapping[str, str]]) -> None:
    if not metadata:
        return
    root = response.dynamic_metadata
    for namespace, values in metadata.items():
        inner = root.fields[namespace].struct_value
        for key, value in values.items():
            inner.fields[key].string_value = value


def _immediate(action: Immediate) -> pb.ProcessingResponse:
    response = pb.ProcessingResponse()
    immediate = response.immediate_response
    immediate.status.code = action.status
    _fill_header_mutation(immediate.headers, action.headers, ())
    immediate.body = action.body
    immediate.details = action.details
    return response
