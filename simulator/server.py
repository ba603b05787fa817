"""One simulated replica: its engine, driver, metrics, faults, and vLLM's HTTP API.

:class:`Replica` holds the state (nothing module-level); :meth:`Replica.make_app` builds a fresh
aiohttp application over it each time its listener starts (see :mod:`simulator.fleet`).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or SSE), ``GET /v1/models``,
``POST /v1/audio/transcriptions`` and ``/translations`` (multipart forms: ``audio_api``),
``GET /v1/realtime`` (realtime transcription over a WebSocket: ``realtime_api``), ``GET /health``,
``GET /version``, ``GET /metrics``, ``POST /v1/load_lora_adapter``,
``POST /v1/unload_lora_adapter``, ``POST /tokenize``, ``POST /detokenize``,
``POST /v1/completions/render``, ``POST /v1/chat/completions/render``; simulator extras
``POST /sim/peek``, ``GET /sim/stats``, ``GET|POST /sim/faults``, ``POST /sim/kv-events/stop``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kvgate.simulator import openai_api as api
from kvgate.simulator import openai_replies as replies
from kvgate.simulator.anthropic_api import MessagesShape
from kvgate.simulator.audio_api import TranscriptionShape, read_form
from kvgate.simulator.cors import cors
from kvgate.simulator.driver import Delivery, EngineDriver, LagMonitor, ReplicaStopped
from kvgate.simulator.encode_memo import EncodeMemo
from kvgate.simulator.engine import Engine, EngineConfig, EngineMetrics, Finished, PeekResult, SimRequest
from kvgate.simulator.faults import ErrorInjector, Faults
from kvgate.simulator.http_replies import error_response, json_response, local_address
from kvgate.simulator.kv_agent import KvTransferAgent
from kvgate.simulator.kv_events import KvEventPublisher, vllm_events
from kvgate.simulator.kv_transfer import (
    KvTransfer,
    KvTransferHub,
    KvTransferSettings,
    RemoteDecode,
    RemotePrefill,
    Role,
    parse_kv_transfer_params,
)
from kvgate.simulator.media import DEFAULT_IMAGE_TOKENS, ImageTokens, MediaSpan
from kvgate.simulator.metrics import CONTENT_TYPE, Dialect, ReplicaMetrics
from kvgate.simulator.profiles import load_profile
from kvgate.simulator.prompt_routes import PromptRoutes
from kvgate.simulator.realtime_api import RealtimeApi
from kvgate.simulator.request_fields import ApiError
from kvgate.simulator.responses_api import ResponsesShape, ResponseStore, stored_reply
from kvgate.simulator.stream_writer import stream_reply

SIM_VERSION = "0.1.0+kvgate.sim"  # answered by GET /version (vLLM answers its own version there)
REPLICA_HEADER = "x-kvgate-sim-replica"
"""On a streamed answer: the replica's index (benchmarks tell which pool served a request)."""


@dataclass(frozen=True)
class ReplicaConfig:
    index: int
    engine: EngineConfig = field(default_factory=EngineConfig)
    profile: str = "blis-llama-3.1-8b-h100"
    dialect: Dialect = "vllm"
    time_scale: float = 1.0
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    role: Role = "both"
    """What the replica is deployed as (``llm-d.ai/role``); it serves either half of a disaggregated
    request whatever its role (``simulator.kv_transfer``)."""
    kv_transfer: KvTransferSettings = field(default_factory=KvTransferSettings)
    image_tokens: ImageTokens = DEFAULT_IMAGE_TOKENS
    """Placeholder tokens per image in a chat's prompt (``simulator.media``; LLaVA-1.5: 576)."""
    stream_interval: int = 1
    """Tokens per SSE chunk of a streamed response after the first token, which goes out at once
    (vLLM's ``--stream-interval``; 1: a chunk per token, vLLM's default). The last may hold fewer."""


@dataclass
class ReplicaCounters:
    requests_received: int = 0
    requests_served: int = 0
    requests_rejected: int = 0  # answered 4xx
    requests_aborted: int = 0  # client went away before the end
    requests_failed_stopped: int = 0  # in flight when the replica was stopped
    errors_injected: int = 0
    hung: int = 0  # inference requests held by the hang fault
    streams_cut: int = 0  # streamed responses aborted by the cut_streams fault


