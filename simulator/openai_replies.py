"""vLLM's OpenAI-compatible replies as pure functions: ids (``cmpl-…`` / ``chatcmpl-…``), ``usage``
with ``prompt_tokens_details.cached_tokens``, whole responses, SSE chunks and ``data: [DONE]``, and
the model list, field for field where a router or client may read them."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from kvgate.simulator import tokenizer
from kvgate.simulator.engine_types import Finished
from kvgate.simulator.openai_api import MAX_MODEL_LEN, InferenceRequest, output_text
from kvgate.simulator.request_fields import ApiError, JsonObject, error_body


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> JsonObject:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def full_response(
    request: InferenceRequest, request_id: str, created: int, completion_tokens: int, usage: JsonObject
) -> JsonObject:
    text = output_text(0, completion_tokens)
    if request.kind == "completion":
        choice: JsonObject = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None, "tool_calls": []},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        obj = "chat.completion"
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": request.model,
        "choices": [choice],
        "usage": usage,
        "prompt_logprobs": None,
    }


class StreamFormat(Protocol):
    """The bytes of one streamed answer, in its API's format: what goes out as the request starts
    (before its prefill), with the first token, with each run of tokens, and after the last."""

    def preamble(self) -> bytes: ...

    def opening(self) -> bytes: ...

    def token_chunks(self, first_index: int, count: int, final: bool) -> bytes: ...

    def closing(self, request: InferenceRequest, finished: Finished) -> bytes: ...

    def error_event(self, status: int, message: str) -> bytes: ...


class ShapedReplies(StreamFormat, Protocol):
    """One request's replies in another API's shape than the chat it is served as."""

    def whole(self, finished: Finished) -> JsonObject: ...


class ReplyShape(Protocol):
    """An API served as a chat (the Responses API, Anthropic's Messages API): its request as the
    chat body, its replies, and its errors' JSON."""

    def chat_body(self, body: Mapping[str, Any]) -> JsonObject: ...

    def replies(self, body: Mapping[str, Any], request: InferenceRequest) -> ShapedReplies: ...

    def error_body(self, err: ApiError) -> JsonObject: ...


class SseFormatter:
    """The ``data: …`` lines of one streamed completion or chat, in vLLM's chunk format."""

    def __init__(self, request: InferenceRequest, request_id: str, created: int) -> None:
        self._request = request
        chat = request.kind == "chat"
        self._object = "chat.completion.chunk" if chat else "text_completion"
        self._head = (
            '{"id":' + json.dumps(request_id) + ',"object":"' + self._object + '","created":'
            + str(created) + ',"model":' + json.dumps(request.model) + ',"choices":'
        )

    def _line(self, choices: str, usage: JsonObject | None = None) -> bytes:
        tail = "" if usage is None else ',"usage":' + json.dumps(usage, separators=(",", ":"))
        return ("data: " + self._head + choices + tail + "}\n\n").encode()

    def preamble(self) -> bytes:
        return b""  # (vLLM's first chunk comes with the first token)

    def opening(self) -> bytes:
        """Chat streams open with the assistant role, sent with the first token."""
        if self._request.kind != "chat":
            return b""
        return self._line('[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
                          '"finish_reason":null}]')

    def token_chunks(self, first_index: int, count: int, final: bool) -> bytes:
        parts: list[bytes] = []
        for index in range(first_index, first_index + count):
            text = json.dumps(tokenizer.output_text(index))
            last = final and index == first_index + count - 1
            finish = '"length"' if last else "null"
            if self._request.kind == "chat":
                choice = ('[{"index":0,"delta":{"content":' + text + '},"logprobs":null,"finish_reason":'
                          + finish + (',"stop_reason":null' if last else "") + "}]")
            else:
                choice = ('[{"index":0,"text":' + text + ',"logprobs":null,"finish_reason":' + finish
                          + ',"stop_reason":null}]')
            parts.append(self._line(choice))
        return b"".join(parts)

    def closing(self, request: InferenceRequest, finished: Finished) -> bytes:
        """The usage chunk where the client asked for it, then ``[DONE]``."""
        if not request.include_usage:
            return self.done()
        usage = usage_json(finished.prompt_tokens, finished.completion_tokens, finished.cached_tokens)
        return self._line("[]", usage) + self.done()

    @staticmethod
    def error_event(status: int, message: str) -> bytes:
        return ("data: " + json.dumps(error_body(status, message)) + "\n\n").encode()

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"


def models_list(base_model: str, adapters: Mapping[str, str], created: int | None = None) -> JsonObject:
    """``GET /v1/models``: the base model, then each adapter with ``parent`` = the base model."""
    stamp = int(time.time()) if created is None else created
    data = [_model_card(base_model, base_model, None, stamp)]
    data.extend(_model_card(name, path, base_model, stamp) for name, path in adapters.items())
    return {"object": "list", "data": data}


def _model_card(model_id: str, root: str, parent: str | None, created: int) -> JsonObject:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": MAX_MODEL_LEN if parent is None else None,
        "permission": [
            {
                "id": "modelperm-" + uuid.uuid5(uuid.NAMESPACE_URL, model_id).hex,
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
