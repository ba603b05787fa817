"""The per-request ext_proc lifecycle: a sans-IO state machine, decoded events in, actions out.

Its transition table (:data:`TRANSITIONS`, state × event type → handler) is the whole protocol::

    START ──RequestHeaders(eos)──────────────────────────────▶ UPSTREAM        (bodyless: pick now)
    START ──RequestHeaders──▶ REQUEST_BODY ──body eos / trailers─▶ UPSTREAM   (pick on the whole body)
    REQUEST_BODY ──body eos / trailers──▶ PREFILL ──PrefillDone──▶ UPSTREAM  (extproc.prefill_step)
    START / REQUEST_BODY ──(no room)──▶ HOLDING ──HoldEnded──▶ UPSTREAM / PREFILL   (extproc.holding)
    UPSTREAM ──ResponseHeaders──▶ RESPONSE_BODY ──body eos / trailers──▶ RESPONSE_DONE
    UPSTREAM ──ResponseHeaders (body not sent)──▶ RESPONSE_PASSTHROUGH ──StreamClosed──▶ DONE
    START / REQUEST_BODY ──ResponseHeaders──▶ DONE   (Envoy's own local reply: passes unchanged)
    any ──error──▶ DONE (ImmediateResponse)        any ──StreamClosed──▶ DONE

Which path a request takes is its plan (``extproc.request_plan``), decided with its headers.
FULL_DUPLEX_STREAMED request bodies are held until end of stream, then the header response
(destination, metadata) goes out followed by the body as streamed chunks. BUFFERED bodies get the
header response at once, before the headers are read (it depends on none of them: the body's
response removes forged system headers and names the destination); the headers are read once that
first reply is written or when the body comes, and what reading them refuses answers the body.
Responses pass through chunk by chunk. ``Scheduler.on_finished`` runs exactly once per picked request.

kvgate's one-pass data path (request body BUFFERED, response headers SEND, response body NONE,
``allow_mode_override``) sends no response chunk to Python unless the plan reads it: the reply to the
response headers turns the body on for this request only then (or to rename the response's
``model`` after a rewrite); otherwise the request ends when Envoy closes the stream at the end of
the HTTP request, and the scheduler takes a streamed response's first token at its own estimate
(``on_first_token_unseen``). The Envoy 1.40 behaviours this relies on (the stream half-closed, or
cancelled, at the request's end; where ``mode_override`` counts) are in ``docs/envoy-extproc.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from functools import partial
from types import MappingProxyType
from typing import Any

from kvgate.extproc.actions import (
    Action,
    ContinueBody,
    ContinueHeaders,
    ContinueTrailers,
    HeaderEdit,
    Phase,
    Step,
    StreamBody,
)
from kvgate.extproc.after_reply import AfterReply
from kvgate.extproc.decision import Decision, Prepared, prepare, schedule
from kvgate.extproc.destination_reply import body_reply, header_reply, streamed_body
from kvgate.extproc.errors import ProtocolViolation, immediate_response
from kvgate.extproc.events import (
    BodyMode,
    Event,
    HoldEnded,
    PrefillDone,
    RequestBodyChunk,
    RequestHeaders,
    RequestTrailers,
    ResponseBodyChunk,
    ResponseHeaders,
    ResponseTrailers,
    StreamClosed,
)
from kvgate.extproc.hold_step import hold_refusal, hold_steps, spill_target
from kvgate.extproc.lifecycle_config import LifecycleConfig, RequestIds
from kvgate.extproc.openai_request import BodyBuffer
from kvgate.extproc.openai_response import ResponseBodyProcessor
from kvgate.extproc.outcomes import outcome_header
from kvgate.extproc.picked_request import PickedRequest
from kvgate.extproc.ports import (
    Clock,
    HoldingPort,
    NoMetrics,
    Pool,
    PoolDirectory,
    RequestLabels,
    RequestMetrics,
    RequestTrace,
)
from kvgate.extproc.prefill_step import decode_decision, prefill_step
from kvgate.extproc.request_headers import PendingHeaders, read_request_headers, resolve_pool
from kvgate.extproc.request_plan import RequestPlan, plan_request
from kvgate.extproc.response_head import response_head, response_processor
from kvgate.extproc.session_persistence import session_of
from kvgate.extproc.upgrades import check_upgrade, upgrade_of
from kvgate.policies.errors import KvgateError
from kvgate.policies.flow_control import HoldOutcome
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
    PREFILL = "prefill"
    """Picked; the release to the decode endpoint waits for the picker's prefill step."""
    HOLDING = "holding"
    """Not picked yet: waiting in the pool's holding area for room (``extproc.holding``)."""
    TUNNEL = "tunnel"
    """A WebSocket session (``extproc.upgrades``): whatever of it still comes passes back as it came
    (a gateway that ignores the reply's ``mode_override`` sends its frames as bodies)."""


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
        trace: RequestTrace | None = None,
    ) -> None:
        """``request_ids``: the scheduler's request ids (a process's :class:`RequestIds`).
        ``after_reply``: the process's queue of work done after each reply (``extproc.after_reply``),
        flushed before each pick; without one, the scheduler is told at once. ``trace``: a traced
        request's spans (``extproc.tracing``), told what happens to it."""
        self._trace = trace
        self._after_reply = after_reply
        self._directory = directory
        self._request_ids = request_ids or RequestIds().next_id
        self._clock = clock
        self._pool_name = pool_name
        self._metrics: RequestMetrics = metrics or NoMetrics()
        self._config = config or LifecycleConfig()
        self.state = State.START
        self._plan = RequestPlan(self._config.default_modes, observe=True, skip_response=False,
                                 reported=False, read_headers_later=False)
        """This request's plan (``extproc.request_plan``), decided when its headers come."""
        self._started = 0.0
        self._pool: Pool | None = None
        self._target: Pool | None = None
        """The pool the request was scheduled in: its own, or one its pool spilled it to."""
        self._headers: MappingProxyType[str, str] = MappingProxyType({})
        self._strip: tuple[str, ...] = ()
        self._api = ApiKind.OTHER
        self._subset: tuple[str, ...] | None = None
        self._body = BodyBuffer(self._config.max_body_bytes)
        self._picked: PickedRequest | None = None
        """The routed request's feedback to the scheduler and the metrics (from the pick on)."""
        self._status = 0
        self._response: ResponseBodyProcessor | None = None
        self._unread = PendingHeaders(self._read_headers)
        """Request headers answered before they were read (a BUFFERED body follows)."""
        self._release: Callable[[Decision], list[Action]] | None = None
        """The reply that releases a request held for the picker's prefill (state PREFILL)."""
        self._new_session: tuple[str, str] | None = None
        """The response header that tells the client the session this request started."""
        self._held: tuple[Prepared, HoldingPort, Callable[[Decision], Sequence[Step]]] | None = None
        """A request waiting for room (state HOLDING): what it is, where, and what follows its pick."""

    @property
    def decision(self) -> Decision | None:
        return self._picked.decision if self._picked is not None else None

    def handle(self, event: Event) -> Sequence[Step]:
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
    def _on_request_headers(self, event: RequestHeaders) -> Sequence[Step]:
        self._started = self._clock.now()
        self._subset = event.subset_hint
        pool = self._pool = resolve_pool(self._directory, self._pool_name, event.headers)
        upgrade = upgrade_of(event.headers)
        if upgrade is not None:
            return self._on_upgrade(event, upgrade)
        plan = self._plan = plan_request(event.modes or self._config.default_modes,
                                         has_body=not event.end_of_stream, pool=pool, config=self._config,
                                         headers=event.headers)
        if plan.read_headers_later:  # the reply goes first (module docstring): a shorter
            # request-headers call for Envoy (bench/results/extproc_phases.md)
            self._unread.hold(event)
            if self._after_reply is not None:
                self._after_reply.defer("reading the request headers", self._unread.read)
        else:
            self._read_headers(event)
        if event.end_of_stream:
            return self._admit(b"", self._bodyless_reply)
        self.state = State.REQUEST_BODY
        if plan.full_duplex_request:
            return []
        # nothing to strip yet when the headers are read later (the body's reply strips them)
        edit = HeaderEdit(remove=self._strip)
        return [ContinueHeaders(Phase.REQUEST, edit, skip_response=plan.skip_response)]

    def _on_upgrade(self, event: RequestHeaders, upgrade: str) -> Sequence[Step]:
        """A WebSocket session (``extproc.upgrades``): picked on its headers, then a tunnel whose
        end is the stream's."""
        self._plan = RequestPlan(event.modes or self._config.default_modes, observe=False, skip_response=True,
                                 reported=False, read_headers_later=False)
        self._read_headers(event)
        check_upgrade(upgrade, self._headers.get(":path", ""))
        return self._admit(b"", self._tunnel_reply)

    def _tunnel_reply(self, decision: Decision) -> list[Action]:
        reply = header_reply(decision, self._config, self._strip, None, streamed_body=False)
        self.state = State.TUNNEL
        return [dataclasses.replace(reply, tunnel=True)]

    def _on_tunnel_chunk(self, event: RequestBodyChunk | ResponseBodyChunk) -> list[Action]:
        """A session's frames, where Envoy sends them anyway: back unchanged, at once."""
        if isinstance(event, RequestBodyChunk):
            phase, mode = Phase.REQUEST, self._plan.modes.request
        else:
            phase, mode = Phase.RESPONSE, self._plan.modes.response
        if mode is BodyMode.FULL_DUPLEX_STREAMED:
            return [StreamBody(phase, event.data, event.end_of_stream)]
        return [ContinueBody(phase)]

    def _on_tunnel_response(self, event: ResponseHeaders) -> list[Action]:
        assert self._picked is not None
        self._picked.served_by(event.served_endpoint)
        return [ContinueHeaders(Phase.RESPONSE)]

    def _on_tunnel_closed(self, event: StreamClosed) -> list[Action]:
        # (Envoy cancels the stream as soon as the reply turned every phase off: nothing of the
        # session's outcome comes here, so it never counts against the replica)
        self._finish(ok=True)
        self.state = State.DONE
        return []

    def _bodyless_reply(self, decision: Decision) -> list[Action]:
        outcome = self._outcome(decision)
        return [header_reply(decision, self._config, self._strip, outcome, streamed_body=False)]

    def _read_headers(self, event: RequestHeaders) -> None:
        """The headers kept (forged system headers set aside to strip) and the API; a path outside
        the inference API, headers over their limits, a declared length over the limit refused."""
        assert self._pool is not None
        read = read_request_headers(event.headers)
        self._headers, self._strip, self._api = read.headers, read.strip, read.api
        if self._trace is not None:
            client_id = read.headers.get("x-request-id")
            if client_id:
                self._trace.note("http.request.header.x-request-id", client_id)
        read.refuse(self._config.max_body_bytes, self._pool.extra_paths)

    def _on_request_body(self, event: RequestBodyChunk) -> Sequence[Step]:
        self._unread.require()
        if event.subset_hint is not None:
            self._subset = event.subset_hint
        self._body.append(event.data)
        if not self._plan.full_duplex_request:
            buffered = self._plan.buffered_request
            if not buffered and not event.end_of_stream:
                return [ContinueBody(Phase.REQUEST)]  # STREAMED: chunks pass; decide on the last one
            # BUFFERED: this one message is the whole body; headers are still held by Envoy. (A
            # STREAMED body has gone on: its prefill is left to the decode endpoint.)
            return self._admit(self._body.take(), partial(self._released, reply=self._body_reply,
                                                          prefill=buffered))
        if not event.end_of_stream:
            return []
        return self._admit(self._body.take(), partial(self._released, reply=self._duplex_reply))

    def _body_reply(self, decision: Decision) -> list[Action]:
        return [body_reply(decision, self._config, self._strip, self._outcome(decision),
                           replace_body=self._plan.buffered_request)]

    def _duplex_reply(self, decision: Decision, *, trailers: bool = False) -> list[Action]:
        chunks = streamed_body(decision.body, not trailers, self._config.stream_chunk_bytes)
        tail = [ContinueTrailers(Phase.REQUEST)] if trailers else []
        head = header_reply(decision, self._config, self._strip, self._outcome(decision), streamed_body=True)
        return [head, *chunks, *tail]

    def _on_request_trailers_in_body(self, event: RequestTrailers) -> Sequence[Step]:
        self._unread.require()
        if not self._plan.full_duplex_request:
            raise ProtocolViolation("request trailers before the buffered body")
        return self._admit(self._body.take(),
                           partial(self._released, reply=partial(self._duplex_reply, trailers=True)))

    def _released(self, decision: Decision, reply: Callable[[Decision], list[Action]], *,
                  prefill: bool = True) -> Sequence[Step]:
        """``reply`` to release the picked request, or first the picker's prefill step."""
        if not (decision.prefill_by_picker and prefill):
            return reply(decision)
        self._release = reply
        self.state = State.PREFILL
        tls = self._target.model_server_tls if self._target is not None else None
        return [prefill_step(decision, self._headers, tls)]

    def _on_prefill_done(self, event: PrefillDone) -> list[Action]:
        picked, release = self._picked, self._release
        assert picked is not None
        assert release is not None
        picked.prefill_done(event.ok, event.seconds, request_fault=event.request_fault)
        prefill = picked.decision.result.prefill
        area = self._pool.holding if self._pool is not None else None
        if area is not None and prefill is not None:  # the prefill endpoint's request ended
            self._defer("holding kick", area.kick, prefill.endpoint.address)
        self._release = None
        self.state = State.UPSTREAM
        return release(decode_decision(picked.decision, event))

    def _on_trailers_passing(self, event: RequestTrailers | ResponseTrailers) -> list[Action]:
        return [ContinueTrailers(Phase.REQUEST if isinstance(event, RequestTrailers) else Phase.RESPONSE)]

    def _admit(self, body: bytes, then: Callable[[Decision], Sequence[Step]]) -> Sequence[Step]:
        """Parse the request; pick it now and go ``then``, or hold it first when its pool has flow
        control and no room (``extproc.holding``)."""
        assert self._pool is not None
        if self._after_reply is not None:
            self._after_reply.flush()  # every earlier pick (and end) counted before this one
        session = session_of(self._headers, self._config.session) if self._config.session else None
        self._new_session = session.set_header if session is not None else None
        prepared = prepare(
            pool=self._pool, api=self._api, headers=self._headers, body=body, subset=self._subset,
            inject_usage=self._config.inject_include_usage and self._plan.observe,
            # our own id: the scheduler keys in-flight state by it (clients repeat x-request-id)
            request_id=self._request_ids(), limiter=self._config.tenant_limiter,
            session_id=session.id if session is not None else None,
        )
        area = self._pool.holding
        if area is None:
            return then(self._pick(prepared))
        request = prepared.request
        if not area.must_wait():
            area.passed(request)
            return then(self._pick(prepared))
        if area.may_take_reserved(request.fairness_id or "", request.priority):
            area.passed(request)
            return then(self._pick(prepared, reserved=True))
        steps = hold_steps(area, request, self._clock.now(), message_timeout_s=self._config.message_timeout_s,
                           extend_timer=not self._plan.full_duplex_request)
        self._held = (prepared, area, then)
        self.state = State.HOLDING
        return steps

    def _on_hold_ended(self, event: HoldEnded) -> Sequence[Step]:
        assert self._held is not None
        prepared, area, then = self._held
        self._held = None
        request = prepared.request
        if event.outcome is HoldOutcome.DISPATCHED:
            try:
                decision = self._pick(prepared)
            finally:  # after the pick's feedback: the next grant sees it in flight
                self._defer("grant_used", area.grant_used, request.request_id)
            return then(decision)
        area.leave(request.request_id)
        raise hold_refusal(event.outcome, request, area)

    def _on_closed_while_held(self, event: StreamClosed) -> list[Action]:
        if self._held is not None:
            self._held[1].leave(self._held[0].request.request_id)
            self._held = None
        self.state = State.DONE
        return []

    def _defer(self, what: str, call: Callable[..., None], *args: Any) -> None:
        if self._after_reply is not None:
            self._after_reply.defer(what, call, *args)
        else:
            call(*args)

    def _pick(self, prepared: Prepared, *, reserved: bool = False) -> Decision:
        assert self._pool is not None
        if self._after_reply is not None:
            self._after_reply.flush()  # every earlier pick counted before this one is scored
        # a request continuing a stored response stays in its pool: only where it is stored answers
        continues = prepared.request.previous_response_id is not None
        target = self._target = self._pool if continues else spill_target(self._pool, self._metrics)
        decision = schedule(prepared, pool=target, now=self._clock.now, metrics=self._metrics,
                            limiter=self._config.tenant_limiter, trace=self._trace,
                            reserved=reserved and target is self._pool, sessions=self._config.recent_sessions)
        if self._trace is not None:
            self._trace.picked(decision.request, decision.result)
            _log.debug("request %s (x-request-id %s, trace %s): picked %s", decision.request.request_id,
                       self._headers.get("x-request-id"), self._trace.trace_id, decision.result.pick.address)
        picked = PickedRequest(decision, target.scheduler, metrics=self._metrics,
                               clock=self._clock, started=self._started, after_reply=self._after_reply)
        self._picked = picked
        self.state = State.UPSTREAM
        # no response headers will come for a skipped stream: its first token goes unseen
        picked.picked(first_token_unseen=self._plan.skip_response and decision.request.stream)
        return decision

    def _outcome(self, decision: Decision) -> str | None:
        """The outcome mark, when Envoy reports this request's outcome afterwards."""
        return outcome_header(self._labels, streamed=decision.request.stream) if self._plan.reported else None

    # response path -------------------------------------------------------------------------
    def _on_response_headers(self, event: ResponseHeaders) -> list[Action]:
        picked = self._picked
        assert picked is not None
        picked.served_by(event.served_endpoint)
        self._status, content_type = response_head(event.headers)
        if self._trace is not None:
            self._trace.served(picked.served.address, self._status)
        if self._status >= 500:
            picked.endpoint_failed()
        self._response = response_processor(picked.decision, self._config, content_type)
        # (a new session's Set-Cookie beside any the model server set)
        edit = HeaderEdit(remove=("content-length",) if self._response.edits else (),
                          append=(self._new_session,) if self._new_session is not None else ())
        if event.end_of_stream:
            self._finish(ok=self._status_ok)
            self.state = State.RESPONSE_DONE
            return [ContinueHeaders(Phase.RESPONSE, edit)]
        plan = self._plan
        if not plan.response_body_off:
            self.state = State.RESPONSE_BODY
            return [ContinueHeaders(Phase.RESPONSE, edit)]
        if plan.observe or self._response.edits:
            # Turn the body on for this request (STREAMED: chunks as they come, no buffering limit).
            self.state = State.RESPONSE_BODY
            return [ContinueHeaders(Phase.RESPONSE, edit, response_body_mode=BodyMode.STREAMED)]
        self.state = State.RESPONSE_PASSTHROUGH
        if "text/event-stream" in content_type:
            picked.first_token_unseen()
        else:  # a whole (non-streamed) response: its headers come when it is complete
            picked.first_token()
        return [ContinueHeaders(Phase.RESPONSE, edit)]

    def _on_response_body(self, event: ResponseBodyChunk) -> list[Action]:
        processor, picked = self._response, self._picked
        assert processor is not None
        assert picked is not None
        picked.served_by(event.served_endpoint)
        if event.data and processor.carries_output(event.data):
            picked.first_token()
        out = processor.feed(event.data, event.end_of_stream)
        if event.end_of_stream:
            self._complete_response()
        if self._plan.modes.response is BodyMode.FULL_DUPLEX_STREAMED:
            if out or event.end_of_stream:
                return [StreamBody(Phase.RESPONSE, out, event.end_of_stream)]
            return []
        return [ContinueBody(Phase.RESPONSE, body=None if out == event.data else out)]

    def _on_response_trailers(self, event: ResponseTrailers) -> list[Action]:
        actions: list[Action] = []
        if self.state is State.RESPONSE_BODY and self._response is not None:
            tail = self._response.feed(b"", True)
            if tail and self._plan.modes.response is BodyMode.FULL_DUPLEX_STREAMED:
                actions.append(StreamBody(Phase.RESPONSE, tail, False))
            self._complete_response()
        actions.append(ContinueTrailers(Phase.RESPONSE))
        return actions

    def _on_local_reply(self, event: ResponseHeaders) -> list[Action]:
        """Response headers before the pick: Envoy's own reply (its 413 while the body was arriving),
        passed as it is (Envoy's local reply configuration gives it its JSON)."""
        self.state = State.DONE
        return [ContinueHeaders(Phase.RESPONSE)]

    def _complete_response(self) -> None:
        assert self._picked is not None
        assert self._response is not None
        usage = self._response.usage
        if usage is not None:
            self._picked.usage(usage, self._config.tenant_limiter)
            if self._trace is not None:
                self._trace.usage(usage)
        self._finish(ok=self._status_ok)
        self.state = State.RESPONSE_DONE

    # ending --------------------------------------------------------------------------------
    def _on_closed(self, event: StreamClosed) -> list[Action]:
        # a skipped response's request ends here for the picker; with outcome reports, whether it
        # went well is counted when its report comes
        self._finish(ok=self._plan.skip_response and self.state is State.UPSTREAM and not event.cancelled,
                     count_outcome=not self._plan.reported)
        self.state = State.DONE
        return []

    def _on_closed_after_response(self, event: StreamClosed) -> list[Action]:
        """The one-pass data path's end of request: Envoy closes the stream at the end of the HTTP
        request (a half-close, or a cancellation: not a reliable sign of a reset, see above)."""
        self._finish(ok=self._status_ok and not event.cancelled)
        self.state = State.DONE
        return []

    def _fail(self, error: BaseException) -> list[Action]:
        if self._held is not None:  # refused while it waited (a protocol violation): out of the queue
            self._held[1].leave(self._held[0].request.request_id)
            self._held = None
        reply = immediate_response(error, self._api)
        code = error.code if isinstance(error, KvgateError) else "internal_error"
        self._metrics.request_error(self._labels, code)
        if self._trace is not None:
            self._trace.refused(reply.status, code)
        if isinstance(error, KvgateError):
            _log.log(logging.DEBUG if error.status < 500 else logging.INFO,
                     "request %s (x-request-id %s, trace %s): %s %s", "refused" if error.status < 500
                     else "failed", self._headers.get("x-request-id"),
                     self._trace.trace_id if self._trace is not None else "-", error.status, error.message)
        self._finish(ok=False)
        self.state = State.DONE
        return [reply]

    def _finish(self, *, ok: bool, count_outcome: bool = True) -> None:
        """The request's end, once, when it was picked (``PickedRequest.finish``)."""
        picked = self._picked
        if picked is not None and not picked.finished:
            picked.finish(ok=ok, count_outcome=count_outcome)
            for pool in {id(p): p for p in (self._pool, self._target) if p is not None}.values():
                area = pool.holding
                if area is not None:  # after the scheduler hears of the end: room may have freed
                    self._defer("holding kick", area.kick, *picked.freed_endpoints())

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


