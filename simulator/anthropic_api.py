"""vLLM's ``POST /v1/messages`` (Anthropic's Messages API) as pure functions: the request as the
chat it becomes, and the replies (a whole message, or its stream of events).

vLLM converts the request into a chat completion (``anthropic/serving.py``:
``_convert_anthropic_to_openai_request``): ``system`` (a string, or its text blocks joined with
nothing between them) a system message; a message's string content as it is, its blocks as text
parts (one text part: the content itself), ``tool_use`` blocks as tool calls (``input`` as a JSON
string), a user's ``tool_result`` blocks as ``tool`` messages in front of it (content as a string,
the block's ``id`` as the call's id), ``image`` blocks as image parts (the source's ``data``); a
message left with nothing is dropped; tools become chat tools (``input_schema`` the parameters,
``"type": "object"`` added where missing); ``max_tokens`` (required) the completion's length.

Replies as vLLM converts the chat's: a message with one text block, ``stop_reason`` from the
finish reason ("max_tokens": the simulator makes exactly ``max_tokens``), ``usage`` with
``input_tokens`` and ``output_tokens``; a stream of ``event:``/``data:`` pairs, ``message_start``
with the first token (vLLM converts the chat stream's first chunk into it), a text block's start,
deltas and stop, ``message_delta`` with the stop reason and usage, ``message_stop``, then vLLM's
``data: [DONE]``. Errors in Anthropic's shape with vLLM's type names (``{"type": "error", "error":
{"type": "BadRequestError", "message": ...}}``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvgate.simulator import tokenizer
from kvgate.simulator.engine_types import Finished
from kvgate.simulator.openai_api import InferenceRequest, new_request_id, output_text
from kvgate.simulator.request_fields import ApiError, JsonObject, field_bool, field_int


def error_body(err: ApiError) -> JsonObject:
    """vLLM's Anthropic error: its OpenAI error's type and message in Anthropic's shape (vLLM's
    ``translate_error_response``: the type is vLLM's, e.g. ``BadRequestError``)."""
    error = err.body()["error"]
    return {"type": "error", "error": {"type": error["type"], "message": error["message"]}}


def chat_body(body: Mapping[str, Any], *, counting: bool = False) -> JsonObject:
    """The chat completions body this Messages request is served as (a 400 as vLLM's);
    ``counting``: for ``/v1/messages/count_tokens``, which takes no ``max_tokens``."""
    limit = 1 if counting else field_int(body, "max_tokens", "max_tokens: a positive integer is required")
    if limit is None:
        raise ApiError(400, "max_tokens: a positive integer is required", "max_tokens")
    messages: list[JsonObject] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(b.get("text") or "" for b in system
                         if isinstance(b, dict) and b.get("type") == "text")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    elif system not in (None, ""):
        raise ApiError(400, "system: a string or a list of text blocks", "system")
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise ApiError(400, "messages: a non-empty list is required", "messages")
    for turn in turns:
        _add_turn(turn, messages)
    chat: JsonObject = {"messages": messages, "max_completion_tokens": limit,
                        "stream": field_bool(body, "stream")}
    for key in ("model", "temperature", "top_p"):
        if key in body:
            chat[key] = body[key]
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                  and isinstance(t.get("input_schema"), dict) for t in tools):
            raise ApiError(400, "tools: each tool needs a name and an input_schema object", "tools")
        chat["tools"] = [_tool(t) for t in tools]
    return chat


def _tool(tool: Mapping[str, Any]) -> JsonObject:
    schema = tool["input_schema"]
    parameters = schema if "type" in schema else {**schema, "type": "object"}
    function = {"name": tool["name"], "description": tool.get("description"), "parameters": parameters}
    return {"type": "function", "function": function}


def _add_turn(turn: object, messages: list[JsonObject]) -> None:
    if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
        raise ApiError(400, "messages: each message needs the role 'user' or 'assistant'", "messages")
    role, content = turn["role"], turn.get("content")
    if isinstance(content, str):
        messages.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise ApiError(400, "messages: content must be a string or a list of blocks", "messages")
    parts: list[JsonObject] = []
    calls: list[JsonObject] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if block.get("text"):
                parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            source = block.get("source") or {}
            parts.append({"type": "image_url", "image_url": {"url": source.get("data", "")}})
        elif kind == "tool_use":
            function = {"name": block.get("name") or "", "arguments": json.dumps(block.get("input") or {})}
            calls.append({"id": block.get("id") or "call_0", "type": "function", "function": function})
        elif kind == "tool_result":
            result = block.get("content")
            text = str(result) if result else ""
            if role == "user":
                messages.append({"role": "tool", "tool_call_id": block.get("id") or "", "content": text})
            else:
                parts.append({"type": "text", "text": f"Tool result: {text}"})
        elif kind != "thinking":
            raise ApiError(400, f"messages: content blocks of type {kind!r} are not supported", "messages")
    message: JsonObject = {"role": role}
    if calls:
        message["tool_calls"] = calls
    if parts:
        message["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    elif not calls:
        return
    messages.append(message)


def usage_json(finished: Finished) -> JsonObject:
    return {"input_tokens": finished.prompt_tokens, "output_tokens": finished.completion_tokens}


class MessagesShape:
    """The Messages API's request and replies as the server serves them."""

    @staticmethod
    def chat_body(body: Mapping[str, Any]) -> JsonObject:
        return chat_body(body)

    @staticmethod
    def replies(body: Mapping[str, Any], request: InferenceRequest) -> MessageReplies:
        return MessageReplies(request.model, len(request.prompt_tokens))

    @staticmethod
    def error_body(err: ApiError) -> JsonObject:
        return error_body(err)


class MessageReplies:
    """One Messages API request's replies: the whole message, or its stream's events."""

    def __init__(self, model: str, prompt_tokens: int, message_id: str | None = None) -> None:
        self._model = model
        self._prompt_tokens = prompt_tokens
        self.message_id = message_id or new_request_id("chat")

    def whole(self, finished: Finished) -> JsonObject:
        text = output_text(0, finished.completion_tokens)
        return {"id": self.message_id, "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": text}], "model": self._model,
                "stop_reason": "max_tokens", "usage": usage_json(finished)}  # (vLLM drops None fields)

    @staticmethod
    def _event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, separators=(',', ':'))}\n\n"

    def preamble(self) -> bytes:
        return b""  # (vLLM's message_start is made of the chat stream's first chunk)

    def opening(self) -> bytes:
        start = {"id": self.message_id, "type": "message", "role": "assistant", "content": [],
                 "model": self._model, "usage": {"input_tokens": self._prompt_tokens, "output_tokens": 0}}
        return (self._event("message_start", message=start)
                + self._event("content_block_start", index=0,
                              content_block={"type": "text", "text": ""})).encode()

    def token_chunks(self, first_index: int, count: int, final: bool) -> bytes:
        return "".join(self._event("content_block_delta", index=0,
                                   delta={"type": "text_delta", "text": tokenizer.output_text(i)})
                       for i in range(first_index, first_index + count)).encode()

    def closing(self, request: InferenceRequest, finished: Finished) -> bytes:
        return (self._event("content_block_stop", index=0)
                + self._event("message_delta", delta={"stop_reason": "max_tokens"},
                              usage=usage_json(finished))
                + self._event("message_stop") + "data: [DONE]\n\n").encode()

    def error_event(self, status: int, message: str) -> bytes:
        return self._event("error", error=error_body(ApiError(status, message))["error"]).encode()
