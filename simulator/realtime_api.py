"""vLLM's realtime transcription API (``GET /v1/realtime``, a WebSocket), as vLLM serves it
(``vllm/entrypoints/openai/realtime``).

The server says ``session.created``; the client names its model with ``session.update`` (a model
the replica does not serve: an ``error`` event), appends audio with ``input_audio_buffer.append``
(base64 PCM16 at 16 kHz, mono) and asks for its transcription with ``input_audio_buffer.commit``;
the server streams ``transcription.delta`` events, one per output token, then
``transcription.done`` with the text and the token ``usage``. A commit before ``session.update``
is the ``error`` ``model_not_validated``; an unknown event is ``unknown_event``; text that is not
JSON is ``invalid_json``: the session stays open after each, as vLLM's does.

Each commit runs through the engine as the transcription request it is (``audio_api``'s cost:
encoder positions per 30-second window, 3 output tokens a second of audio), so realtime sessions
load the replica and show in its metrics as any request does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import WSMsgType, web

from kvgate.simulator import tokenizer
from kvgate.simulator.audio_api import AUDIO_BYTES_FIELD, AUDIO_DIGEST_FIELD, TranscriptionShape
from kvgate.simulator.driver import EngineDriver
from kvgate.simulator.engine_types import SimRequest
from kvgate.simulator.openai_api import InferenceRequest

ParseChat = Callable[[dict[str, Any]], InferenceRequest]


class RealtimeApi:
    """The replica's ``/v1/realtime`` sessions (``handle`` is the aiohttp handler)."""

    def __init__(self, driver: EngineDriver, base_model: str, served_models: Callable[[], Iterable[str]],
                 parse_chat: ParseChat) -> None:
        self._driver = driver
        self._shape = TranscriptionShape(base_model)
        self._served_models = served_models
        self._parse_chat = parse_chat
        self.sessions = 0
        self.transcriptions = 0

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        self.sessions += 1
        await _send(socket, {"type": "session.created", "id": f"sess-{uuid.uuid4().hex}",
                             "created": int(time.time())})
        audio = bytearray()
        model: str | None = None
        generation: asyncio.Task[None] | None = None
        try:
            async for message in socket:
                if message.type is not WSMsgType.TEXT:
                    continue
                try:
                    event = json.loads(message.data)
                except ValueError:
                    await _error(socket, "Invalid JSON", "invalid_json")
                    continue
                kind = event.get("type") if isinstance(event, dict) else None
                if kind == "session.update":
                    model = str(event.get("model") or self._shape.chat_body({})["model"])
                    if model not in set(self._served_models()):
                        await _error(socket, f"The model `{model}` does not exist.", "model_not_found")
                        model = None
                elif kind == "input_audio_buffer.append":
                    try:
                        chunk = base64.b64decode(str(event.get("audio", "")), validate=True)
                    except (binascii.Error, ValueError):
                        chunk = b""
                    if not chunk:
                        await _error(socket, "Invalid audio data", "invalid_audio")
                        continue
                    audio += chunk
                elif kind == "input_audio_buffer.commit":
                    if model is None:
                        await _error(socket, "Model not validated. Make sure to validate the model by "
                                     "sending a session.update event.", "model_not_validated")
                    elif (generation is None or generation.done()) and audio:
                        generation = asyncio.create_task(self._transcribe(socket, model, bytes(audio)))
                        audio.clear()
                else:
                    await _error(socket, f"Unknown event type: {kind}", "unknown_event")
        finally:
            if generation is not None and not generation.done():
                generation.cancel()
        return socket

    async def _transcribe(self, socket: web.WebSocketResponse, model: str, audio: bytes) -> None:
        digest = hashlib.blake2b(audio, digest_size=16).hexdigest()
        chat = self._shape.chat_body({"model": model, AUDIO_BYTES_FIELD: len(audio),
                                      AUDIO_DIGEST_FIELD: digest})
        parsed = self._parse_chat(chat)
        request_id = f"rt-{uuid.uuid4().hex}"
        lora = None if parsed.model == self._shape.chat_body({})["model"] else parsed.model
        delivery = self._driver.submit(SimRequest(request_id, parsed.prompt_tokens, parsed.max_tokens, lora),
                                       True)
        sent = 0
        try:
            while True:
                await delivery.wait()
                made = delivery.tokens_made
                for index in range(sent, made):
                    delta = tokenizer.output_text(index)
                    await _send(socket, {"type": "transcription.delta", "delta": delta})
                sent = made
                if delivery.done:
                    break
            finished = delivery.finished
            if finished is None:
                await _error(socket, str(delivery.error), "processing_error")
                return
            self.transcriptions += 1
            text = "".join(tokenizer.output_text(i) for i in range(finished.completion_tokens))
            usage = {"prompt_tokens": finished.prompt_tokens, "completion_tokens": finished.completion_tokens,
                     "total_tokens": finished.prompt_tokens + finished.completion_tokens}
            await _send(socket, {"type": "transcription.done", "text": text, "usage": usage})
        finally:
            if not delivery.done:
                self._driver.abort(request_id)


async def _send(socket: web.WebSocketResponse, event: dict[str, Any]) -> None:
    if not socket.closed:
        await socket.send_str(json.dumps(event))


async def _error(socket: web.WebSocketResponse, message: str, code: str) -> None:
    await _send(socket, {"type": "error", "error": message, "code": code})