Handler = Callable[[RequestLifecycle, Any], Sequence[Step]]

TRANSITIONS: Mapping[tuple[State, type], Handler] = MappingProxyType(
    {
        (State.START, RequestHeaders): RequestLifecycle._on_request_headers,
        (State.START, StreamClosed): RequestLifecycle._on_closed,
        (State.START, ResponseHeaders): RequestLifecycle._on_local_reply,
        (State.REQUEST_BODY, ResponseHeaders): RequestLifecycle._on_local_reply,
        (State.REQUEST_BODY, RequestBodyChunk): RequestLifecycle._on_request_body,
        (State.REQUEST_BODY, RequestTrailers): RequestLifecycle._on_request_trailers_in_body,
        (State.REQUEST_BODY, StreamClosed): RequestLifecycle._on_closed,
        (State.PREFILL, PrefillDone): RequestLifecycle._on_prefill_done,
        (State.HOLDING, HoldEnded): RequestLifecycle._on_hold_ended,
        (State.HOLDING, StreamClosed): RequestLifecycle._on_closed_while_held,
        (State.PREFILL, StreamClosed): RequestLifecycle._on_closed,
        (State.UPSTREAM, RequestTrailers): RequestLifecycle._on_trailers_passing,
        (State.UPSTREAM, ResponseHeaders): RequestLifecycle._on_response_headers,
        (State.UPSTREAM, StreamClosed): RequestLifecycle._on_closed,
        (State.RESPONSE_PASSTHROUGH, ResponseTrailers): RequestLifecycle._on_trailers_passing,
        (State.RESPONSE_PASSTHROUGH, StreamClosed): RequestLifecycle._on_closed_after_response,
        (State.RESPONSE_BODY, ResponseBodyChunk): RequestLifecycle._on_response_body,
        (State.RESPONSE_BODY, ResponseTrailers): RequestLifecycle._on_response_trailers,
        (State.RESPONSE_BODY, StreamClosed): RequestLifecycle._on_closed,
        (State.RESPONSE_DONE, ResponseTrailers): RequestLifecycle._on_response_trailers,
        (State.RESPONSE_DONE, StreamClosed): RequestLifecycle._on_closed,
        (State.TUNNEL, RequestBodyChunk): RequestLifecycle._on_tunnel_chunk,
        (State.TUNNEL, RequestTrailers): RequestLifecycle._on_trailers_passing,
        (State.TUNNEL, ResponseHeaders): RequestLifecycle._on_tunnel_response,
        (State.TUNNEL, ResponseBodyChunk): RequestLifecycle._on_tunnel_chunk,
        (State.TUNNEL, ResponseTrailers): RequestLifecycle._on_trailers_passing,
        (State.TUNNEL, StreamClosed): RequestLifecycle._on_tunnel_closed,
    }
)
"""State × event type → handler. A pair not listed is a protocol violation (500), except in DONE."""
