"""vLLM's OpenAI-compatible HTTP API as pure functions: request parsing (the replies are
``simulator/openai_replies.py``).

No IO here. Parsing turns a decoded JSON body into a :class:`InferenceRequest` (or raises
:class:`ApiError` with vLLM's status and wording); render, tokenize and LoRA-admin bodies too.

Simulator semantics: ``max_tokens`` (or chat's ``max_completion_tokens``) is the exact output
length (ignore-EOS); without it a completion makes :data:`DEFAULT_COMPLETION_TOKENS` tokens and a
chat :data:`DEFAULT_CHAT_TOKENS`. ``n`` must be 1 and one prompt per completion request.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvgate.simulator import tokenizer
from kvgate.simulator.encode_memo import Encode, encode_direct
from kvgate.simulator.media import (
    DEFAULT_IMAGE_TOKENS,
    ImageTokens,
    MediaError,
    MediaSpan,
    expand_images,
    image_identifiers,
    image_token_counts,
    with_placeholders,
)
from kvgate.simulator.request_fields import ApiError, JsonObject, field_bool, field_int

DEFAULT_COMPLETION_TOKENS = 16
DEFAULT_CHAT_TOKENS = 128
MAX_MODEL_LEN = 131072

ApiKind = Literal["completion", "chat"]

@dataclass(frozen=True)
class InferenceRequest:
    kind: ApiKind
    model: str  # the name the client asked for (base model or an adapter)
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    cache_salt: str | None = None
    media: tuple[MediaSpan, ...] = ()
    """The prompt's images (``simulator.media``): their identifiers and token spans."""


def cache_salt(body: Mapping[str, Any]) -> str | None:
    """vLLM's ``cache_salt``: a non-empty string when given (vLLM's own check and message)."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ApiError(400, "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    return salt


def decode_json_object(raw: bytes) -> JsonObject:
    """The request body as a JSON object, or a 400."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return value


def requested_model(body: Mapping[str, Any], base_model: str) -> str:
    model = body.get("model")
    if model is None:
        return base_model  # vLLM serves its (first) model when the field is absent
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' must be a non-empty string", "model")
    return model


def check_model(model: str, served: Sequence[str]) -> None:
    if model not in served:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")


def completion_prompts(body: Mapping[str, Any], encode: Encode = encode_direct) -> list[tuple[int, ...]]:
    """The token ids of each prompt of a completions body (text, token ids, or a list of either)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise ApiError(400, "'prompt' must be a non-empty string, token list, or list of them", "prompt")
    prompts: list[tuple[int, ...]] = []
    for item in items:
        if isinstance(item, str):
            tokens = encode(item)
        elif isinstance(item, list) and all(_is_token_id(t) for t in item):
            tokens = tuple(item)
            if tokens and max(tokens) >= tokenizer.VOCAB_SIZE:  # vLLM's input check, its words
                raise ApiError(400, f"Token id {max(tokens)} is out of vocabulary", "prompt")
        else:
            raise ApiError(400, "each prompt must be a string or a list of token ids", "prompt")
        if not tokens:
            raise ApiError(400, "the prompt must not be empty", "prompt")
        prompts.append(tokens)
    return prompts


def chat_prompt(body: Mapping[str, Any], encode: Encode = encode_direct,
                image_tokens: ImageTokens = DEFAULT_IMAGE_TOKENS) -> tuple[int, ...]:
    return chat_prompt_media(body, encode, image_tokens)[0]


def chat_prompt_media(body: Mapping[str, Any], encode: Encode = encode_direct,
                      image_tokens: ImageTokens = DEFAULT_IMAGE_TOKENS,
                      ) -> tuple[tuple[int, ...], tuple[MediaSpan, ...]]:
    """A chat's prompt tokens (its images' placeholders expanded) and its images' spans."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, "each message must be an object with a 'role'", "messages")
    continued = body.get("continue_final_message") is True
    generation = body.get("add_generation_prompt", True) is not False
    if continued and generation:  # vLLM's check when both are sent, transformers' when one is default
        raise ApiError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                       "continue_final_message")
    tools = vllm_tools(body.get("tools"))
    try:
        images = image_identifiers(messages)
        counts = image_token_counts(messages, image_tokens) if images else []
        if images:
            messages = [{**m, "content": with_placeholders(m.get("content"))} for m in messages]
        rendered = tokenizer.render_chat(messages, add_generation_prompt=generation and not continued,
                                         continue_final_message=continued, tools=tools)
        if not images:
            return encode(rendered), ()
        return expand_images(rendered, images, encode, counts)
    except (MediaError, ValueError) as exc:
        raise ApiError(400, str(exc), "messages") from exc


