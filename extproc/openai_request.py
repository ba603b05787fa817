"""Read what routing needs from an OpenAI-compatible request body, and prepare the upstream body.

Only routing fields are read: the model, the prompt text for prefix hashing (chat messages
flattened in order), ``stream`` / ``stream_options``, ``cache_salt`` and the token limit.
The body is rewritten only when it must change: the gateway sets
``stream_options.include_usage`` on streaming completions so that usage is always known, and a
model rewrite replaces ``model``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from kvgate.extproc.engine_values import engine_bool, engine_int
from kvgate.extproc.model_names import check_model_name
from kvgate.policies.errors import BadRequestError, MalformedBodyError, PayloadTooLargeError
from kvgate.policies.types import ApiKind

_API_SUFFIXES: tuple[tuple[str, ApiKind], ...] = (
    ("/v1/chat/completions", ApiKind.CHAT_COMPLETIONS),
    ("/v1/completions", ApiKind.COMPLETIONS),
    ("/v1/embeddings", ApiKind.EMBEDDINGS),
    ("/v1/responses", ApiKind.RESPONSES),
    ("/v1/messages", ApiKind.MESSAGES),
)
_USAGE_STREAMING_APIS = frozenset({ApiKind.COMPLETIONS, ApiKind.CHAT_COMPLETIONS})


def api_kind(path: str) -> ApiKind:
    """The API a request targets, from the suffix of its ``:path`` (query string ignored)."""
    route = path.split("?", 1)[0].rstrip("/")
    for suffix, kind in _API_SUFFIXES:
        if route.endswith(suffix):
            return kind
    return ApiKind.OTHER


class BodyBuffer:
    """Collects body chunks and refuses to hold more than ``limit`` bytes (413)."""

    __slots__ = ("_chunks", "_limit", "_size")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0

    @property
    def size(self) -> int:
        return self._size

    def append(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._limit:
            self._chunks.clear()
            raise PayloadTooLargeError(f"request body exceeds the gateway limit of {self._limit} bytes")
        if data:
            self._chunks.append(data)

    def take(self) -> bytes:
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        return data


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    """The routing view of a request body. ``document`` is the parsed JSON object."""

    api: ApiKind
    model: str
    prompt: str
    stream: bool
    usage_requested: bool
    cache_salt: str | None
    max_tokens: int | None
    document: dict[str, Any]
    media_named: int = 0
    """Inline media items the gateway named with their digest (``name_inline_media``)."""
    engine_prompt: str | tuple[int, ...] | None = None
    """A completion's prompt as the engine receives it (text or token ids; ``()``: a batch of
    prompts); None for other APIs."""


@dataclass(frozen=True, slots=True)
class UpstreamBody:
    """The body to send upstream; ``rewritten`` if it differs from the client's, ``usage_injected``
    if the gateway turned on ``stream_options.include_usage`` (the client did not ask for usage)."""

    data: bytes
    rewritten: bool
    usage_injected: bool


TOO_DEEP = "request body nests JSON arrays or objects too deeply"


def parse_request_body(api: ApiKind, raw: bytes, *, name_media: bool = False) -> OpenAIRequest:
    """Parse ``raw`` for routing. Raises MalformedBodyError / BadRequestError (400), nothing else
    (InvalidModelNameError for a ``model`` the gateway refuses: ``extproc.model_names``).
    ``name_media``: name a chat's inline media items the client did not name (``name_inline_media``).

    A body nested deeper than the interpreter's recursion limit (about 1,000 levels, far beyond
    any OpenAI request) is refused as soon as the decoder reaches that depth.
    """
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedBodyError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise MalformedBodyError(TOO_DEEP) from None
    if not isinstance(document, dict):
        raise BadRequestError("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw) is not None:  # rare outside emoji from ASCII clients
        _refuse_lone_surrogates(raw, document)
    model = document.get("model")
    if model is None or model == "":
        raise BadRequestError("'model' is required")
    if not isinstance(model, str):
        raise BadRequestError(f"'model' must be a string, not {_json_type(model)}")
    check_model_name(model)
    named = 0
    if name_media and api is ApiKind.CHAT_COMPLETIONS and isinstance(document.get("messages"), list):
        named = name_inline_media(document["messages"])
    try:
        prompt = _prompt_of(api, document)
    except RecursionError:  # content parts serialised for hashing, nested near the limit
        raise MalformedBodyError(TOO_DEEP) from None
    stream = engine_bool(document.get("stream"))
    options = document.get("stream_options")
    usage_requested = isinstance(options, dict) and engine_bool(options.get("include_usage"))
    salt = document.get("cache_salt")
    return OpenAIRequest(
        api=api,
        model=model,
        prompt=prompt,
        stream=stream,
        usage_requested=usage_requested,
        cache_salt=salt if isinstance(salt, str) and salt else None,
        max_tokens=_max_tokens(document),
        document=document,
        media_named=named,
        engine_prompt=_engine_prompt(api, document),
    )


def upstream_body(
    request: OpenAIRequest, raw: bytes, target_model: str, *, inject_usage: bool,
    added: Mapping[str, str] | None = None,
) -> UpstreamBody:
    """The body to forward: ``raw`` untouched unless the model or ``stream_options`` must change,
    or fields the body lacks are ``added`` (spliced in after the opening brace when nothing else
    changes: no second pass over a long conversation)."""
    inject = inject_usage and request.stream and not request.usage_requested and (
        request.api in _USAGE_STREAMING_APIS
    )
    if not inject and target_model == request.model and not request.media_named:
        if added:
            return UpstreamBody(_spliced(raw, added), rewritten=True, usage_injected=False)
        return UpstreamBody(raw, rewritten=False, usage_injected=False)
    document = dict(request.document)
    document["model"] = target_model
    document.update(added or {})
    if inject:
        options = document.get("stream_options")
        document["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    try:
        data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    except RecursionError:
        raise MalformedBodyError(TOO_DEEP) from None
    return UpstreamBody(data, rewritten=True, usage_injected=inject)


def _spliced(raw: bytes, added: Mapping[str, str]) -> bytes:
    """``raw`` (a JSON object with at least one member: ``model``) with ``added`` as its first
    members."""
    at = raw.index(b"{") + 1
    members = b"".join(json.dumps(key).encode() + b":" + json.dumps(value).encode() + b","
                       for key, value in added.items())
    return raw[:at] + members + raw[at:]


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A surrogate's escape, or what looks like one after an escaped backslash (confirmed on the parsed
document): one regular-expression pass, ~0.4 ms a megabyte of base64 against 1.6 for two substring
searches (an image's data URL)."""
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"  # high, no low after it
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # low, no high before it
)


