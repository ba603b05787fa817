"""What a prompt becomes, without generating: vLLM's ``POST /tokenize``, ``POST /detokenize``,
``POST /v1/messages/count_tokens`` (Anthropic's: a Messages request's prompt tokens),
``POST /v1/completions/render`` and ``POST /v1/chat/completions/render`` (the routers that tokenize
through the engine, vllm-router's among them, call them), and the simulator's ``POST /sim/peek``
(the cached prefix, queue and estimated wait a request would meet now: the oracle router's view).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from kvgate.simulator import anthropic_api
from kvgate.simulator import openai_api as api
from kvgate.simulator.encode_memo import EncodeMemo
from kvgate.simulator.engine_types import PeekResult
from kvgate.simulator.http_replies import error_response, json_response, json_text_response
from kvgate.simulator.media import DEFAULT_IMAGE_TOKENS, ImageTokens, MediaSpan
from kvgate.simulator.request_fields import ApiError

Peek = Callable[[tuple[int, ...], str, str | None, tuple[MediaSpan, ...]], PeekResult]
"""(prompt tokens, model, cache salt, images' spans) -> what the engine would meet now."""


class PromptRoutes:
    def __init__(self, base_model: str, served_models: Callable[[], Sequence[str]], memo: EncodeMemo,
                 peek: Peek, image_tokens: ImageTokens = DEFAULT_IMAGE_TOKENS) -> None:
        self._base_model = base_model
        self._served_models = served_models
        self._memo = memo
        self._peek = peek
        self._image_tokens = image_tokens

    async def _checked_body(self, request: web.Request) -> tuple[dict[str, Any], str]:
        body = api.decode_json_object(await request.read())
        model = api.requested_model(body, self._base_model)
        api.check_model(model, self._served_models())
        return body, model

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body, _ = await self._checked_body(request)
            tokens = api.tokenize_tokens(body, self._memo, self._image_tokens)
        except ApiError as err:
            return error_response(err)
        return json_response({"count": len(tokens), "max_model_len": api.MAX_MODEL_LEN,
                              "tokens": list(tokens), "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body, _ = await self._checked_body(request)
            return json_response({"prompt": api.detokenize_text(body)})
        except ApiError as err:
            return error_response(err)

    async def render_completions(self, request: web.Request) -> web.Response:
        try:
            body, model = await self._checked_body(request)
            prompts = api.completion_prompts(body, self._memo)
            items = [api.render_json("completion", model, self._memo.tokens_json(t), body) for t in prompts]
            return json_text_response("[" + ", ".join(items) + "]")
        except ApiError as err:
            return error_response(err)

    async def render_chat(self, request: web.Request) -> web.Response:
        try:
            body, model = await self._checked_body(request)
            tokens = api.chat_prompt(body, self._memo, self._image_tokens)
            return json_text_response(api.render_json("chat", model, self._memo.tokens_json(tokens), body))
        except ApiError as err:
            return error_response(err)

    async def peek(self, request: web.Request) -> web.Response:
        try:
            body, model = await self._checked_body(request)
            media: tuple[MediaSpan, ...] = ()
            if "messages" in body:
                tokens, media = api.chat_prompt_media(body, self._memo, self._image_tokens)
            else:
                tokens = api.completion_prompts(body, self._memo)[0]
            salt = api.cache_salt(body)
        except ApiError as err:
            return error_response(err)
        found = self._peek(tokens, model, salt, media)
        return json_response({
            "cached_tokens": found.cached_tokens,
            "prompt_tokens": len(tokens),
            "waiting": found.waiting,
            "running": found.running,
            "estimated_wait_s": found.estimated_wait,
        })

    async def count_message_tokens(self, request: web.Request) -> web.Response:
        """The prompt tokens of a Messages request (``{"input_tokens": n}``), as vLLM counts them."""
        try:
            body = anthropic_api.chat_body(api.decode_json_object(await request.read()), counting=True)
            api.check_model(api.requested_model(body, self._base_model), self._served_models())
            tokens = api.chat_prompt(body, self._memo, self._image_tokens)
        except ApiError as err:
            return json_response(anthropic_api.error_body(err), err.status)
        return json_response({"input_tokens": len(tokens)})
