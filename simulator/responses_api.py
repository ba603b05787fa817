"""vLLM's ``POST /v1/responses`` (the OpenAI Responses API) as pure functions: the request as the
chat it becomes, and the replies (a whole ``response`` object, or its stream of events).

vLLM turns ``instructions`` and ``input`` into chat messages and renders them through the model's
chat template like a chat (``responses/utils.py``: ``construct_input_messages``): the instructions
become a system message, a string input a user message; of a list of input items, a function call
becomes an assistant message with that tool call, a function call's output a ``tool`` message, an
output message (an earlier answer sent back) an assistant message with its first part's text, and
any other message item goes to the chat parser as it is (``input_text`` parts are text there,
``input_image`` parts images). Flat function tools become chat tools unless ``tool_choice`` is
"none". So the simulator serves a Responses request as the chat it becomes: the same prompt tokens,
prefix cache, KV events and usage.

Replies as vLLM's ``responses_full_generator`` and ``responses_stream_generator`` give them (a
model without a reasoning or tool parser): usage as ``input_tokens`` / ``output_tokens`` /
``input_tokens_details.cached_tokens``; a stream is ``event: <type>`` / ``data: <json>`` pairs
with a ``sequence_number`` each, ``response.created`` and ``response.in_progress`` sent as the
request starts (before its prefill), then the message's events, ending with ``response.completed``
(no ``[DONE]``). Stored responses are kept only where ``VLLM_ENABLE_RESPONSES_API_STORE=1`` is set
(off by default, as in vLLM), by the request's ``request_id`` (vLLM's response id: a client may
send it, else a new one), on the replica that served it: a ``previous_response_id`` continues its
conversation there and is 404 anywhere else, as vLLM answers one it does not hold. The status is
"incomplete" (``max_output_tokens``) when the client set ``max_output_tokens`` (the simulator makes
exactly that many), else "completed".
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from kvgate.simulator import tokenizer
from kvgate.simulator.engine_types import Finished
from kvgate.simulator.openai_api import InferenceRequest, output_text
from kvgate.simulator.request_fields import ApiError, JsonObject, field_bool, field_int

_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponseStore:
    """vLLM's response store (``VLLM_ENABLE_RESPONSES_API_STORE=1``; off by default, as in vLLM):
    each stored response's input messages and output text, by response id, on this replica alone;
    bounded here (vLLM keeps them until it restarts)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._capacity = capacity
        self._kept: OrderedDict[str, tuple[list[JsonObject], str, JsonObject]] = OrderedDict()

    def get(self, response_id: str) -> tuple[list[JsonObject], str] | None:
        """A stored response's input messages and output text."""
        kept = self._kept.get(response_id)
        return None if kept is None else (kept[0], kept[1])

    def response(self, response_id: str) -> JsonObject | None:
        """A stored response as it was answered (``GET /v1/responses/{id}``)."""
        kept = self._kept.get(response_id)
        return None if kept is None else kept[2]

    def put(self, response_id: str, messages: list[JsonObject], output: str, response: JsonObject) -> None:
        self._kept[response_id] = (messages, output, response)
        self._kept.move_to_end(response_id)
        while len(self._kept) > self._capacity:
            self._kept.popitem(last=False)


def stored_reply(store: ResponseStore | None, response_id: str, *, cancel: bool) -> JsonObject:
    """vLLM's answer to ``GET /v1/responses/{id}`` (the stored response) and ``POST .../cancel`` (a
    finished response cannot be: 400); 404 for one it does not hold."""
    response = store.response(response_id) if store is not None else None
    if response is None:
        raise ApiError(404, f"Response with id '{response_id}' not found.", "response_id")
    if cancel:
        raise ApiError(400, "Cannot cancel a synchronous response.", "response_id")
    return response