def vllm_tools(value: object) -> list[dict[str, Any]] | None:
    """A chat's ``tools`` as vLLM's request model dumps them for the template (``type``, then
    ``function`` with ``name``, ``description``, ``parameters``, ``strict``, None where absent, a
    client's own fields after them); a 400 for what that model refuses."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ApiError(400, "'tools' must be a list", "tools")
    dumped: list[dict[str, Any]] = []
    for tool in value:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, "each tool needs a 'function' with a 'name'", "tools")
        declared = {"name": function["name"], "description": function.get("description"),
                    "parameters": function.get("parameters"), "strict": function.get("strict")}
        extra = {k: v for k, v in function.items() if k not in declared}
        entry: dict[str, Any] = {"type": tool.get("type", "function"), "function": {**declared, **extra}}
        entry.update({k: v for k, v in tool.items() if k not in entry})
        dumped.append(entry)
    return dumped


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_inference(kind: ApiKind, body: Mapping[str, Any], base_model: str,
                    encode: Encode = encode_direct,
                    image_tokens: ImageTokens = DEFAULT_IMAGE_TOKENS) -> InferenceRequest:
    model = requested_model(body, base_model)
    media: tuple[MediaSpan, ...] = ()
    if kind == "completion":
        prompts = completion_prompts(body, encode)
        if len(prompts) != 1:
            raise ApiError(400, "the simulator serves one prompt per completion request", "prompt")
        prompt_tokens = prompts[0]
        max_tokens = _max_tokens(body, ("max_tokens",), DEFAULT_COMPLETION_TOKENS)
    else:
        prompt_tokens, media = chat_prompt_media(body, encode, image_tokens)
        keys = ("max_completion_tokens", "max_tokens")
        max_tokens = _max_tokens(body, keys, DEFAULT_CHAT_TOKENS)
        if all(body.get(key) is None for key in keys):  # vLLM's chat: up to the rest of the context
            max_tokens = max(1, min(max_tokens, MAX_MODEL_LEN - len(prompt_tokens)))
    check_context(len(prompt_tokens), max_tokens)
    n = body.get("n", 1)
    if n not in (None, 1):
        raise ApiError(400, "the simulator supports n=1 only", "n")
    stream = field_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise ApiError(400, "'stream_options' must be an object", "stream_options")
        include_usage = field_bool(options, "include_usage")
    return InferenceRequest(
        kind=kind,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=bool(stream),
        include_usage=include_usage,
        cache_salt=cache_salt(body),
        media=media,
    )


def continuation_tokens(kind: ApiKind, body: Mapping[str, Any], prompt_tokens: Sequence[int], max_tokens: int,
                        encode: Encode = encode_direct, window: int = 256) -> tuple[int, ...]:
    """The ids the reply to this request has where a client resends it after the prompt: a chat's
    next turn (the rendered history, then the reply), a completion's prompt text and its completion.

    Only the prompt's last ``window`` characters are tokenized again, with the reply: cut where the
    tail's ids are the prompt's own last ids (before the last special token, or at a multiple of 4
    characters, the simulator's own rule), so a 32k-token prompt costs what a short one does. Empty
    where the prompt came as token ids or no such cut is found (the simulator's own rule cuts a
    prompt whose length is not a multiple of 4 characters mid-chunk): the engine then caches the
    prompt's blocks only (``SimRequest.output_tokens``)."""
    if kind == "chat":
        text = tokenizer.render_chat(body["messages"])
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return ()
        text = prompt
    reply = output_text(0, max_tokens)
    lead = len(encode(""))  # special tokens the tokenizer puts in front of any text (a BOS)
    base = max(0, len(text) - window)
    special = text.rfind("<|", base)
    space = text.find(" ", base)
    cuts = [c for c in (special, special - special % 4, base - base % 4, space) if c >= 0]
    for cut in dict.fromkeys(cuts):
        tail = encode(text[cut:])[lead:]
        if not tail or tuple(prompt_tokens[len(prompt_tokens) - len(tail):]) != tuple(tail):
            continue
        ids = encode(text[cut:] + reply)[lead:]
        if tuple(ids[:len(tail)]) == tuple(tail) and len(ids) >= len(tail) + max_tokens:
            return tuple(ids[len(tail):len(tail) + max_tokens])
    return ()


def check_context(prompt_tokens: int, max_tokens: int) -> None:
    """vLLM's 400s for a request past the model's context (its wording, which clients match to
    shorten and retry): a prompt longer than ``MAX_MODEL_LEN``, or a prompt and ``max_tokens`` that
    together are. Without the second, ``max_tokens: 100000000000`` made the simulator build that
    many tokens of reply text and grow until the machine ran out of memory."""
    limit = MAX_MODEL_LEN
    if prompt_tokens > limit:
        raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, your "
                            f"request has {prompt_tokens} input tokens. Please reduce the length of the "
                            "input messages.", "input_tokens")
    if prompt_tokens + max_tokens > limit:
        raise ApiError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                            f"model's maximum context length is {limit} tokens and your request has "
                            f"{prompt_tokens} input tokens ({max_tokens} > {limit} - {prompt_tokens}).",
                       "max_tokens")


