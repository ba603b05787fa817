"""The body-based router: a sans-IO lifecycle for ext_proc streams of the ``kvgate.bbr`` filter.

Envoy runs a second ext_proc filter before the endpoint picker (its gRPC stream carries the initial
metadata ``x-kvgate-role: bbr``), with request headers SEND, the request body BUFFERED and nothing of
the response. This machine answers the request headers at once (continue), and on the body's end of
stream reads the JSON ``model`` and sets ``x-gateway-model-name`` (overwriting a client's copy) with
``clear_route_cache``, so Envoy re-matches the route on the model. It never picks an endpoint and
never sends dynamic metadata; a body without a usable ``model`` passes unchanged, and a ``model`` the
gateway refuses (``extproc.model_names``: control characters, 100 KB names) is answered 400 here,
before it reaches a header.

A request whose body is a stream with no JSON to read, a gRPC call (``content-type:
application/grpc...``) or a WebSocket upgrade (a realtime session names its model in its query), is
let through at its headers with the body turned off for it (``mode_override``: the filter has
``allow_mode_override``): buffered, a bidirectional stream or a session would wait for an end that
comes only after the answers it waits for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kvgate.extproc import names
from kvgate.extproc.actions import (
    Action,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    HeaderEdit,
    Immediate,
    Phase,
)
from kvgate.extproc.errors import immediate_response
from kvgate.extproc.events import (
    Event,
    RequestBodyChunk,
    RequestHeaders,
    RequestTrailers,
    ResponseBodyChunk,
    ResponseHeaders,
    ResponseTrailers,
    StreamClosed,
)
from kvgate.extproc.form_request import form_boundary, parse_form
from kvgate.extproc.model_names import check_model_name
from kvgate.extproc.openai_request import api_kind
from kvgate.extproc.request_headers import check_header_limits
from kvgate.policies.errors import BadRequestError, KvgateError
from kvgate.policies.types import ApiKind

ROLE_METADATA_KEY = "x-kvgate-role"
"""gRPC initial metadata naming the role of an ext_proc stream (set by the routes that
``gateway.controlplane.translate`` writes)."""
BBR_ROLE = "bbr"
"""The role value of the body-based router's streams."""

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


def model_of(body: bytes, content_type: str | None = None) -> str | None:
    """The top-level string ``model`` of a JSON object body, or a form's ``model`` field
    (``extproc.form_request``: the audio APIs), else None (never raises)."""
    if not body:
        return None
    try:
        boundary = form_boundary(content_type)
        if boundary is not None:
            return parse_form(boundary, body).fields.get("model") or None
    except BadRequestError:
        return None  # the picker answers it
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    model = document.get("model")
    return model if isinstance(model, str) and model else None


class BodyBasedRouter:
    """One request's body-based-routing conversation. One per gRPC stream; not thread-safe."""

    def __init__(self, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self._max_body_bytes = max_body_bytes
        self._chunks: list[bytes] = []
        self._size = 0
        self._overflowed = False
        self.model: str | None = None
        """The model found in the body (after the body's end of stream), for tests and logs."""
        self._api = ApiKind.OTHER
        """The request's API, from its path: its refusals in that API's error shape."""
        self._content_type: str | None = None

    def handle(self, event: Event) -> Sequence[Action]:
        if isinstance(event, RequestHeaders):
            headers = dict(event.headers)
            self._api = api_kind(headers.get(":path", ""))
            self._content_type = headers.get("content-type")
            try:
                check_header_limits(event.headers)  # no room for the model header: 431, not 503
            except KvgateError as error:
                return (immediate_response(error, self._api),)
            if (self._content_type or "").startswith("application/grpc") or "upgrade" in headers:
                return (ContinueHeaders(Phase.REQUEST, tunnel=True),)  # (module docstring)
            return (ContinueHeaders(Phase.REQUEST),)
        if isinstance(event, RequestBodyChunk):
            return (self._on_body(event),)
        if isinstance(event, RequestTrailers):
            return (ContinueTrailers(Phase.REQUEST),)
        # The filter skips the response; answer anything that comes anyway without touching it.
        if isinstance(event, ResponseHeaders):
            return (ContinueHeaders(Phase.RESPONSE),)
        if isinstance(event, ResponseBodyChunk):
            return (ContinueBody(Phase.RESPONSE),)
        if isinstance(event, ResponseTrailers):
            return (ContinueTrailers(Phase.RESPONSE),)
        assert isinstance(event, StreamClosed)
        return ()

    def _on_body(self, chunk: RequestBodyChunk) -> ContinueBody | Immediate:
        if not self._overflowed:
            self._size += len(chunk.data)
            if self._size > self._max_body_bytes:
                self._overflowed = True
                self._chunks.clear()
            else:
                self._chunks.append(chunk.data)
        if not chunk.end_of_stream:
            return ContinueBody(Phase.REQUEST)
        body = b"".join(self._chunks)
        self._chunks.clear()
        self.model = None if self._overflowed else model_of(body, self._content_type)
        if self.model is None:
            return ContinueBody(Phase.REQUEST)
        try:
            check_model_name(self.model)
        except KvgateError as error:
            self.model = None
            return immediate_response(error, self._api)
        edit = HeaderEdit(set=((names.MODEL_NAME_HEADER, self.model),))
        return ContinueBody(Phase.REQUEST, edit=edit, clear_route_cache=True)
