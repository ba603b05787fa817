"""A Responses API request's conversation as vLLM builds it for the chat template (sans-IO).

vLLM's ``/v1/responses`` turns ``instructions`` and ``input`` into chat messages and renders them
through the model's chat template like a chat (``responses.utils.construct_input_messages``, read in
vLLM's source): ``instructions`` becomes a system message, a string ``input`` a user message, each
message item a message. The picker then keys the prompt like a chat's (``engine-prefix-matches``).

Only what is followed exactly is handed on: message items (``type`` "message" or none) whose
content is a string or text parts (an assistant's with one part: vLLM keeps the first part's text
of an output message). Anything else leaves the request to the approximate index: a
``previous_response_id`` (the server's stored conversation), tools, function calls and their
outputs, reasoning items, media, an unfinished last item (continued).

Why not tools (and so not the function calls of an agent's loop): vLLM hands the template each
tool as the ``FunctionTool`` of the openai package installed beside it dumps it, every field in
the model's order, absent ones as None, and that set changes between openai releases (3.57 has
``allowed_callers``, ``async_``, ``defer_loading`` and ``output_schema`` after ``type``), so the
rendered tools, and every token after them, follow the engine's openai version, which kvgate
cannot see. A guess would only mislead the engines' keys (``engine-prefix-matches``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.extproc.engine_values import engine_bool

_TEXT_PARTS = ("input_text", "output_text", "text")


def responses_messages(document: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...] | None:
    """The chat messages vLLM renders for this Responses API request, or None where kvgate does not
    build them exactly (see the module docstring)."""
    if document.get("previous_response_id") is not None:
        return None
    if document.get("tools") and document.get("tool_choice") != "none":
        return None
    messages: list[Mapping[str, Any]] = []
    instructions = document.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions not in (None, ""):
        return None
    items = document.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return tuple(messages)
    if not isinstance(items, list) or not items:
        return None
    for item in items:
        message = _message(item)
        if message is None:
            return None
        messages.append(message)
    return tuple(messages)


def _message(item: object) -> Mapping[str, Any] | None:
    if not isinstance(item, Mapping) or item.get("type", "message") != "message":
        return None
    if item.get("status") in ("in_progress", "incomplete"):
        return None  # vLLM continues such a message: not built here
    role, content = item.get("role"), item.get("content")
    if role not in ("user", "system", "developer", "assistant"):
        return None
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list) or not content:
        return None
    if not all(isinstance(p, Mapping) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
               for p in content):
        return None
    if role == "assistant" and len(content) != 1:
        return None  # an output message: vLLM keeps its first part's text only
    return {"role": role, "content": [{"type": "text", "text": p["text"]} for p in content]}


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A Responses API request's ids for the engine's response store: the id its response will be
    stored under (``added``: kvgate chose it and adds it to the body), and the stored response it
    continues. vLLM (with ``VLLM_ENABLE_RESPONSES_API_STORE``) keeps a response on the replica that
    served it under the request's ``request_id`` (a field clients may send, else a random one), and
    answers a ``previous_response_id`` only there: 404 on any other replica."""

    response_id: str | None
    previous_response_id: str | None
    added: bool


def stored_response(document: Mapping[str, Any]) -> StoredResponse:
    """The ids of this request (no id when it asks not to be stored: ``store`` false)."""
    previous = document.get("previous_response_id")
    previous = previous if isinstance(previous, str) and previous else None
    store = document.get("store")
    if store is not None and not engine_bool(store):  # (``"false"`` too: the engine reads it so)
        return StoredResponse(None, previous, added=False)
    if "request_id" in document:  # (one that is not a name: the engine answers it; nothing pinned)
        given = document["request_id"]
        return StoredResponse(given if isinstance(given, str) and given else None, previous, added=False)
    return StoredResponse("resp_" + uuid.uuid4().hex, previous, added=True)  # vLLM's own form