class Replica:
    """A simulated vLLM server. Construct inside a running event loop."""

    def __init__(self, config: ReplicaConfig, lag_monitor: LagMonitor | None = None,
                 encode_memo: EncodeMemo | None = None, kv_hub: KvTransferHub | None = None) -> None:
        self.config = config

        self._memo = encode_memo if encode_memo is not None else EncodeMemo()
        self.base_model = config.engine.model
        self.faults = config.faults
        self._hang_cleared = asyncio.Event()
        if not self.faults.hang:
            self._hang_cleared.set()
        self.counters = ReplicaCounters()
        self.responses = ResponseStore() if os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "0") not in (
            "", "0") else None
        """vLLM's response store (the Responses API's ``previous_response_id``), where its
        environment variable turns it on."""
        self.accepting = True
        self.adapters: dict[str, str] = {name: f"/adapters/{name}" for name in config.engine.served_loras}
        self.engine = Engine(config.engine, load_profile(config.profile))
        self.metrics = ReplicaMetrics(config.dialect, self.base_model, self._engine_metrics)
        self.kv = KvTransferAgent(self.engine, self.metrics, config.kv_transfer, config.time_scale,
                                  kv_hub if kv_hub is not None else KvTransferHub(), config.index)
        """This replica's side of disaggregated serving (``simulator.kv_agent``)."""
        self.driver = EngineDriver(self.engine, config.time_scale, lambda: self.faults.slowdown,
                                   self._on_finished, self._on_step if config.engine.kv_events else None)
        self.realtime = RealtimeApi(self.driver, self.base_model, self.served_models, self._parse_chat)
        """vLLM's realtime transcription sessions (``GET /v1/realtime``, a WebSocket)."""
        self.kv_events: KvEventPublisher | None = None
        """vLLM's KV-event publisher (``simulator.kv_events``; ``start_kv_events``)."""
        self._injector = ErrorInjector(config.seed * 1_000_003 + config.index)
        self._lag = lag_monitor
        self._frozen_page: bytes | None = None
        self.driver.start()

    async def close(self) -> None:
        self.kv.close()
        await self.driver.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()

    def start_kv_events(self, host: str, port: int, connect: str | None = None) -> None:
        """Publish the engine's KV events on ``host:port`` or to ``connect`` (replay on ``port + 1``)."""
        self.kv_events = KvEventPublisher(host, port, f"kv@{host}@{self.base_model}", connect=connect)

    async def _stop_kv_events(self, _: web.Request) -> web.Response:
        """Stop this replica's KV-event publisher alone (its engine serves on): a subscriber must
        notice and fall back for this replica."""
        if self.kv_events is None:
            return json_response({"error": "this replica publishes no KV events"}, status=404)
        await self.kv_events.stop()
        return json_response({"kv_events": "stopped"})

    def _on_step(self) -> None:
        events = self.engine.take_kv_events()  # taken every step, published or not (bounded)
        if events and self.kv_events is not None:
            self.kv_events.publish(self.driver.now(), vllm_events(events, self.config.engine.block_size))

    def _engine_metrics(self) -> EngineMetrics:
        """The engine's snapshot, with requests waiting for remote KV counted as waiting (vLLM keeps
        them in its waiting queue)."""
        m = self.engine.metrics()
        receiving = self.kv.receiving
        return dataclasses.replace(m, waiting=m.waiting + receiving) if receiving else m

    def _on_finished(self, finished: Finished) -> None:
        self.counters.requests_served += 1
        self.metrics.observe(finished)

    def served_models(self) -> list[str]:
        return [self.base_model, *self.adapters]

    def set_faults(self, changes: dict[str, Any]) -> Faults:
        faults = self.faults.updated(changes)
        if faults.metrics_frozen and not self.faults.metrics_frozen:
            self._frozen_page = self.metrics.render()
        if not faults.metrics_frozen:
            self._frozen_page = None
        self.faults = faults
        if faults.hang:
            self._hang_cleared.clear()
        else:
            self._hang_cleared.set()
        return faults

    def stop_in_flight(self) -> None:
        """Called when the listener stops: every in-flight request ends with an error."""
        self.accepting = False
        self.counters.requests_failed_stopped += self.driver.in_flight
        self.driver.fail_all(ReplicaStopped("the replica was stopped"))

    def stats(self, window_s: float = 60.0) -> dict[str, Any]:
        m = self.engine.metrics()
        c = self.counters
        return {
            "replica": self.config.index,
            "role": self.config.role,
            "model": self.base_model,
            "engine": self.config.dialect,
            "time_scale": self.config.time_scale,
            "sim_time_s": self.driver.now(),
            "steps": self.driver.steps,
            "accepting": self.accepting,
            "requests_received": c.requests_received,
            "requests_served": c.requests_served,
            "requests_rejected": c.requests_rejected,
            "requests_aborted": c.requests_aborted,
            "requests_failed_stopped": c.requests_failed_stopped,
            "errors_injected": c.errors_injected,
            "hung": c.hung,
            "streams_cut": c.streams_cut,
            "realtime_sessions": self.realtime.sessions,
            "realtime_transcriptions": self.realtime.transcriptions,
            **self.kv.stats(),
            "kv_events_published": self.kv_events.published if self.kv_events is not None else None,
            "kv_cached_blocks": self.engine.kv_cache.num_cached_blocks,
            "in_flight": self.driver.in_flight,
            "waiting": m.waiting + self.kv.receiving,
            "running": m.running,
            "kv_cache_usage": m.kv_cache_usage,
            "prefix_cache_queries": m.prefix_cache_queries,
            "prefix_cache_hits": m.prefix_cache_hits,
            "prompt_tokens": m.prompt_tokens_total,
            "generation_tokens": m.generation_tokens_total,
            "request_success": m.request_success_total,
            "preemptions": m.preemptions_total,
            "running_loras": list(m.running_loras),
            "waiting_loras": list(m.waiting_loras),
            "adapters": list(self.adapters),
            "faults": self.faults.to_json(),
            "loop_lag": self._lag.summary(window_s) if self._lag is not None else None,
        }

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[cors])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/responses/{response_id}", self._stored_response)
        app.router.add_post("/v1/responses/{response_id}/cancel", self._stored_response)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/audio/transcriptions", self._audio)
        app.router.add_post("/v1/audio/translations", self._audio)
        app.router.add_get("/v1/realtime", self.realtime.handle)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/load_lora_adapter", self._load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)
        prompts = PromptRoutes(self.base_model, self.served_models, self._memo, self._peek,
                               self.config.image_tokens)
        app.router.add_post("/tokenize", prompts.tokenize)
        app.router.add_post("/detokenize", prompts.detokenize)
        app.router.add_post("/v1/messages/count_tokens", prompts.count_message_tokens)
        app.router.add_post("/v1/completions/render", prompts.render_completions)
        app.router.add_post("/v1/chat/completions/render", prompts.render_chat)
        app.router.add_post("/sim/peek", prompts.peek)
        app.router.add_get("/sim/stats", self._stats)
        app.router.add_post("/sim/kv-events/stop", self._stop_kv_events)
        app.router.add_get("/sim/faults", self._get_faults)
        app.router.add_post("/sim/faults", self._post_faults)
        return app

    # ---- inference -------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "completion")

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "chat")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "chat", ResponsesShape(self.responses))

    async def _stored_response(self, request: web.Request) -> web.Response:
        try:
            cancel = request.method == "POST"
            found = stored_reply(self.responses, request.match_info["response_id"], cancel=cancel)
        except ApiError as err:
            return error_response(err)
        return json_response(found)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "chat", MessagesShape())

    def _parse_chat(self, body: dict[str, Any]) -> api.InferenceRequest:
        return api.parse_inference("chat", body, self.base_model, self._memo, self.config.image_tokens)

    async def _audio(self, request: web.Request) -> web.StreamResponse:
        return await self._inference(request, "chat", TranscriptionShape(self.base_model), read=read_form)

    async def _inference(self, request: web.Request, kind: api.ApiKind,
                         shape: replies.ReplyShape | None = None,
                         read: Callable[[web.Request], Awaitable[dict[str, Any]]] | None = None,
                         ) -> web.StreamResponse:
        """A completion or chat; with ``shape``, a request of another API served as the chat it
        becomes (the Responses API, Anthropic's Messages API, speech to text) and answered in its
        own shape; ``read``: its body when not JSON (a form)."""
        self.counters.requests_received += 1
        if not self.accepting:
            return self._refused(ApiError(503, "the replica is stopping"), shape)
        try:
            body = asked = (api.decode_json_object(await request.read()) if read is None
                            else await read(request))
            if shape is not None:
                body = shape.chat_body(asked)
            parsed = api.parse_inference(kind, body, self.base_model, self._memo, self.config.image_tokens)
            api.check_model(parsed.model, self.served_models())
            transfer = parse_kv_transfer_params(body)
        except ApiError as err:
            self.counters.requests_rejected += 1
            return self._refused(err, shape)
        if self.faults.hang:
            self.counters.hung += 1
            await self._hang_cleared.wait()  # until set_faults clears it, or the client goes away
        if self._injector.should_fail(self.faults):
            self.counters.errors_injected += 1
            return self._refused(ApiError(500, "injected fault: internal server error"), shape)
        request_id = api.new_request_id(kind)
        lora = None if parsed.model == self.base_model else parsed.model
        remote_tokens = await self.kv.receive(transfer) if isinstance(transfer, RemotePrefill) else 0
        output = (api.continuation_tokens(kind, body, parsed.prompt_tokens, parsed.max_tokens,
                                          self._memo.uncached)
                  if self.engine.config.enable_prefix_caching else ())
        sim = SimRequest(request_id, parsed.prompt_tokens, parsed.max_tokens, lora,
                         remote_tokens=remote_tokens,
                         # a streamed answer has no place for kv_transfer_params: nothing to hold for
                         hold_kv=isinstance(transfer, RemoteDecode) and not parsed.stream,
                         cache_salt=parsed.cache_salt, output_tokens=output, media=parsed.media)
        try:
            delivery = self.driver.submit(sim, parsed.stream)
        except ValueError as exc:
            self.counters.requests_rejected += 1
            return self._refused(ApiError(400, str(exc), "prompt"), shape)
        reply = shape.replies(asked, parsed) if shape is not None else None
        try:
            if parsed.stream:
                return await self._stream(request, parsed, request_id, delivery, reply)
            return await self._respond(request, parsed, request_id, delivery, transfer, reply)
        finally:
            if not delivery.done:
                self.counters.requests_aborted += 1
                self.driver.abort(request_id)

    async def _respond(
        self, request: web.Request, parsed: api.InferenceRequest, request_id: str, delivery: Delivery,
        transfer: KvTransfer | None, reply: replies.ShapedReplies | None = None,
    ) -> web.Response:
        while not delivery.done:
            await delivery.wait()
        finished = delivery.finished
        if finished is None:
            return error_response(ApiError(503, str(delivery.error)))
        if reply is not None:
            return json_response(reply.whole(finished))
        usage = replies.usage_json(finished.prompt_tokens, finished.completion_tokens, finished.cached_tokens)
        created = int(time.time())
        body = replies.full_response(parsed, request_id, created, finished.completion_tokens, usage)
        if isinstance(transfer, RemoteDecode):
            address = local_address(request)
            body["kv_transfer_params"] = self.kv.hold_for_decode(request_id, finished, address)
        return json_response(body)

    async def _stream(
        self, request: web.Request, parsed: api.InferenceRequest, request_id: str, delivery: Delivery,
        reply: replies.ShapedReplies | None = None,
    ) -> web.StreamResponse:
        sse: replies.StreamFormat = (replies.SseFormatter(parsed, request_id, int(time.time()))
                                     if reply is None else reply)
        return await stream_reply(request, parsed, delivery, sse, {REPLICA_HEADER: str(self.config.index)},
                                  stream_interval=self.config.stream_interval,
                                  cut_streams=lambda: self.faults.cut_streams, on_cut=self._count_cut)

    @staticmethod
    def _refused(err: ApiError, shape: replies.ReplyShape | None) -> web.Response:
        return error_response(err) if shape is None else json_response(shape.error_body(err), err.status)

    def _count_cut(self) -> None:
        self.counters.streams_cut += 1

    # ---- model management ------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        return json_response(replies.models_list(self.base_model, self.adapters))

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        return json_response({"version": SIM_VERSION})

    async def _load_lora(self, request: web.Request) -> web.Response:
        try:
            name, path = api.lora_request_fields(api.decode_json_object(await request.read()), need_path=True)
            if name == self.base_model or name in self.adapters:
                raise ApiError(400, f"The lora adapter '{name}' has already been loaded.", "lora_name")
        except ApiError as err:
            return error_response(err)
        self.engine.load_lora(name)
        self.adapters[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        try:
            name, _ = api.lora_request_fields(api.decode_json_object(await request.read()), need_path=False)
            if name not in self.adapters:
                raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
        except ApiError as err:
            return error_response(err)
        self.engine.unload_lora(name)
        del self.adapters[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    # ---- metrics and simulator extras ------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        faults = self.faults
        if faults.metrics_delay_s > 0:
            await asyncio.sleep(faults.metrics_delay_s)
        page = self._frozen_page if faults.metrics_frozen and self._frozen_page is not None else None
        return web.Response(body=page if page is not None else self.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE})

    def _peek(self, tokens: tuple[int, ...], model: str, salt: str | None,
              media: tuple[MediaSpan, ...] = ()) -> PeekResult:
        lora = None if model == self.base_model else model
        return self.engine.peek(tokens, lora, self.driver.now(), salt, media)

    async def _stats(self, request: web.Request) -> web.Response:
        try:
            window = float(request.query.get("window_s", "60"))
        except ValueError:
            return error_response(ApiError(400, "window_s must be a number", "window_s"))
        return json_response(self.stats(window))

    async def _get_faults(self, request: web.Request) -> web.Response:
        return json_response(self.faults.to_json())

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            body = api.decode_json_object(await request.read())
            return json_response(self.set_faults(body).to_json())
        except ApiError as err:
            return error_response(err)
        except ValueError as exc:
            return error_response(ApiError(400, str(exc)))