def chat_body(body: Mapping[str, Any], store: ResponseStore | None = None) -> JsonObject:
    """The chat completions body this Responses request is served as (a 400 or 404 as vLLM's): the
    conversation of the stored response it continues, if any, in front of its input."""
    previous = body.get("previous_response_id")
    stored = store.get(previous) if store is not None and isinstance(previous, str) else None
    if previous is not None and stored is None:
        raise ApiError(404, f"Response with id '{previous}' not found.", "previous_response_id")
    if field_bool(body, "background"):
        raise ApiError(400, "This vLLM engine does not support `store=True` and therefore does not support "
                            "the background mode.", "background")
    messages: list[JsonObject] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions not in (None, ""):
        raise ApiError(400, "'instructions' must be a string", "instructions")
    if stored is not None:  # its input messages, then its output, as vLLM's construct_input_messages
        messages.extend(stored[0])
        messages.append({"role": "assistant", "content": stored[1]})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list) and items:
        messages.extend(_message(item) for item in items)
    else:
        raise ApiError(400, "'input' must be a string or a non-empty list of items", "input")
    chat: JsonObject = {"messages": messages, "stream": field_bool(body, "stream")}
    for key in ("model", "cache_salt", "temperature", "top_p"):
        if key in body:
            chat[key] = body[key]
    limit = field_int(body, "max_output_tokens")
    if limit is not None:
        chat["max_completion_tokens"] = limit
    tools = body.get("tools")
    if tools and body.get("tool_choice") != "none":
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ApiError(400, "'tools' must be a list of objects", "tools")
        chat["tools"] = [{"type": "function", "function": tool} for tool in tools]
    return chat


def _message(item: object) -> JsonObject:
    if not isinstance(item, dict):
        raise ApiError(400, "each input item must be an object", "input")
    kind = item.get("type", "message")
    if kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind == "reasoning":
        summary, content = item.get("summary") or [], item.get("content") or []
        parts = summary if len(summary) == 1 else content if len(content) == 1 else []
        text = parts[0].get("text", "") if parts and isinstance(parts[0], dict) else ""
        return {"role": "assistant", "reasoning": text}
    if kind != "message" or not isinstance(item.get("role"), str):
        raise ApiError(400, f"input items of type {kind!r} are not supported", "input")
    content = item.get("content")
    if item["role"] == "assistant" and isinstance(content, list) and content and "id" in item:
        first = content[0]  # an earlier output message: vLLM keeps its first part's text
        return {"role": "assistant", "content": first.get("text", "") if isinstance(first, dict) else ""}
    if isinstance(content, list):
        content = [_part(part) for part in content]
    return {"role": item["role"], "content": content}


def _part(part: object) -> object:
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        return {"type": "text", "text": part.get("text")}
    if kind == "input_image":
        image: JsonObject = {"type": "image_url", "image_url": {"url": part.get("image_url")}}
        if isinstance(part.get("uuid"), str):
            image["uuid"] = part["uuid"]
        return image
    return part


def new_response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def usage_json(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> JsonObject:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "input_tokens_per_turn": [],
                                 "cached_tokens_per_turn": []},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                  "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
        "total_tokens": prompt_tokens + output_tokens,
    }


class ResponsesShape:
    """One Responses API request as the server serves it (with the replica's store, where on)."""

    def __init__(self, store: ResponseStore | None = None) -> None:
        self._store = store
        self._messages: list[JsonObject] = []

    def chat_body(self, body: Mapping[str, Any]) -> JsonObject:
        chat = chat_body(body, self._store)
        self._messages = chat["messages"]
        return chat

    def replies(self, body: Mapping[str, Any], request: InferenceRequest) -> ResponseReplies:
        keep = self._store if field_bool(body, "store", True) else None
        given = body.get("request_id")
        return ResponseReplies(body, request.model, given if isinstance(given, str) and given else None,
                               store=keep, messages=self._messages)

    @staticmethod
    def error_body(err: ApiError) -> JsonObject:
        return err.body()


