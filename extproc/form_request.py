"""Requests whose body is a form (``multipart/form-data``): the audio APIs.

vLLM's ``/v1/audio/transcriptions`` and ``/v1/audio/translations`` (Whisper and other speech
models), like OpenAI's, take the audio file and every parameter as form fields; OpenAI's SDKs send
them so. Read as JSON, such a request had no model: it was routed to any replica of the pool,
unchecked (a model the pool does not serve reached a replica, a model name that an
InferenceModelRewrite renames was not renamed) and the body-based router left it on the default
route. Here the form's text fields are read with python-multipart (the parser vLLM's FastAPI server
itself uses) and the audio part skipped in place: the model routes it, is checked and rewritten as a
JSON request's is.

The form's ``model`` is optional for vLLM (its default: the model it serves), so a form without one
is routed without a model, as vLLM would serve it. A rewritten model replaces the bytes of that one
field's value; the rest of the body, the audio among it, is forwarded as the client sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import parse_options_header

from kvgate.extproc.engine_values import engine_bool
from kvgate.extproc.model_names import check_model_name
from kvgate.extproc.openai_request import OpenAIRequest
from kvgate.policies.errors import BadRequestError
from kvgate.policies.types import ApiKind

FORM_TYPE = b"multipart/form-data"
MAX_FIELD_BYTES = 64 * 1024
"""A text field longer than this is not kept (the fields read here are short; an audio ``prompt``
is a few hundred tokens): no field can make the picker hold a second copy of a large body."""


def form_boundary(content_type: str | None) -> bytes | None:
    """The boundary of a ``multipart/form-data`` content type; None for any other body."""
    if not content_type:
        return None
    kind, options = parse_options_header(content_type)
    if kind != FORM_TYPE:
        return None
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadRequestError("multipart/form-data request without a boundary")
    return boundary


@dataclass(frozen=True, slots=True)
class Form:
    """A form's text fields (the first value of each name; files are not kept) and where the
    ``model`` field's value lies in the body (to rewrite it)."""

    fields: dict[str, str]
    model_span: tuple[int, int] | None = None


@dataclass(slots=True)
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    header_name: bytearray = field(default_factory=bytearray)
    header_value: bytearray = field(default_factory=bytearray)
    name: str | None = None
    is_file: bool = False
    data: bytearray = field(default_factory=bytearray)
    start: int | None = None
    end: int = 0
    too_long: bool = False


def parse_form(boundary: bytes, body: bytes) -> Form:
    """The text fields of a ``multipart/form-data`` ``body``; raises BadRequestError (400) for a
    body that is not such a form."""
    fields: dict[str, str] = {}
    spans: dict[str, tuple[int, int]] = {}
    part = _Part()

    def on_part_begin() -> None:
        nonlocal part
        part = _Part()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        part.header_name += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        part.header_value += data[start:end]

    def on_header_end() -> None:
        part.headers[bytes(part.header_name).lower()] = bytes(part.header_value)
        part.header_name.clear()
        part.header_value.clear()

    def on_headers_finished() -> None:
        _, options = parse_options_header(part.headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        part.name = name.decode("utf-8", "replace") if name is not None else None
        part.is_file = b"filename" in options

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if part.is_file or part.name is None:
            return  # the audio is skipped where it lies: no copy of it
        if part.start is None:
            part.start = start
        part.end = end
        if len(part.data) + end - start > MAX_FIELD_BYTES:
            part.too_long = True
            part.data.clear()
        elif not part.too_long:
            part.data += data[start:end]

    def on_part_end() -> None:
        if part.is_file or part.name is None or part.too_long or part.name in fields:
            return
        try:
            fields[part.name] = part.data.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequestError(f"form field {part.name!r} is not UTF-8 text") from None
        start = part.start if part.start is not None else part.end
        spans[part.name] = (start, part.end)

    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field,
        "on_header_value": on_header_value, "on_header_end": on_header_end,
        "on_headers_finished": on_headers_finished, "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    })
    try:
        # one write of the whole body: the callbacks' offsets are the body's own (the model's span)
        parser.write(body)
        parser.finalize()
    except MultipartParseError as exc:
        reason = exc.args[0] if exc.args else type(exc).__name__
        raise BadRequestError(f"request body is not a valid multipart form: {reason}") from None
    if parser.state.name != "END":
        raise BadRequestError("request body is not a complete multipart form (no closing boundary)")
    return Form(fields, spans.get("model"))


def parse_form_request(api: ApiKind, boundary: bytes, body: bytes) -> tuple[OpenAIRequest, Form] | None:
    """The routing view of a form request, and its form; None when the form names no model (vLLM
    serves it with its own: routed without a model). Raises BadRequestError (400)."""
    form = parse_form(boundary, body)
    model = form.fields.get("model", "")
    if not model:
        return None
    check_model_name(model)
    fields = form.fields
    request = OpenAIRequest(
        api=api, model=model, prompt="", stream=engine_bool(fields.get("stream")),
        usage_requested=engine_bool(fields.get("stream_include_usage")), cache_salt=None,
        max_tokens=None, document=dict(fields),
    )
    return request, form


def with_model(body: bytes, form: Form, model: str) -> bytes:
    """``body`` with its ``model`` field's value replaced by ``model`` (the form's other bytes as
    they were)."""
    if form.model_span is None:
        raise ValueError("the form has no model field")
    start, end = form.model_span
    return body[:start] + model.encode() + body[end:]
