"""The simulator's deterministic tokenizer: one token per 4 characters.

The simulator has no real vocabulary. It only needs token counts that look like a Llama tokenizer's
(about 4 characters per token for English text) and token ids that are the same for the same text,
so that prefix caching, usage accounting and cache-aware routers behave as they would against vLLM.

Rules (stable across releases; tests rely on them):

- ``encode(text)`` cuts the text into chunks of ``CHARS_PER_TOKEN`` (4) *characters*, from the start;
  the last chunk may be shorter. Each chunk becomes one token whose id is
  ``zlib.crc32(chunk.encode("utf-32-le")) % VOCAB_SIZE``. So ``len(encode(text)) ==
  ceil(len(text) / 4)``, the empty text has no tokens, and the encoding is *prefix-stable*: the tokens
  of ``text[:4 * k]`` are the first ``k`` tokens of ``encode(text)``. Two prompts that share their
  first ``n`` characters share their first ``n // 4`` tokens.
- ``decode(tokens)`` is *not* an inverse (ids are hashes): it returns 4 characters of filler per token
  (a 3-letter word and a space, picked by the id), so ``len(encode(decode(t))) == len(t)``.
- ``output_text(index)`` is the text of generated token ``index``: a 3-letter word and a space, so a
  completion of ``n`` tokens has ``4 * n`` characters and re-encodes to ``n`` tokens.
- ``render_chat(messages)`` renders OpenAI chat messages with the Llama-3 chat template and ends with
  the assistant header, so chats that share a system prompt share a token prefix.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence

CHARS_PER_TOKEN = 4
VOCAB_SIZE = 128256  # Llama-3's vocabulary size

_BYTES_PER_CHUNK = CHARS_PER_TOKEN * 4  # utf-32: 4 bytes per character

WORDS: tuple[str, ...] = (  # the filler and the benchmarks' prompts; whole tokens in the repository's
    # tokenizer.json (scripts/build_sim_tokenizer.py), so their text is ~4 characters per token there too
    "the ", "and ", "for ", "are ", "but ", "not ", "you ", "all ", "any ", "can ", "had ", "her ",
    "was ", "one ", "our ", "out ", "day ", "get ", "has ", "him ", "his ", "how ", "man ", "new ",
    "now ", "old ", "see ", "two ", "way ", "who ", "boy ", "did ", "its ", "let ", "put ", "say ",
    "she ", "too ", "use ", "top ", "sun ", "sky ", "sea ", "red ", "big ", "far ", "end ", "art ",
)


def encode(text: str) -> list[int]:
    """Token ids of ``text``: one per 4-character chunk (see the module docstring)."""
    data = text.encode("utf-32-le")
    crc = zlib.crc32
    step = _BYTES_PER_CHUNK
    return [crc(data[i : i + step]) % VOCAB_SIZE for i in range(0, len(data), step)]


def count_tokens(text: str) -> int:
    """``len(encode(text))`` without hashing: ``ceil(len(text) / 4)``."""
    return -(-len(text) // CHARS_PER_TOKEN)


def decode(tokens: Sequence[int]) -> str:
    """Deterministic filler text, 4 characters per token (not an inverse of ``encode``)."""
    words = WORDS
    n = len(words)
    return "".join(words[t % n] for t in tokens)


def output_text(index: int) -> str:
    """The text of generated token ``index`` (``index >= 0``): a 3-letter word and a space."""
    return WORDS[index % len(WORDS)]


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)  # vLLM's "string" content format for text-only models
    return str(content)


def render_chat(messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True,
                continue_final_message: bool = False, tools: Sequence[object] | None = None) -> str:
    """The Llama-3 chat template text of ``messages``, ending with the assistant header (vLLM's
    ``add_generation_prompt``, true unless the request says otherwise), or, with
    ``continue_final_message``, cut after the last message's content (stripped), as transformers
    cuts it for vLLM.

    Content may be a string or a list of OpenAI content parts (only text parts count, joined with
    newlines as vLLM joins them for a text-only model). As Llama 3.1 does, ``tools`` (already as
    vLLM dumps them: ``openai_api.vllm_tools``) go in front in a system block, and an assistant
    message's tool calls after its content, each ``<|python_tag|>`` and ``{"name", "parameters"}``
    (its arguments parsed, as vLLM parses them before the template).
    """
    out = ["<|begin_of_text|>"]
    if tools:
        listed = json.dumps(list(tools), ensure_ascii=False)
        out.append(f"<|start_header_id|>system<|end_header_id|>\n\nTools: {listed}<|eot_id|>")
    for message in messages:
        role = message.get("role", "user")
        out.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n")
        out.append(_content_text(message.get("content")))
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls is not None and not isinstance(calls, list):
            raise ValueError("tool_calls must be a list")
        if calls:
            for call in calls:
                function = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(function, Mapping):
                    raise ValueError("a tool call without a function")
                called = {"name": function.get("name"), "parameters": _arguments(function.get("arguments"))}
                out.append("<|python_tag|>" + json.dumps(called, ensure_ascii=False))
        out.append("<|eot_id|>")
    if continue_final_message:
        text = "".join(out)
        final = _content_text(messages[-1].get("content")).strip() if messages else ""
        if not final or final not in text:
            raise ValueError("continue_final_message: the final message is not in the rendered chat")
        return text[: text.rindex(final) + len(final)]
    if add_generation_prompt:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def _arguments(value: object) -> object:
    """A tool call's arguments as vLLM hands them to the template: a JSON string parsed (invalid:
    ``{}``), anything but an object or array ``{}``."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict | list) else {}
