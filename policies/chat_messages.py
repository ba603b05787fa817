"""A chat request's messages as vLLM hands them to the chat template (sans-IO).

vLLM does not render the messages as sent: ``chat_utils._parse_chat_message_content`` rebuilds each
one (read in vLLM's source) and ``_postprocess_messages`` rewrites tool calls:

- ``role`` and ``content``: a string is one text part, None none; text parts (``text``,
  ``input_text``, ``output_text``, ``refusal``, ``thinking``) and media parts become, for a template
  that loops over content (the "openai" format), ``{"type": "text", "text": ...}`` and
  ``{"type": <modality>}``; for any other (the "string" format) the texts joined with newlines, the
  media placeholders in front (``policies.media``). A tool message's text parts are joined into one
  string either way.
- Kept besides: an assistant's ``tool_calls`` (unless None) and ``reasoning`` (also as
  ``reasoning_content``), a tool message's ``tool_call_id``, ``name`` and ``task`` when strings, a
  developer message's ``tools``. Every other field is dropped (an OpenAI client that sends back the
  assistant message it received sends ``refusal``, ``audio``, ``function_call``, ``tool_calls``
  as null).
- A tool call's ``arguments``: a JSON string is parsed (invalid JSON: ``{}``), anything but an
  object or array becomes ``{}``; an empty ``tool_calls`` list is dropped.

A part vLLM refuses (no ``type``, an unknown one) raises ``ValueError``: the engine answers 400, so
there is nothing to predict.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kvgate.policies.media import MEDIA_PART_TYPES, ContentFormat, is_media_part, string_content

TEXT_PART_KEYS: Mapping[str, str] = {"text": "text", "input_text": "text", "output_text": "text",
                                     "refusal": "refusal", "thinking": "thinking"}
"""Text part types → the field holding their text."""


def vllm_conversation(messages: Sequence[Mapping[str, Any]], content_format: ContentFormat,
                      placeholders: Mapping[str, str]) -> list[dict[str, Any]]:
    """``messages`` as vLLM gives them to the template (see the module docstring); new objects, the
    request's own are not changed."""
    conversation = [_message(message, content_format, placeholders) for message in messages]
    for message in conversation:
        calls = message.get("tool_calls")
        if message.get("role") != "assistant" or not isinstance(calls, list):
            continue
        if not calls:
            del message["tool_calls"]
            continue
        message["tool_calls"] = [_with_parsed_arguments(call) for call in calls]
    return conversation


def _message(message: Mapping[str, Any], content_format: ContentFormat,
             placeholders: Mapping[str, str]) -> dict[str, Any]:
    role = message.get("role")
    out: dict[str, Any] = {"role": role} if "role" in message else {}  # (vLLM refuses a message without)
    out["content"] = _content(message.get("content"), content_format, placeholders)
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ValueError("tool_calls must be a list")  # vLLM's request model refuses it
            out["tool_calls"] = list(calls)
        reasoning = message.get("reasoning")
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        content = out["content"]
        if isinstance(content, list) and all(p.get("type") == "text" for p in content):
            out["content"] = "\n".join(p["text"] for p in content)
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if role == "developer":
        out["tools"] = message.get("tools")
    return out


def _content(content: object, content_format: ContentFormat, placeholders: Mapping[str, str]) -> object:
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        raise ValueError("message content must be a string or a list of parts")
    items: list[Mapping[str, Any]] = []  # text parts as {"type": "text", "text": ...}, media parts as sent
    for part in parts:
        if isinstance(part, str):
            items.append({"type": "text", "text": part})
            continue
        if not isinstance(part, Mapping):
            raise ValueError("a content part must be an object or a string")
        kind = part.get("type")
        if isinstance(kind, str) and kind in TEXT_PART_KEYS:
            text = part.get(TEXT_PART_KEYS[kind])
            if text is None:
                continue  # vLLM skips a text part without text
            if not isinstance(text, str):
                raise ValueError(f"a {kind} part's text must be a string")
            items.append({"type": "text", "text": text})
        elif is_media_part(part):
            items.append(part)
        else:
            raise ValueError(f"a content part vLLM does not take: {kind!r}")
    if content_format == "openai":
        return [item if item["type"] == "text" else {"type": MEDIA_PART_TYPES[item["type"]]}
                for item in items]
    return string_content(items, placeholders)


def _with_parsed_arguments(call: object) -> object:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    call = copy.deepcopy(dict(call))
    function = call["function"]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments)
        except ValueError:
            function["arguments"] = {}
    elif not isinstance(arguments, dict | list):
        function["arguments"] = {}
    return call
