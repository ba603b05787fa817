"""The audio APIs' forms (``multipart/form-data``): read as vLLM reads them, routed on their model."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from kvgate.extproc.bbr import model_of
from kvgate.extproc.decision import Prepared, prepare
from kvgate.extproc.form_request import (
    MAX_FIELD_BYTES,
    form_boundary,
    parse_form,
    parse_form_request,
    with_model,
)
from kvgate.policies.errors import BadRequestError, ModelNotFoundError
from kvgate.policies.types import ApiKind
from tests.extproc.fakes import FakePool

BOUNDARY = b"----kvgate7MA4YWxkTrZu0gW"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY.decode()}"
AUDIO = bytes(range(256)) * 40 + b"\r\n--not-the-boundary\r\n" + b"RIFF" * 100


def form(*fields: tuple[str, str], audio: bytes | None = AUDIO, audio_first: bool = True) -> bytes:
    parts = [b"--" + BOUNDARY + b"\r\nContent-Disposition: form-data; name=\"" + name.encode() + b"\"\r\n\r\n"
             + value.encode() + b"\r\n" for name, value in fields]
    if audio is not None:
        file_part = (b"--" + BOUNDARY + b"\r\nContent-Disposition: form-data; name=\"file\"; "
                     b"filename=\"speech.wav\"\r\nContent-Type: audio/wav\r\n\r\n" + audio + b"\r\n")
        parts.insert(0 if audio_first else len(parts), file_part)
    return b"".join(parts) + b"--" + BOUNDARY + b"--\r\n"


def test_the_boundary_of_a_form_and_nothing_for_other_bodies() -> None:
    assert form_boundary(CONTENT_TYPE) == BOUNDARY
    assert form_boundary('multipart/form-data; boundary="quoted b"') == b"quoted b"
    assert form_boundary("application/json") is None
    assert form_boundary(None) is None
    with pytest.raises(BadRequestError, match="without a boundary"):
        form_boundary("multipart/form-data")


@pytest.mark.parametrize("audio_first", [True, False])
def test_text_fields_are_read_and_the_audio_is_not_kept(audio_first: bool) -> None:
    body = form(("model", "openai/whisper-large-v3"), ("language", "de"), ("stream", "true"),
                ("stream_include_usage", "1"), audio_first=audio_first)
    found = parse_form_request(ApiKind.OTHER, BOUNDARY, body)
    assert found is not None
    request, parsed = found
    assert request.model == "openai/whisper-large-v3"
    assert request.stream is True
    assert request.usage_requested is True
    assert parsed.fields == {"model": "openai/whisper-large-v3", "language": "de", "stream": "true",
                             "stream_include_usage": "1"}
    assert "file" not in parsed.fields


def test_the_model_is_rewritten_in_place_and_the_rest_forwarded_as_sent() -> None:
    body = form(("model", "whisper"), ("prompt", "Kubernetes, Envoy"))
    parsed = parse_form(BOUNDARY, body)
    rewritten = with_model(body, parsed, "openai/whisper-large-v3-turbo")
    again = parse_form(BOUNDARY, rewritten)
    assert again.fields == {"model": "openai/whisper-large-v3-turbo", "prompt": "Kubernetes, Envoy"}
    assert rewritten.replace(b"openai/whisper-large-v3-turbo", b"whisper") == body
    assert AUDIO in rewritten


def test_a_form_without_a_model_is_routed_without_one() -> None:
    # vLLM serves it with the model it serves (TranscriptionRequest.model is optional)
    assert parse_form_request(ApiKind.OTHER, BOUNDARY, form(("language", "en"))) is None
    assert parse_form_request(ApiKind.OTHER, BOUNDARY, form(("model", ""))) is None


def test_the_first_value_of_a_field_counts_and_a_huge_one_is_not_kept() -> None:
    body = form(("model", "a"), ("model", "b"), ("prompt", "x" * (MAX_FIELD_BYTES + 1)))
    parsed = parse_form(BOUNDARY, body)
    assert parsed.fields == {"model": "a"}
    assert with_model(body, parsed, "c").count(b"name=\"model\"\r\n\r\nc\r\n") == 1


@pytest.mark.parametrize(("body", "message"), [
    (b"garbage", "not a valid multipart form"),
    (form(("model", "m"))[:-10], "not a complete multipart form"),
    (b"--" + BOUNDARY + b"\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n\xff\xfe\r\n--"
     + BOUNDARY + b"--\r\n", "not UTF-8"),
])
def test_a_body_that_is_not_a_form_is_400(body: bytes, message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        parse_form(BOUNDARY, body)


def _prepare(pool: FakePool, body: bytes) -> Prepared:
    headers = MappingProxyType({":path": "/v1/audio/transcriptions", "content-type": CONTENT_TYPE})
    return prepare(pool=pool, api=ApiKind.OTHER, headers=headers, body=body, subset=None,
                   inject_usage=True, request_id="r")


def test_the_picker_checks_and_rewrites_a_forms_model() -> None:
    pool = FakePool("p", ("10.0.0.1:8000",), served_models=frozenset({"whisper-v3"}),
                    rewrites={"whisper": "whisper-v3"})
    prepared = _prepare(pool, form(("model", "whisper")))
    assert prepared.request.model == "whisper"
    assert prepared.request.target_model == "whisper-v3"
    assert prepared.body_rewritten
    assert parse_form(BOUNDARY, prepared.body).fields["model"] == "whisper-v3"
    assert not prepared.usage_injected  # a form has no stream_options
    with pytest.raises(ModelNotFoundError):
        _prepare(pool, form(("model", "no-such-model")))
    untouched = _prepare(pool, form(("model", "whisper-v3")))
    assert untouched.body == form(("model", "whisper-v3"))
    assert not untouched.body_rewritten


def test_the_body_based_router_reads_a_forms_model() -> None:
    body = form(("model", "whisper"))
    assert model_of(body, CONTENT_TYPE) == "whisper"
    assert model_of(body, None) is None  # not JSON
    assert model_of(b"garbage", CONTENT_TYPE) is None  # the picker answers it
