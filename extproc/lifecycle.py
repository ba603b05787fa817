"""The per-request ext_proc lifecycle: a sans-IO state machine, decoded events in, actions out.

Its transition table (:data:`TRANSITIONS`, state × event type → handler) is the whole protocol::

    START ──RequestHeaders(eos)──────────────────────────────▶ UPSTREAM        (bodyless: pick now)
    START ──RequestHeaders──▶ REQUEST_BODY ──body eos / trailers─▶ UPSTREAM   (pick on the whole body)
    UPSTREAM ──ResponseHeaders──▶ RESPONSE_BODY ──body eos / trailers──▶ RESPONSE_DONE
    UPSTREAM ──ResponseHeaders (body not sent)──▶ RESPONSE_PASSTHROUGH ──StreamClosed──▶ DONE
    START / REQUEST_BODY ──ResponseHeaders──▶ DONE   (Envoy's own local reply: passes unchanged)
    any ──error──▶ DONE (ImmediateResponse)        any ──StreamClosed──▶ DONE

FULL_DUPLEX_STREAMED request bodies are held until end of stream, then the header response
(destination, metadata) goes out followed by the body as streamed chunks. BUFFERED bodies get
the header response at once, before the headers are read (it depends on none of them: forged
system headers are removed, and the destination named, by the body's response), and the destination
on the body response; the headers are read after that first reply is written or when the body
comes, and what reading them finds (a declared length over the limit: 413) answers the body.
Responses pass through chunk by chunk. ``Scheduler.on_finished`` runs exactly once per picked request.

kvgate's one-pass data path (the configuration kvgate writes: request body BUFFERED, response
headers SEND, response body NONE, ``allow_mode_override``) sends no response chunk to Python: the
reply to the response headers turns the response body on for this request only when it must be read
or changed (the response's ``model`` renamed back after a rewrite, a pool with a token limit, or
one response in ``observe_usage_every``), and otherwise the request ends when Envoy closes the
stream at the end of the HTTP request (measured on Envoy 1.40: the stream stays open until then). The
scheduler then learns the first token of a streamed response from its own estimate
(``on_first_token_unseen``); a non-streamed response's headers come when it is complete.

Measured on the pinned Envoy 1.40 (and relied on): the stream is half-closed at the end of the HTTP
request, also when the response phases send nothing (it may arrive as a cancellation instead: about
one complete response in seven did, under load, so a cancelled stream does not tell a reset from a
clean end, and nothing here counts it as a failure of the replica); the
ext_proc ``grpc_service.timeout`` does not end a long stream; ``mode_override`` counts in the reply
to the response headers only (a request-body or response-body reply's is ignored); with a BUFFERED
request body, ``send_body_without_waiting_for_header_response`` does not send the body before the
header reply; a processor that ends the stream cleanly mid-response lets the response go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any

from kvgate.extproc.actions import (
    Action,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    HeaderEdit,
    Phase,
    StreamBody,
)
from kvgate.extproc.after_reply import AfterReply
from kvgate.extproc.decision import Decision, decide
from kvgate.extproc.destination_reply import (
    destination_edit,
    destination_metadata,
    header_reply,
    streamed_body,
)
from kvgate.extproc.errors import immediate_response
from kvgate.extproc.events import (
    BodyMode,
    BodyModes,
    Event,
    Headers,
    RequestBodyChunk,
    RequestHeaders,
    RequestTrailers,
    ResponseBodyChunk,
    ResponseHeaders,
    ResponseTrailers,
    StreamClosed,
)
from kvgate.extproc.lifecycle_config import LifecycleConfig, RequestIds
from kvgate.extproc.openai_request import BodyBuffer
from kvgate.extproc.openai_response import ResponseBodyProcessor
from kvgate.extproc.outcomes import outcome_header
from kvgate.extproc.picked_request import PickedRequest
from kvgate.extproc.ports import Clock, NoMetrics, Pool, PoolDirectory, RequestLabels, RequestMetrics
from kvgate.extproc.request_headers import model_header, read_request_headers
from kvgate.policies.errors import KvgateError, ModelNotFoundError, RouteNotFoundError
from kvgate.policies.types import ApiKind

_log = logging.getLogger(__name__)


class State(Enum):
    START = "start"
    REQUEST_BODY = "request_body"
    UPSTREAM = "upstream"
    RESPONSE_BODY = "response_body"
    RESPONSE_PASSTHROUGH = "response_passthrough"
    """The response flows without reaching the picker; the stream's end is the request's end."""
    RESPONSE_DONE = "response_done"
    DONE = "done"


class ProtocolViolation(KvgateError):
    """Envoy sent a message the lifecycle does not expect in its state (500)."""

    code = "protocol_violation"


class RequestLifecycle:
    """One HTTP request's ext_proc conversation. Not thread-safe; one per gRPC stream."""

    def __init__(
        self,
        directory: PoolDirectory,
        clock: Clock,
        *,
        pool_name: str | None = None,
        metrics: RequestMetrics | None = None,
        config: LifecycleConfig | None = None,
        request_ids: Callable[[], str] | None = None,
        after_reply: AfterReply | None = None,
    ) -> None:
        """``request_ids``: where the scheduler's request id comes from (a :class:`RequestIds`'
        ``next_id``, shared by a process's lifecycles; default: a fresh :class:`RequestIds`).
        ``after_reply``: the process's queue of work done after each reply (the servicer's; see
        :mod:`extproc.after_reply`): the scheduler's feedback waits there, and the lifecycle flushes
        it before each pick. Without one, the scheduler is told at once."""
        self._after_reply = after_reply
        self._directory = directory
        self._request_ids = request_ids or RequestIds().next_id
        self._clock = clock
        self._pool_name = pool_name
        self._metrics: RequestMetrics = metrics or NoMetrics()
        self._config = config or LifecycleConfig()
        self.state = State.START
        self._modes = self._config.default_modes
        self._started = 0.0
        self._pool: Pool | None = None
        self._headers: MappingProxyType[str, str] = MappingProxyType({})
        self._strip: tuple[str, ...] = ()
        self._api = ApiKind.OTHER
        self._subset: tuple[str, ...] | None = None
        self._body = BodyBuffer(self._config.max_body_bytes)
        self._picked: PickedRequest | None = None
        """The routed request's feedback to the scheduler and the metrics (from the pick on)."""
        self._status = 0
        self._response: ResponseBodyProcessor | None = None
        self._observe = True
        """Whether the response body is read (one-pass data path: decided at the pick)."""
        self._skipped = False
        """The response phases are skipped for this request (``skip_unread_responses``)."""
        self._skippable = False
        """The request could skip its response phases (decided with its headers: ``_can_skip_response``)."""
        self._unread: RequestHeaders | None = None
        """Request headers answered before they were read (a BUFFERED body follows)."""
        self._unread_error: Exception | None = None
        """What reading them raised, for the body's reply."""

    @property
    def decision(self) -> Decision | None:
        return self._picked.decision if self._picked is not None else None

    def handle(self, event: Event) -> list[Action]:
        handler = TRANSITIONS.get((self.state, type(event)))
        if handler is None:
            if self.state is State.DONE:
                return []
            handler = _unexpected
        try:
            return handler(self, event)
        except Exception as error:  # every failure becomes one local reply; bugs are logged there
            return self._fail(error)

    # request path --------------------------------------------------------------------------
    def _on_request_headers(self, event: RequestHeaders) -> list[Action]:
        self._started = self._clock.now()
        self._modes = event.modes or self._config.default_modes
        self._subset = event.subset_hint
        if not event.end_of_stream and self._modes.request is BodyMode.BUFFERED:
            # A BUFFERED body follows, and the reply to the headers depends on none of them: the
            # pool comes with the stream, and the body's reply removes forged system headers and
            # names the destination while Envoy still holds the request. So the reply goes first
            # and the headers are read once it is written (the servicer's after-reply queue), while
            # Envoy turns the reply round and sends the body, or when the body comes, whichever is
            # first. At concurrency 1 this took 80-150 µs off Envoy's request-headers call and
            # ~200 µs off the client's p50 (``bench/results/extproc_phases.md``).
            self._pool = self._resolve_pool(event.headers)
            self._unread = event
            if self._after_reply is not None:
                self._after_reply.defer("reading the request headers", self._read_unread_headers)
        else:
            self._read_headers(event)
        self._skippable = self._can_skip_response()
        if event.end_of_stream:
            return [self._header_reply(self._pick(b""), streamed_body=False)]
        self.state = State.REQUEST_BODY
        if self._full_duplex_request:
            return []
        if self._skippable:
            self._observe = self._reads_response()  # the sampler is asked once, here
            self._skipped = not self._observe
        # nothing to strip yet when the headers are read later (the body's reply strips them)
        return [ContinueHeaders(Phase.REQUEST, HeaderEdit(remove=self._strip), skip_response=self._skipped)]

    def _read_unread_headers(self) -> None:
        """Read headers answered before they were read; what that raises (413 for a declared length
        over the limit, a bug) is kept for the body, whose reply is the request's next answer."""
        event, self._unread = self._unread, None
        if event is None or self.state is not State.REQUEST_BODY:
            return
        try:
            self._read_headers(event)
        except Exception as error:
            self._unread_error = error

    def _headers_read(self) -> None:
        """Before the request body is handled: its headers read, and what that found raised."""
        self._read_unread_headers()
        if self._unread_error is not None:
            raise self._unread_error

    def _read_headers(self, event: RequestHeaders) -> None:
        """The headers kept (forged system headers set aside to strip), the API, the pool when it is
        not known yet; a path outside the inference API, a declared length over the limit refused."""
        read = read_request_headers(event.headers)
        self._headers, self._strip, self._api = read.headers, read.strip, read.api
        if self._pool is None:
            self._pool = self._resolve_pool(event.headers)
        read.refuse(self._config.max_body_bytes, self._pool.extra_paths)

    def _resolve_pool(self, headers: Headers) -> Pool:
        try:
            return self._directory.resolve(self._pool_name)
        except RouteNotFoundError:
            model = model_header(headers)
            if model:  # set from the body by the body-based router: no route serves this model
                raise ModelNotFoundError.of(model) from None
            raise

    def _can_skip_response(self) -> bool:
        return (
            self._config.skip_unread_responses
            and self._modes.request is BodyMode.BUFFERED
            and self._response_body_off
            and self._pool is not None
            and not self._pool.rewrites_models
        )

    def _on_request_body(self, event: RequestBodyChunk) -> list[Action]:
        self._headers_read()
        if event.subset_hint is not None:
            self._subset = event.subset_hint
        self._body.append(event.data)
        if not self._full_duplex_request:
            buffered = self._modes.request is BodyMode.BUFFERED
            if not buffered and not event.end_of_stream:
                return [ContinueBody(Phase.REQUEST)]  # STREAMED: chunks pass; decide on the last one
            # BUFFERED: this one message is the whole body; headers are still held by Envoy.
            decision = self._pick(self._body.take())
            body = decision.body if decision.body_rewritten and buffered else None
            return [
                ContinueBody(
                    Phase.REQUEST,
                    body=body,
                    edit=destination_edit(
                        decision, self._config, self._strip, self._outcome(decision),
                        content_length=body is not None,
                    ),
                    clear_route_cache=True,
                    metadata=destination_metadata(decision, self._config.fallback_count),
                )
            ]
        if not event.end_of_stream:
            return []
        decision = self._pick(self._body.take())
        chunks = streamed_body(decision.body, True, self._config.stream_chunk_bytes)
        return [self._header_reply(decision, streamed_body=True), *chunks]

    def _on_request_trailers_in_body(self, event: RequestTrailers) -> list[Action]:
        self._headers_read()
        if not self._full_duplex_request:
            raise ProtocolViolation("request trailers before the buffered body")
        decision = self._pick(self._body.take())
        return [
            self._header_reply(decision, streamed_body=True),
            *streamed_body(decision.body, False, self._config.stream_chunk_bytes),
            ContinueTrailers(Phase.REQUEST),
        ]

    def _on_request_trailers_late(self, event: RequestTrailers) -> list[Action]:
        return [ContinueTrailers(Phase.REQUEST)]

    def _pick(self, body: bytes) -> Decision:
        assert self._pool is not None
        if not self._skippable:
            self._observe = self._reads_response()
        if self._after_reply is not None:
            self._after_reply.flush()  # every earlier pick counted before this one is scored
        decision = decide(
            pool=self._pool,
            api=self._api,
            headers=self._headers,
            body=body,
            subset=self._subset,
            now=self._clock.now,
            inject_usage=self._config.inject_include_usage and self._observe,
            # Our own id: the scheduler keys in-flight state by it, and clients can repeat x-request-id.
            request_id=self._request_ids(),
            metrics=self._metrics,
            limiter=self._config.tenant_limiter,
        )
        picked = PickedRequest(decision, self._pool.scheduler, metrics=self._metrics,
                               clock=self._clock, started=self._started, after_reply=self._after_reply)
        self._picked = picked
        self.state = State.UPSTREAM
        # no response headers will come for a skipped stream: its first token goes unseen
        picked.picked(first_token_unseen=self._skipped and decision.request.stream)
        return decision

    def _header_reply(self, decision: Decision, *, streamed_body: bool) -> ContinueHeaders:
        return header_reply(
            decision, self._config, self._strip, self._outcome(decision), streamed_body=streamed_body
        )

    def _outcome(self, decision: Decision) -> str | None:
        """The outcome mark, when Envoy reports this request's outcome afterwards."""
        return outcome_header(self._labels, streamed=decision.request.stream) if self._reported else None

    @property
    def _reported(self) -> bool:
        """Envoy reports this request's outcome afterwards (``extproc.outcomes``)."""
        return self._skipped and self._config.outcome_reports

    @property
    def _full_duplex_request(self) -> bool:
        return self._modes.request is BodyMode.FULL_DUPLEX_STREAMED

    @property
    def _response_body_off(self) -> bool:
        """Envoy sends no response body unless this request turns it on (the one-pass data path)."""
        return self._modes.response is BodyMode.NONE

    def _counts_tokens(self) -> bool:
        limiter = self._config.tenant_limiter
        return limiter is not None and self._pool is not None and limiter.counts_tokens(self._pool.name)

    def _reads_response(self) -> bool:
        """Whether this request's response body will be read (decided once, before the pick):
        always when Envoy sends it, else for token limits or the sampler."""
        return not self._response_body_off or self._counts_tokens() or self._sampled()

    def _sampled(self) -> bool:
        sampler = self._config.observe_usage
        return sampler is not None and sampler()

    # response path -------------------------------------------------------------------------
    def _on_response_headers(self, event: ResponseHeaders) -> list[Action]:
        picked = self._picked
        assert picked is not None
        picked.served_by(event.served_endpoint)
        decision = picked.decision
        content_type = ""
        for name, value in event.headers:
            key = name.lower()
            if key == ":status":
                self._status = int(value) if value.isdigit() else 0
            elif key == "content-type":
                content_type = value.lower()
        request = decision.request
        if self._status >= 500:
            picked.endpoint_failed()
        rename = (request.target_model, request.model) if self._config.rename_response_model else None
        self._response = ResponseBodyProcessor(
            sse="text/event-stream" in content_type,
            drop_usage_chunk=decision.usage_injected and self._config.drop_injected_usage_chunk,
            rename_model=rename if request.model else None,
            copy_limit=self._config.response_copy_limit,
        )
        edit = HeaderEdit(remove=("content-length",)) if self._response.edits else HeaderEdit()
        if event.end_of_stream:
            self._finish(ok=self._status_ok)
            self.state = State.RESPONSE_DONE
            return [ContinueHeaders(Phase.RESPONSE, edit)]
        if not self._response_body_off:
            self.state = State.RESPONSE_BODY
            return [ContinueHeaders(Phase.RESPONSE, edit)]
        if self._observe or self._response.edits:
            # Turn the body on for this request (STREAMED: chunks as they come, no buffering limit).
            self.state = State.RESPONSE_BODY
            self._modes = BodyModes(self._modes.request, BodyMode.STREAMED)
            return [ContinueHeaders(Phase.RESPONSE, edit, response_body_mode=BodyMode.STREAMED)]
        self.state = State.RESPONSE_PASSTHROUGH
        if "text/event-stream" in content_type:
            picked.first_token_unseen()
        else:  # a whole (non-streamed) response: its headers come when it is complete
            picked.first_token()
        return [ContinueHeaders(Phase.RESPONSE)]

    def _on_response_body(self, event: ResponseBodyChunk) -> list[Action]:
        processor, picked = self._response, self._picked
        assert processor is not None
        assert picked is not None
        picked.served_by(event.served_endpoint)
        if event.data:
            picked.first_token()
        out = processor.feed(event.data, event.end_of_stream)
        if event.end_of_stream:
            self._complete_response()
        if self._modes.response is BodyMode.FULL_DUPLEX_STREAMED:
            if out or event.end_of_stream:
                return [StreamBody(Phase.RESPONSE, out, event.end_of_stream)]
            return []
        return [ContinueBody(Phase.RESPONSE, body=None if out == event.data else out)]

    def _on_response_trailers(self, event: ResponseTrailers) -> list[Action]:
        actions: list[Action] = []
        if self.state is State.RESPONSE_BODY and self._response is not None:
            tail = self._response.feed(b"", True)
            if tail and self._modes.response is BodyMode.FULL_DUPLEX_STREAMED:
                actions.append(StreamBody(Phase.RESPONSE, tail, False))
            self._complete_response()
        actions.append(ContinueTrailers(Phase.RESPONSE))
        return actions

    def _on_local_reply(self, event: ResponseHeaders) -> list[Action]:
        """Response headers before the request was picked: Envoy answered it itself (its 413 for a
        body over the listener's buffer limit, sent while the body was still arriving). Nothing was
        routed; the reply passes as it is (Envoy's local reply configuration gives it its JSON)."""
        self.state = State.DONE
        return [ContinueHeaders(Phase.RESPONSE)]

    def _on_response_trailers_passing(self, event: ResponseTrailers) -> list[Action]:
        return [ContinueTrailers(Phase.RESPONSE)]

    def _complete_response(self) -> None:
        assert self._picked is not None
        assert self._response is not None
        usage = self._response.usage
        if usage is not None:
            self._picked.usage(usage, self._config.tenant_limiter)
        self._finish(ok=self._status_ok)
        self.state = State.RESPONSE_DONE

    # ending --------------------------------------------------------------------------------
    def _on_closed(self, event: StreamClosed) -> list[Action]:
        # a request whose response phases were skipped ends here, as far as the picker can tell;
        # with outcome reports, whether it went well is counted when its report comes
        self._finish(ok=self._skipped and self.state is State.UPSTREAM and not event.cancelled,
                     count_outcome=not self._reported)
        self.state = State.DONE
        return []

    def _on_closed_after_response(self, event: StreamClosed) -> list[Action]:
        """The one-pass data path's end of request: Envoy closes the stream at the end of the HTTP
        request (a half-close, or a cancellation: not a reliable sign of a reset, see above)."""
        self._finish(ok=self._status_ok and not event.cancelled)
        self.state = State.DONE
        return []

    def _fail(self, error: BaseException) -> list[Action]:
        reply = immediate_response(error)
        code = error.code if isinstance(error, KvgateError) else "internal_error"
        self._metrics.request_error(self._labels, code)
        if isinstance(error, KvgateError) and error.status < 500:
            _log.debug("request refused: %s %s", error.status, error.message)
        elif isinstance(error, KvgateError):
            _log.info("request failed: %s %s", error.status, error.message)
        self._finish(ok=False)
        self.state = State.DONE
        return [reply]

    def _finish(self, *, ok: bool, count_outcome: bool = True) -> None:
        """The request's end, once, when it was picked (``PickedRequest.finish``)."""
        if self._picked is not None:
            self._picked.finish(ok=ok, count_outcome=count_outcome)

    @property
    def _status_ok(self) -> bool:
        return 0 < self._status < 400

    @property
    def _labels(self) -> RequestLabels:
        if self._picked is not None:
            return self._picked.labels
        return RequestLabels(self._pool.name if self._pool is not None else (self._pool_name or ""), "", "")