class ResponseReplies:
    """One Responses API request's replies: the whole response, or its stream's events."""

    def __init__(self, body: Mapping[str, Any], model: str, response_id: str | None = None,
                 created: int | None = None, *, store: ResponseStore | None = None,
                 messages: list[JsonObject] | None = None) -> None:
        """``response_id``: the request's ``request_id`` (vLLM's response id), else a new one;
        ``store``: where the whole response is kept once made, with ``messages``, its input."""
        self._body = body
        self._store = store
        self._messages = messages or []
        self._model = model
        self.response_id = response_id or new_response_id()
        self._created = int(time.time()) if created is None else created
        self._item_id = "msg_" + uuid.uuid4().hex
        self._sequence = 0

    def response(self, output: list[JsonObject], usage: JsonObject | None, *, done: bool) -> JsonObject:
        body = self._body
        limited = body.get("max_output_tokens") is not None
        status = ("incomplete" if limited else "completed") if done else "in_progress"
        tools = body.get("tools") if isinstance(body.get("tools"), list) else []
        return {
            "id": self.response_id, "created_at": self._created,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"), "metadata": body.get("metadata"),
            "model": self._model, "object": "response", "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature", 1.0), "tool_choice": body.get("tool_choice", "auto"),
            "tools": tools, "top_p": body.get("top_p", 1.0), "background": False,
            "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None,
            "previous_response_id": None, "prompt": None, "reasoning": None, "service_tier": "auto",
            "status": status, "text": body.get("text"), "top_logprobs": None, "truncation": "disabled",
            "usage": usage, "user": None,
        }

    def message(self, text: str, *, done: bool) -> JsonObject:
        content = [self._text_part(text)] if done else []
        return {"id": self._item_id, "content": content, "role": "assistant",
                "status": "completed" if done else "in_progress", "type": "message"}

    @staticmethod
    def _text_part(text: str) -> JsonObject:
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}

    def whole(self, finished: Finished) -> JsonObject:
        """The non-streamed reply."""
        usage = usage_json(finished.prompt_tokens, finished.completion_tokens, finished.cached_tokens)
        text = output_text(0, finished.completion_tokens)
        whole = self.response([self.message(text, done=True)], usage, done=True)
        if self._store is not None:
            self._store.put(self.response_id, self._messages, text, whole)
        return whole

    # --- a stream --------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> str:
        data = {**fields, "sequence_number": self._sequence, "type": kind}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    def preamble(self) -> bytes:
        """What vLLM sends as the request starts, before its prefill."""
        started = self.response([], None, done=False)
        return (self._event("response.created", response=started)
                + self._event("response.in_progress", response=started)).encode()

    def opening(self) -> bytes:
        """With the first token: the message and its text part begin."""
        added = self._event("response.output_item.added", item=self.message("", done=False), output_index=0)
        part = self._event("response.content_part.added", content_index=0, item_id=self._item_id,
                           output_index=0, part={**self._text_part(""), "logprobs": []})
        return (added + part).encode()

    def token_chunks(self, first_index: int, count: int, final: bool) -> bytes:
        return "".join(
            self._event("response.output_text.delta", content_index=0, delta=tokenizer.output_text(i),
                        item_id=self._item_id, logprobs=[], output_index=0)
            for i in range(first_index, first_index + count)
        ).encode()

    def closing(self, request: InferenceRequest, finished: Finished) -> bytes:
        """After the last token: the text, part and message done, then the whole response."""
        text = output_text(0, finished.completion_tokens)
        return (
            self._event("response.output_text.done", content_index=0, item_id=self._item_id, logprobs=[],
                        output_index=0, text=text)
            + self._event("response.content_part.done", content_index=0, item_id=self._item_id,
                          output_index=0, part=self._text_part(text))
            + self._event("response.output_item.done", item=self.message(text, done=True), output_index=0)
            + self._event("response.completed", response=self.whole(finished))
        ).encode()

    def error_event(self, status: int, message: str) -> bytes:
        return self._event("error", code=str(status), message=message, param=None).encode()
