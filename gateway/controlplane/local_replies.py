"""Envoy's own replies in OpenAI's error format: HCM ``local_reply_config`` mappers (first match wins).

What Envoy answers by itself otherwise reaches a client as plain text or an empty body, which
OpenAI's SDKs cannot read:

- the client's own mistakes Envoy catches before the picker sees them: a body over the listener's
  buffer limit (413), too many or too large headers (431), a request not received in time (408), a
  request the HTTP codec cannot read (400);
- a request no route matches: 404 ``model_not_found`` in vLLM's words when it names a model (the
  body-based router copied it into ``x-gateway-model-name``: no route serves that model), else 404
  ``route_not_found``;
- a failed ext_proc stream (a FailClose pool with the picker down or timing out), recognised by its
  response code details (``ext_proc_error_…``, set by Envoy): 503 ``endpoint_picker_unavailable``;
- Envoy's upstream failures, which carry a response flag (upstream connect failure ``UF``, no healthy
  upstream ``UH``, upstream reset or timeout, overflow, ...): Envoy's text as the message and its
  response-code details as the code.

The picker's own ImmediateResponses carry their JSON already, no response flag, and code details
that start with ``kvgate_`` (``extproc.errors``): no mapper touches them.

A request to Anthropic's Messages API (a path ending in ``/v1/messages``) gets each of these in
Anthropic's shape instead (``{"type": "error", "error": {"type", "message"}}``), as the picker's
own errors on that API are: each mapper has a twin in front of it for those paths
(:func:`with_anthropic_twins`).
"""

from __future__ import annotations

from typing import Any

from kvgate.extproc.names import MODEL_NAME_HEADER

JsonDict = dict[str, Any]

_CEL_FILTER_TYPE = "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter"


def cel_filter(expression: str) -> JsonDict:
    return {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {"@type": _CEL_FILTER_TYPE, "expression": expression},
        }
    }


def _error(message: str, error_type: str, code: str) -> JsonDict:
    return {"error": {"message": message, "type": error_type, "code": code}}


def _client_mistake(status: int, message: str, code: str) -> JsonDict:
    """Envoy's own reply of ``status`` (not the picker's) as an ``invalid_request_error``."""
    return {
        "filter": cel_filter(f"response.code == {status} && !response.code_details.startsWith('kvgate_')"),
        "body_format_override": {"json_format": _error(message, "invalid_request_error", code)},
    }


ANTHROPIC_PATH = "request.url_path.endsWith('/v1/messages')"
"""Anthropic's Messages API, as vLLM serves it (after any prefix a route matches). A new filter
per use: protobuf's ``json_format.ParseDict`` takes an ``Any``'s ``@type`` out of its dict and puts
it back last, so one dict shared by every configuration changed the next one's YAML key order."""

_ANTHROPIC_TYPES = {
    "model_not_found": "not_found_error", "route_not_found": "not_found_error",
    "payload_too_large": "request_too_large", "endpoint_picker_unavailable": "overloaded_error",
}
"""Anthropic's error type for an OpenAI code where it is not the type's plain counterpart."""


def anthropic_error(openai: JsonDict) -> JsonDict:
    """An OpenAI error body in Anthropic's shape (the message kept, a type Anthropic's clients know)."""
    error = openai["error"]
    kind = _ANTHROPIC_TYPES.get(error["code"]) or {
        "invalid_request_error": "invalid_request_error", "service_unavailable": "overloaded_error",
    }.get(error["type"], "api_error")
    return {"type": "error", "error": {"type": kind, "message": error["message"]}}


def with_anthropic_twins(mappers: list[JsonDict]) -> list[JsonDict]:
    """Each mapper preceded by its twin for Anthropic's Messages API: the same filter on those
    paths, the same status, the body in Anthropic's shape."""
    out: list[JsonDict] = []
    for mapper in mappers:
        on_path = cel_filter(ANTHROPIC_PATH)
        twin = {**mapper, "filter": {"and_filter": {"filters": [mapper["filter"], on_path]}}}
        twin["body_format_override"] = {
            "json_format": anthropic_error(mapper["body_format_override"]["json_format"])}
        out += [twin, mapper]
    return out


def openai_local_replies(max_body_bytes: int) -> JsonDict:
    """The mappers, for a listener whose buffer limit is ``max_body_bytes`` (with their twins for
    Anthropic's Messages API)."""
    return {
        "mappers": with_anthropic_twins([
            {
                "filter": cel_filter("response.code_details.startsWith('ext_proc_error')"),
                "status_code": 503,
                "body_format_override": {"json_format": _error(
                    "the endpoint picker is unavailable (%RESPONSE_CODE_DETAILS%)",
                    "service_unavailable", "endpoint_picker_unavailable",
                )},
            },
            {
                "filter": cel_filter(f"response.code_details == 'route_not_found' && "
                               f"'{MODEL_NAME_HEADER}' in request.headers"),
                "body_format_override": {"json_format": _error(
                    f"The model `%REQ({MODEL_NAME_HEADER})%` does not exist.",
                    "invalid_request_error", "model_not_found",
                )},
            },
            {
                "filter": cel_filter("response.code_details == 'route_not_found'"),
                "body_format_override": {"json_format": _error(
                    "no route matches this request", "invalid_request_error", "route_not_found",
                )},
            },
            {  # an ExternalAuth service that could not answer: never let the request through
                "filter": cel_filter("response.code_details == 'ext_authz_error'"),
                "status_code": 503,
                "body_format_override": {"json_format": _error(
                    "the gateway's authorization service is unavailable", "service_unavailable",
                    "authorization_unavailable",
                )},
            },
            {  # refused by an ExternalAuth service: its status, in OpenAI's JSON
                "filter": cel_filter("response.code_details.startsWith('ext_authz')"),
                "body_format_override": {"json_format": _error(
                    "the request is not authorized (%RESPONSE_CODE%)", "invalid_request_error",
                    "unauthorized",
                )},
            },
            _client_mistake(413, f"request body exceeds the gateway limit of {max_body_bytes} bytes",
                            "payload_too_large"),
            _client_mistake(431, "request headers exceed the gateway's limits (%RESPONSE_CODE_DETAILS%)",
                            "request_header_fields_too_large"),
            _client_mistake(408, "the request was not received in time (%RESPONSE_CODE_DETAILS%)",
                            "request_timeout"),
            _client_mistake(400, "the request is not valid HTTP (%RESPONSE_CODE_DETAILS%)", "bad_request"),
            {
                "filter": {"response_flag_filter": {}},
                "body_format_override": {"json_format": _error(
                    "%LOCAL_REPLY_BODY%", "upstream_error", "%RESPONSE_CODE_DETAILS%",
                )},
            },
        ])
    }