def _unexpected(machine: RequestLifecycle, event: Event) -> list[Action]:
    raise ProtocolViolation(f"unexpected {type(event).__name__} in state {machine.state.value}")


Handler = Callable[[RequestLifecycle, Any], list[Action]]

TRANSITIONS: Mapping[tuple[State, type], Handler] = MappingProxyType(
    {
        (State.START, RequestHeaders): RequestLifecycle._on_request_headers,
        (State.START, StreamClosed): RequestLifecycle._on_closed,
        (State.START, ResponseHeaders): RequestLifecycle._on_local_reply,
        (State.REQUEST_BODY, ResponseHeaders): RequestLifecycle._on_local_reply,
        (State.REQUEST_BODY, RequestBodyChunk): RequestLifecycle._on_request_body,
        (State.REQUEST_BODY, RequestTrailers): RequestLifecycle._on_request_trailers_in_body,
        (State.REQUEST_BODY, StreamClosed): RequestLifecycle._on_closed,
        (State.UPSTREAM, RequestTrailers): RequestLifecycle._on_request_trailers_late,
        (State.UPSTREAM, ResponseHeaders): RequestLifecycle._on_response_headers,
        (State.UPSTREAM, StreamClosed): RequestLifecycle._on_closed,
        (State.RESPONSE_PASSTHROUGH, ResponseTrailers): RequestLifecycle._on_response_trailers_passing,
        (State.RESPONSE_PASSTHROUGH, StreamClosed): RequestLifecycle._on_closed_after_response,
        (State.RESPONSE_BODY, ResponseBodyChunk): RequestLifecycle._on_response_body,
        (State.RESPONSE_BODY, ResponseTrailers): RequestLifecycle._on_response_trailers,
        (State.RESPONSE_BODY, StreamClosed): RequestLifecycle._on_closed,
        (State.RESPONSE_DONE, ResponseTrailers): RequestLifecycle._on_response_trailers,
        (State.RESPONSE_DONE, StreamClosed): RequestLifecycle._on_closed,
    }
)
"""State × event type → handler. A pair not listed is a protocol violation (500), except in DONE."""
