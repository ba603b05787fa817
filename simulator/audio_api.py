"""vLLM's speech-to-text API (``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``)
served as the chat it costs like.

The request is a ``multipart/form-data`` form, as OpenAI's and vLLM's (a FastAPI ``Form``): the audio
in ``file``, and ``model`` (optional: the served model), ``language``, ``prompt``,
``response_format``, ``stream``, ``stream_include_usage`` and the rest as text fields. The simulator
does not decode audio: it reads the file as 16 kHz 16-bit mono PCM (32,000 bytes a second, a WAV's
header counted in) and costs it as Whisper does, 1,500 encoder positions per started 30-second
window (the prompt, keyed by the audio's digest, so the same audio is a prefix hit), and 3 output
tokens a second of speech (about 150 words a minute), at most ``max_completion_tokens``.

Replies as vLLM's: ``{"text": ..., "usage": {"type": "duration", "seconds": N}}``, or with
``stream=true`` ``transcription.chunk`` events (``choices[0].delta.content``), the last with
``finish_reason`` and, when ``stream_include_usage``, a chunk with token ``usage``; then
``data: [DONE]``. Errors in OpenAI's shape.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from aiohttp.web_request import FileField

from kvgate.simulator import tokenizer
from kvgate.simulator.engine_types import Finished
from kvgate.simulator.openai_api import InferenceRequest, output_text
from kvgate.simulator.request_fields import ApiError, JsonObject, field_bool, field_int

PCM_BYTES_PER_SECOND = 32_000
WINDOW_SECONDS = 30
ENCODER_POSITIONS = 1_500
"""Whisper's encoder positions per 30-second window (its mel frames, halved by the convolution)."""
TOKENS_PER_SECOND = 3
AUDIO_BYTES_FIELD = "__audio_bytes"
"""The size of the form's file, beside its text fields (no client sends a field by that name)."""
AUDIO_DIGEST_FIELD = "__audio_digest"


async def read_form(request: web.Request) -> dict[str, Any]:
    """The form's text fields and the size of its ``file``; a 400 as vLLM's for a body that is not
    such a form (FastAPI refuses a missing ``file`` as a validation error)."""
    if not request.content_type.startswith("multipart/"):
        raise ApiError(400, "the request body must be multipart/form-data with an audio file", "file")
    try:
        form = await request.post()
    except ValueError as exc:
        raise ApiError(400, f"There was an error parsing the body: {exc}") from None
    fields: dict[str, Any] = {}
    audio: bytes | None = None
    for name, value in form.items():
        if isinstance(value, str):
            fields.setdefault(name, value)
        elif name == "file" and audio is None:
            audio = value.file.read() if isinstance(value, FileField) else bytes(value)
    if audio is None:
        raise ApiError(400, "file: Field required", "file")
    fields[AUDIO_BYTES_FIELD] = len(audio)
    fields[AUDIO_DIGEST_FIELD] = hashlib.blake2b(audio, digest_size=16).hexdigest()
    return fields


def audio_seconds(size: int) -> int:
    return max(1, math.ceil(size / PCM_BYTES_PER_SECOND))


class TranscriptionShape:
    """The speech-to-text request as the chat it costs like, and its replies."""

    def __init__(self, base_model: str) -> None:
        self._base_model = base_model

    def chat_body(self, body: Mapping[str, Any]) -> JsonObject:
        seconds = audio_seconds(int(body.get(AUDIO_BYTES_FIELD, 0)))
        positions = ENCODER_POSITIONS * math.ceil(seconds / WINDOW_SECONDS)
        digest = str(body.get(AUDIO_DIGEST_FIELD, ""))
        text = (digest * (positions * tokenizer.CHARS_PER_TOKEN // max(1, len(digest)) + 1))
        tokens = seconds * TOKENS_PER_SECOND
        limit = field_int(body, "max_completion_tokens", "max_completion_tokens: a positive integer")
        stream = field_bool(body, "stream")
        return {
            "model": body.get("model") or self._base_model,
            "messages": [{"role": "user", "content": text[: positions * tokenizer.CHARS_PER_TOKEN]}],
            "max_tokens": min(tokens, limit) if limit else tokens,
            "stream": stream,
            "stream_options": {"include_usage": field_bool(body, "stream_include_usage")},
        }

    @staticmethod
    def replies(body: Mapping[str, Any], request: InferenceRequest) -> TranscriptionReplies:
        return TranscriptionReplies(request.model, audio_seconds(int(body.get(AUDIO_BYTES_FIELD, 0))),
                                    usage=field_bool(body, "stream_include_usage"))

    @staticmethod
    def error_body(err: ApiError) -> JsonObject:
        return err.body()


class TranscriptionReplies:
    """One speech-to-text request's replies: the whole text, or its stream of chunks."""

    def __init__(self, model: str, seconds: int, *, usage: bool) -> None:
        self._seconds = seconds
        self._usage = usage
        self._head = (
            '{"id":"trsc-' + uuid.uuid4().hex + '","object":"transcription.chunk","created":'
            + str(int(time.time())) + ',"model":' + json.dumps(model) + ","
        )

    def whole(self, finished: Finished) -> JsonObject:
        return {"text": output_text(0, finished.completion_tokens),
                "usage": {"type": "duration", "seconds": self._seconds}}

    def _chunk(self, fields: JsonObject) -> str:
        return "data: " + self._head + json.dumps(fields, separators=(",", ":"))[1:] + "\n\n"

    def preamble(self) -> bytes:
        return b""

    def opening(self) -> bytes:
        return b""

    def token_chunks(self, first_index: int, count: int, final: bool) -> bytes:
        return "".join(
            self._chunk({"choices": [{"delta": {"content": tokenizer.output_text(i)}, "finish_reason": None,
                                      "stop_reason": None}]})
            for i in range(first_index, first_index + count)).encode()

    def closing(self, request: InferenceRequest, finished: Finished) -> bytes:
        lines = self._chunk({"choices": [{"delta": {}, "finish_reason": "length", "stop_reason": None}]})
        if self._usage:
            usage = {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
                     "total_tokens": finished.prompt_tokens + finished.completion_tokens}
            lines += self._chunk({"choices": [], "usage": usage})
        return (lines + "data: [DONE]\n\n").encode()

    def error_event(self, status: int, message: str) -> bytes:
        return ("data: " + json.dumps(ApiError(status, message).body()) + "\n\n").encode()