def _refuse_lone_surrogates(raw: bytes, document: dict[str, Any]) -> None:
    """400 for a string with an unpaired UTF-16 surrogate (``"\\ud800"``): valid JSON that no UTF-8
    text holds, so a model server cannot tokenize it (vLLM-like servers answered 500, which Envoy
    retried on two more replicas and counted against them). The escapes are found in the raw body;
    a hit (or an escaped backslash that looks like one) is confirmed on the parsed document."""
    if _LONE_SURROGATE.search(raw) is None:
        return
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequestError(
            "request body holds a string with an unpaired UTF-16 surrogate (not valid Unicode text)"
        ) from None


def _json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null" if value is None else type(value).__name__


def _prompt_of(api: ApiKind, document: dict[str, Any]) -> str:
    if api is ApiKind.COMPLETIONS:
        prompt = _flatten_input(document.get("prompt"))
        if not prompt:
            raise BadRequestError("'prompt' is required and must not be empty")
        return prompt
    if api is ApiKind.CHAT_COMPLETIONS:
        messages = document.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("'messages' must be a non-empty list")
        return _flatten_messages(messages)
    if api is ApiKind.EMBEDDINGS:
        text = _flatten_input(document.get("input"))
        if not text:
            raise BadRequestError("'input' is required and must not be empty")
        return text
    if api is ApiKind.RESPONSES:
        instructions = document.get("instructions")
        head = instructions + "\n" if isinstance(instructions, str) else ""
        items = document.get("input")
        if not isinstance(items, str | list):
            raise BadRequestError("'input' must be a string or a list of input items")
        return head + (_flatten_messages(items) if isinstance(items, list) else items)
    if api is ApiKind.MESSAGES:
        return _flatten_anthropic(document)
    return ""