def _max_tokens(body: Mapping[str, Any], keys: Sequence[str], default: int) -> int:
    for key in keys:
        value = field_int(body, key)
        if value is not None:
            return value
    return default


def new_request_id(kind: ApiKind) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex


def output_text(first_index: int, count: int) -> str:
    return "".join(tokenizer.output_text(i) for i in range(first_index, first_index + count))


def render_item(kind: ApiKind, model: str, token_ids: Sequence[int], body: Mapping[str, Any]) -> JsonObject:
    """One of vLLM's render results (a ``GenerateRequest``): what the engine would be handed."""
    default = DEFAULT_COMPLETION_TOKENS if kind == "completion" else DEFAULT_CHAT_TOKENS
    keys = ("max_tokens",) if kind == "completion" else ("max_completion_tokens", "max_tokens")
    stream = bool(body.get("stream", False))
    return {
        "request_id": new_request_id(kind),
        "token_ids": list(token_ids),
        "features": None,
        "sampling_params": {
            "n": 1,
            "temperature": body.get("temperature", 1.0),
            "top_p": body.get("top_p", 1.0),
            "max_tokens": _max_tokens(body, keys, default),
            "ignore_eos": True,
        },
        "model": model,
        "stream": stream,
        "stream_options": body.get("stream_options") if stream else None,
        "cache_salt": body.get("cache_salt"),
        "priority": body.get("priority", 0),
    }


def render_json(kind: ApiKind, model: str, token_ids_json: str, body: Mapping[str, Any]) -> str:
    """``json.dumps(render_item(...))`` with the token ids already serialised (a long prompt's list
    is the costly part: :class:`simulator.encode_memo.EncodeMemo` keeps it for the fleet)."""
    item = render_item(kind, model, (), body)
    item["token_ids"] = None
    head, sep, tail = json.dumps(item).partition('"token_ids": null')  # the first key after request_id
    return head + '"token_ids": ' + token_ids_json + tail if sep else head


def tokenize_tokens(body: Mapping[str, Any], encode: Encode = encode_direct,
                    image_tokens: ImageTokens = DEFAULT_IMAGE_TOKENS) -> tuple[int, ...]:
    """``POST /tokenize`` takes ``prompt`` (text) or chat ``messages``."""
    if "messages" in body:
        return chat_prompt(body, encode, image_tokens)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string (or send 'messages')", "prompt")
    return encode(prompt)


def detokenize_text(body: Mapping[str, Any]) -> str:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(_is_token_id(t) for t in tokens):
        raise ApiError(400, "'tokens' must be a list of token ids", "tokens")
    return tokenizer.decode(tokens)


def lora_request_fields(body: Mapping[str, Any], need_path: bool) -> tuple[str, str]:
    """``lora_name`` and ``lora_path`` of vLLM's load/unload adapter bodies."""
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'lora_name' must be a non-empty string", "lora_name")
    path = body.get("lora_path")
    if need_path and (not isinstance(path, str) or not path):
        raise ApiError(400, "'lora_path' must be a non-empty string", "lora_path")
    return name, path if isinstance(path, str) else ""
