"""An Anthropic Messages API request (``POST /v1/messages``) as the chat vLLM serves it (sans-IO).

vLLM's ``/v1/messages`` converts the request into a chat completion and renders it through the
model's chat template like any chat (``anthropic/serving.py``: ``_convert_anthropic_to_openai_request``,
read in vLLM's source): ``system`` (a string, or text blocks joined with nothing between them) a
system message; each message's content a string, or blocks: text blocks as text parts (a message
with one text part has it as its content), ``tool_use`` blocks as the message's tool calls (their
``input`` as a JSON string), a user's ``tool_result`` blocks as ``tool`` messages in front of it
(its content as a string: a list of blocks as Python's ``str`` writes it, as vLLM does; the block's
``id`` as the call's id, as vLLM reads it), a message left with nothing dropped. Tools become chat
tools (``name``, ``description``, ``input_schema`` as the parameters, ``"type": "object"`` added
where missing), rendered as a chat's are.

So agents that speak Anthropic's API to a vLLM fleet (long system prompts and tool lists resent
every turn) are keyed exactly, token for token, by ``engine-prefix-matches``. Only what is followed
exactly is handed on: images, thinking blocks (vLLM's releases differ on them), an assistant's
tool result, or any other block leave the request to the approximate index.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Chat = tuple[tuple[Mapping[str, Any], ...], tuple[Mapping[str, Any], ...] | None]
"""The chat messages and its tools (None: no tools)."""


def anthropic_chat(document: Mapping[str, Any]) -> Chat | None:
    """The chat vLLM renders for this Messages API request, or None where kvgate does not build
    it exactly (see the module docstring)."""
    messages: list[Mapping[str, Any]] = []
    system = document.get("system")
    if isinstance(system, list):
        texts = [block.get("text") for block in system if isinstance(block, Mapping)]
        if len(texts) != len(system) or any(b.get("type") != "text" for b in system):
            return None
        system = "".join(t for t in texts if isinstance(t, str) and t)
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    elif system not in (None, ""):
        return None
    turns = document.get("messages")
    if not isinstance(turns, list) or not turns:
        return None
    for turn in turns:
        if not _add_turn(turn, messages):
            return None
    tools = document.get("tools")
    if tools is None:
        return tuple(messages), None
    if not isinstance(tools, list):
        return None
    converted = [_tool(tool) for tool in tools]
    if any(tool is None for tool in converted):
        return None
    return tuple(messages), tuple(t for t in converted if t is not None)


def _add_turn(turn: object, messages: list[Mapping[str, Any]]) -> bool:
    """Append ``turn`` as vLLM converts it (and the tool messages in front of it); False where it
    is not followed."""
    if not isinstance(turn, Mapping) or turn.get("role") not in ("user", "assistant"):
        return False
    role, content = turn["role"], turn.get("content")
    if isinstance(content, str):
        messages.append({"role": role, "content": content})
        return True
    if not isinstance(content, list):
        return False
    parts: list[Mapping[str, Any]] = []
    calls: list[Mapping[str, Any]] = []
    for block in content:
        if not isinstance(block, Mapping):
            return False
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str | None):
                return False
            if text:
                parts.append({"type": "text", "text": text})
        elif kind == "tool_use":
            arguments = block.get("input") or {}
            if not isinstance(arguments, Mapping) or not isinstance(block.get("id"), str):
                return False  # (vLLM names a call without an id by the clock)
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block.get("name") or "", "arguments": json.dumps(arguments)}})
        elif kind == "tool_result" and role == "user":
            result = block.get("content")
            if not isinstance(result, str | list | None):
                return False
            # a list of blocks (as agents send tool output) is rendered by Python's str(), as vLLM's
            # model holds it: the JSON's dicts in their order, their values as Python writes them
            text = str(result) if result else ""
            messages.append({"role": "tool", "tool_call_id": block.get("id") or "", "content": text})
        else:
            return False
    message: dict[str, Any] = {"role": role}
    if calls:
        message["tool_calls"] = calls
    if parts:
        message["content"] = parts[0]["text"] if len(parts) == 1 else parts
    elif not calls:
        return True  # nothing left of it: vLLM drops it
    messages.append(message)
    return True


def _tool(tool: object) -> Mapping[str, Any] | None:
    if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
        return None
    schema = tool.get("input_schema")
    if not isinstance(schema, Mapping):
        return None
    parameters = dict(schema) if "type" in schema else {**schema, "type": "object"}
    function = {"name": tool["name"], "description": tool.get("description"), "parameters": parameters}
    return {"type": "function", "function": function}