def _engine_prompt(api: ApiKind, document: dict[str, Any]) -> str | tuple[int, ...] | None:
    """A completion's prompt (``_prompt_of`` checked its shape): a string, a list of token ids, or a
    list holding one of either; ``()`` for several."""
    if api is not ApiKind.COMPLETIONS:
        return None
    prompt = document.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        return tuple(prompt)
    return ()


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flatten_input(value: object) -> str:
    """A prompt / input: a string, a list of strings, a token list, or a list of token lists."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if all(isinstance(item, str) for item in value):
            return "\n".join(value)
        if all(isinstance(item, int) for item in value):
            return " ".join(map(str, value))
        if all(isinstance(item, list) and all(isinstance(t, int) for t in item) for item in value):
            return "\n".join(" ".join(map(str, item)) for item in value)
        raise BadRequestError("prompt must be a string, a list of strings or token lists")
    if value is None or value == []:
        return ""
    raise BadRequestError("prompt must be a string, a list of strings or token lists")


def _flatten_messages(messages: list[Any]) -> str:
    """``role: content`` lines in message order; content parts joined (non-text parts as JSON)."""
    lines: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequestError("each message must be an object")
        role = message.get("role", "")
        lines.append(f"{role}: {_content_text(message.get('content'))}")
    return "\n".join(lines)


def _flatten_anthropic(document: dict[str, Any]) -> str:
    """A Messages API request's prompt for hashing: its system prompt, its tools (as JSON, in front
    of the conversation as templates put them), then ``role: content`` lines (content blocks'
    text; other blocks as JSON), so each turn's prompt starts with the last turn's."""
    messages = document.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' must be a non-empty list")
    system = document.get("system")
    if not isinstance(system, str | list | None):
        raise BadRequestError("'system' must be a string or a list of text blocks")
    head = _content_text(system) + "\n" if system is not None else ""
    tools = document.get("tools")
    if isinstance(tools, list) and tools:
        head += json.dumps(tools, separators=(",", ":"), sort_keys=True) + "\n"
    return head + _flatten_messages(messages)


MAX_PART_CHARS = 256
"""A non-text content part longer than this as JSON (an inline image's base64, an audio clip) is
hashed as a short stand-in, its digest: its bytes are no prompt text (the engine turns an image
into its own count of tokens), and read as text they made a 1 MB image a 250,000-token prompt to
the cost model and the disaggregation decider, and cost a hash per 256 characters."""


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                parts.append(_part_text(part))
        return "".join(parts)
    raise BadRequestError("message content must be a string or a list of parts")


_INLINE_URL_PARTS = ("image_url", "video_url", "audio_url")


def name_inline_media(messages: list[Any]) -> int:
    """Give each media part whose data is inline (a ``data:`` URL, base64 audio or embeddings) and
    that has no ``uuid`` one: ``kvgate-`` and the SHA-256 of its data. vLLM identifies an item by its
    ``uuid`` for all its caches (prefix cache, encoder cache) instead of hashing the decoded media,
    so the picker knows the identifier the engine keys the item's blocks with
    (``policies.media_prompt``). Only inline data: the same bytes are the same item; a URL's
    content may change behind it, so those are left to the engine. Returns how many were named."""
    named = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or part.get("uuid") is not None:
                continue
            data = _inline_data(part)
            if data is not None:
                part["uuid"] = "kvgate-" + hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()
                named += 1
    return named


def _inline_data(part: dict[str, Any]) -> str | None:
    kind = part.get("type")
    if kind in _INLINE_URL_PARTS:
        value = part.get(kind)
        url = value.get("url") if isinstance(value, dict) else value
        return url if isinstance(url, str) and url.startswith("data:") else None
    if kind == "input_audio":
        audio = part.get("input_audio")
        if isinstance(audio, dict) and isinstance(audio.get("data"), str):
            return f"{audio.get('format')}:{audio['data']}"
        return None
    if kind == "image_embeds":
        embeds = part.get("image_embeds")
        if isinstance(embeds, str | dict):
            return json.dumps(embeds, sort_keys=True, separators=(",", ":"))
    return None


def _part_text(part: object) -> str:
    """A non-text part as prompt text for hashing: its JSON, or for a part that names itself (vLLM's
    ``uuid``: the same item, sent with its data or without) or a long one, a stand-in that differs
    between items and is the same for the same item (a digest of its leaves, without writing the
    part out as JSON: 2.3 ms a megabyte)."""
    uuid = part.get("uuid") if isinstance(part, dict) else None
    kind = part.get("type") if isinstance(part, dict) else None
    if isinstance(uuid, str) and uuid:
        return f"<{kind} {uuid}>"
    if _chars(part, MAX_PART_CHARS) <= MAX_PART_CHARS:
        return json.dumps(part, sort_keys=True, separators=(",", ":"))
    digest = xxhash.xxh3_128()
    _digest(part, digest)
    return f"<{kind} {digest.hexdigest()}>"


def _chars(value: object, limit: int) -> int:
    """About the length of ``value`` as JSON, counted until it exceeds ``limit``."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        total = 2
        for key, item in value.items():
            total += len(str(key)) + 4 + _chars(item, limit)
            if total > limit:
                break
        return total
    if isinstance(value, list):
        total = 2
        for item in value:
            total += _chars(item, limit) + 1
            if total > limit:
                break
        return total
    return 8


def _digest(value: object, digest: Any) -> None:
    """Each leaf of ``value`` and its place (keys sorted), into ``digest``."""
    if isinstance(value, str):
        digest.update(b"s%d:" % len(value))
        digest.update(value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, dict):
        digest.update(b"{")
        for key in sorted(value, key=str):
            digest.update(str(key).encode("utf-8", "surrogatepass") + b"=")
            _digest(value[key], digest)
        digest.update(b"}")
    elif isinstance(value, list):
        digest.update(b"[")
        for item in value:
            _digest(item, digest)
        digest.update(b"]")
    else:
        digest.update(repr(value).encode())


def _max_tokens(document: dict[str, Any]) -> int | None:
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = engine_int(document.get(key))
        if value is not None:
            return value
    return None
