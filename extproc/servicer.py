"""The grpc.aio ExternalProcessor: a thin loop around :class:`extproc.lifecycle.RequestLifecycle`.

Its IO besides the stream: a ``RunPrefill`` step the lifecycle returns (a disaggregated request
whose prefill the picker runs, ``extproc.prefill_step``) is awaited here and its ``PrefillDone``
handed back to the lifecycle, whose answer goes on to Envoy; an ``AwaitHold`` (a request held for
room in its pool, ``extproc.holding``) likewise, its outcome handed back as ``HoldEnded``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from opentelemetry.trace import Status, StatusCode

from kvgate.extproc import codec, names
from kvgate.extproc.actions import AwaitHold, RunPrefill, Step
from kvgate.extproc.after_reply import AfterReply, DeferredMetrics
from kvgate.extproc.bbr import BBR_ROLE, ROLE_METADATA_KEY, BodyBasedRouter
from kvgate.extproc.events import Event, HoldEnded, PrefillDone, StreamClosed
from kvgate.extproc.lifecycle import RequestLifecycle
from kvgate.extproc.lifecycle_config import LifecycleConfig, RequestIds
from kvgate.extproc.ports import Clock, MonotonicClock, NoMetrics, PoolDirectory, RequestMetrics
from kvgate.extproc.session_persistence import SessionSpec
from kvgate.extproc.session_spread import RecentSessions
from kvgate.extproc.tracing import RequestSpan, RequestTracer

_log = logging.getLogger(__name__)


Context = grpc.aio.ServicerContext[pb.ProcessingRequest, pb.ProcessingResponse]


class StreamMachine(Protocol):
    """What the servicer drives per stream: the picker's lifecycle or the body-based router."""

    def handle(self, event: Event) -> Sequence[Step]: ...


class PrefillRunner(Protocol):
    """Runs a disaggregated request's prefill half (``extproc.prefill_client.PrefillClient``)."""

    async def run(self, step: RunPrefill) -> PrefillDone: ...


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """A stream's gRPC initial metadata: ``x-kvgate-role`` (``bbr`` for the body-based router) and,
    set by Envoy's per-route ``ExtProcPerRoute`` override, ``x-kvgate-pool``, the route rule's
    backendRequest (``x-kvgate-backend-request-ms``) and session persistence (``x-kvgate-session``)."""

    role: str | None = None
    pool: str | None = None
    backend_ms: int | None = None
    session: SessionSpec | None = None


def stream_metadata(context: Context) -> StreamMetadata:
    """The stream's metadata (one pass over it)."""
    role = pool = None
    backend_ms: int | None = None
    session: SessionSpec | None = None
    for key, value in context.invocation_metadata() or ():
        text = value if isinstance(value, str) else value.decode()
        if key == names.POOL_METADATA_KEY:
            pool = text
        elif key == ROLE_METADATA_KEY:
            role = text
        elif key == names.BACKEND_REQUEST_METADATA_KEY:
            backend_ms = int(text) if text.isdigit() and int(text) > 0 else None
        elif key == names.SESSION_METADATA_KEY:
            session = SessionSpec.decode(text)
    return StreamMetadata(role, pool, backend_ms, session)


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        directory: PoolDirectory,
        *,
        clock: Clock | None = None,
        metrics: RequestMetrics | None = None,
        config: LifecycleConfig | None = None,
        prefills: PrefillRunner | None = None,
        tracer: RequestTracer | None = None,
    ) -> None:
        """``prefills``: runs the picker's prefill steps (none: a disaggregated request's prefill
        fails at once and its decode endpoint prefills). ``tracer``: the picker's spans
        (``extproc.tracing``); None: tracing off, nothing made per request."""
        self._tracer = tracer
        self._directory = directory
        self._prefills = prefills
        self._clock = clock or MonotonicClock()
        self._after_reply = AfterReply()
        """Request metrics and the scheduler's feedback, done after each message's replies are
        written (off the request's critical path; :mod:`extproc.after_reply`)."""
        self._metrics = DeferredMetrics(metrics or NoMetrics(), self._after_reply)
        self._config = config or LifecycleConfig()
        if self._config.recent_sessions is None:  # (one per process: its realtime sessions' picks)
            self._config = dataclasses.replace(self._config, recent_sessions=RecentSessions())
        self._request_ids = RequestIds().next_id

    def _new_lifecycle(self, stream: StreamMetadata, span: RequestSpan | None) -> RequestLifecycle:
        config = self._config
        if stream.backend_ms is not None:  # (a rule's backendRequest bounds this request's attempts)
            config = dataclasses.replace(config, attempt_cap_ms=stream.backend_ms)
        if stream.session is not None:  # (a rule's sessionPersistence names the session)
            config = dataclasses.replace(config, session=stream.session)
        return RequestLifecycle(
            self._directory, self._clock, pool_name=stream.pool, metrics=self._metrics, config=config,
            request_ids=self._request_ids, after_reply=self._after_reply, trace=span,
        )

    async def _run_prefill(self, step: RunPrefill, span: RequestSpan | None) -> PrefillDone:
        if self._prefills is None:
            return PrefillDone(None, 0.0, "this picker runs no prefills")
        if span is None:
            return await self._prefills.run(step)
        client = span.start_prefill(step.address)
        headers = dict(step.headers)
        span.inject(headers, client)  # the prefill endpoint's own spans join the trace
        try:
            done = await self._prefills.run(dataclasses.replace(step, headers=tuple(headers.items())))
        finally:
            client.end()
        if not done.ok:
            client.set_status(Status(StatusCode.ERROR, done.error or "prefill failed"))
        return done

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: Context,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        machine: StreamMachine
        stream = stream_metadata(context)
        span: RequestSpan | None = None
        if stream.role == BBR_ROLE:
            machine = BodyBasedRouter(max_body_bytes=self._config.max_body_bytes)
        else:
            if self._tracer is not None:
                span = self._tracer.start(context.invocation_metadata() or ())
            machine = self._new_lifecycle(stream, span)
        cancelled = True
        try:
            async for message in request_iterator:
                try:
                    event = codec.decode(message)
                except codec.UnknownMessage:
                    _log.warning("ignoring an ext_proc message with no known part")
                    continue
                steps = machine.handle(event)
                while True:
                    awaited: RunPrefill | AwaitHold | None = None
                    for step in steps:
                        if isinstance(step, (RunPrefill, AwaitHold)):
                            awaited = step
                        else:
                            yield codec.encode(step)
                    self._after_reply.flush()
                    if awaited is None:
                        break
                    if isinstance(awaited, RunPrefill):
                        steps = machine.handle(await self._run_prefill(awaited, span))
                    else:
                        steps = machine.handle(HoldEnded(await awaited.area.outcome(awaited.request_id)))
            cancelled = False
        finally:
            # Half-close, reset or cancellation: the machine ends exactly once (on_finished).
            machine.handle(StreamClosed(cancelled=cancelled))
            self._after_reply.flush()
            if span is not None:
                span.end(cancelled=cancelled)
