"""The picker's spans of one request (OpenTelemetry API; the SDK and exporter are set up by the
composition root, ``gateway.picker.tracing``).

Per ext_proc stream, a server span ``envoy.service.ext_proc.v3.ExternalProcessor/Process`` whose
parent is Envoy's span of the ext_proc call (the W3C ``traceparent`` Envoy puts in the call's gRPC
metadata), with:

- the request (``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.request.max_tokens``,
  the model rewrite, the pool, ``x-request-id``) and the pick (``kvgate.endpoint``, its fallbacks,
  the prefill endpoint of a split request), the endpoint that served it (a fallback is an event),
  the response's status and, where the picker read it, ``gen_ai.usage.*``; a refused request's
  span has the error status and ``error.type`` (kvgate's error code);
- a child span per scheduling profile run (``kvgate.schedule <profile>``: the candidates' count,
  the chosen endpoint with its total and per-scorer scores, its predicted prefix hit in tokens and
  estimated TTFT), and under it one span per filter, scorer and picker with its duration;
- a client span ``kvgate.prefill`` for a prefill the picker runs (``extproc.prefill_step``).

Requests arriving without a trace context are sampled by the provider's sampler (its ratio); a
request that is not sampled gets no span beyond the SDK's non-recording one, and with tracing off
(no :class:`RequestTracer`) nothing at all is made.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvgate.policies.contracts import SchedulingResult
from kvgate.policies.framework import SchedulingContext
from kvgate.policies.types import ApiKind, EndpointView, InferenceRequest, Usage

SPAN_NAME: Final = "envoy.service.ext_proc.v3.ExternalProcessor/Process"
_PROPAGATOR = TraceContextTextMapPropagator()
_RPC_ATTRIBUTES = {"rpc.system": "grpc", "rpc.service": "envoy.service.ext_proc.v3.ExternalProcessor",
                   "rpc.method": "Process"}
_TRACE_KEYS = frozenset({"traceparent", "tracestate"})
_OPERATION = {
    ApiKind.CHAT_COMPLETIONS: "chat",
    ApiKind.COMPLETIONS: "text_completion",
    ApiKind.EMBEDDINGS: "embeddings",
    ApiKind.MESSAGES: "chat",
}
"""OpenTelemetry's ``gen_ai.operation.name`` values for the OpenAI APIs kvgate parses."""


class RequestTracer:
    """Starts a :class:`RequestSpan` per ext_proc stream (one per picker process)."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def start(self, metadata: Iterable[tuple[str, str | bytes]]) -> RequestSpan | None:
        """The stream's span, a child of the caller's trace context; None when not sampled."""
        carrier = {key: value if isinstance(value, str) else value.decode()
                   for key, value in metadata if key in _TRACE_KEYS}
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        span = self._tracer.start_span(SPAN_NAME, context=parent, kind=SpanKind.SERVER,
                                       attributes=_RPC_ATTRIBUTES)
        if not span.is_recording():
            return None
        return RequestSpan(self._tracer, span)


class RequestSpan:
    """One request's spans (the module docstring); implements ``extproc.ports.RequestTrace``."""

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self._tracer = tracer
        self.span = span
        self._context: Context = trace.set_span_in_context(span)
        self._plugins: list[tuple[str, str, str, int, int]] = []
        """(extension point, plugin type, name, start ns, end ns) of the profile being run."""
        self._scores: list[tuple[str, Sequence[EndpointView], Sequence[float] | Mapping[str, float]]] = []
        self._described = False
        self._picked = ""
        self._status = 0

    @property
    def trace_id(self) -> str:
        return format(self.span.get_span_context().trace_id, "032x")

    # --- SchedulingTrace ------------------------------------------------------------------------

    def observe(self, extension_point: str, plugin_type: str, plugin_name: str, seconds: float) -> None:
        end = time.time_ns()
        self._plugins.append((extension_point, plugin_type, plugin_name, end - int(seconds * 1e9), end))

    def scored(self, scorer: str, endpoints: Sequence[EndpointView],
               values: Sequence[float] | Mapping[str, float]) -> None:
        self._scores.append((scorer, endpoints, values))

    def ranked(self, ctx: SchedulingContext, profile: str, candidates: int,
               ranked: Sequence[EndpointView], totals: Mapping[str, float]) -> None:
        plugins, scores = self._plugins, self._scores
        self._plugins, self._scores = [], []
        end = time.time_ns()
        chosen = ranked[0].address
        attributes: dict[str, str | int | float | bool | Sequence[str]] = {
            "kvgate.profile": profile,
            "kvgate.candidates": candidates,
            "kvgate.endpoint": chosen,
            "kvgate.fallbacks": [e.address for e in ranked[1:]],
        }
        total = totals.get(chosen)
        if total is not None:
            attributes["kvgate.score"] = round(total, 6)
        for scorer, endpoints, values in scores:
            value = _score_of(chosen, endpoints, values)
            if value is not None:
                attributes[f"kvgate.score.{scorer}"] = round(value, 6)
        matches = ctx.known_prefix_matches()
        if matches is not None:
            attributes["kvgate.prefix.predicted_tokens"] = matches.get(chosen, 0) * ctx.tokens_per_block
        estimates = ctx.ttft_estimates
        if estimates and chosen in estimates:
            attributes["kvgate.ttft.estimated_s"] = round(estimates[chosen], 6)
        start = min((p[3] for p in plugins), default=end)
        span = self._tracer.start_span(f"kvgate.schedule {profile}", context=self._context,
                                       attributes=attributes, start_time=start)
        inside = trace.set_span_in_context(span)
        for point, plugin_type, name, p_start, p_end in plugins:
            self._tracer.start_span(f"kvgate.{point} {name}", context=inside, start_time=p_start,
                                    attributes={"kvgate.plugin.type": plugin_type}).end(end_time=p_end)
        span.end(end_time=end)

    def note(self, key: str, value: str | int | float | bool) -> None:
        self.span.set_attribute(key, value)

    # --- what the servicer sees of the lifecycle -------------------------------------------------

    def picked(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """The request as parsed and the pick (once)."""
        if self._described:
            return
        self._described = True
        span = self.span
        operation = _OPERATION.get(request.api)
        if operation is not None:
            span.set_attribute("gen_ai.operation.name", operation)
        if request.model:
            span.set_attribute("gen_ai.request.model", request.model)
            if request.target_model and request.target_model != request.model:
                span.set_attribute("kvgate.model_rewrite", request.target_model)
        if request.max_tokens is not None:
            span.set_attribute("gen_ai.request.max_tokens", request.max_tokens)
        span.set_attribute("kvgate.stream", request.stream)
        span.set_attribute("kvgate.pool", request.pool)
        span.set_attribute("kvgate.request_id", request.request_id)
        self._picked = result.pick.address
        span.set_attribute("kvgate.endpoint", self._picked)
        if result.prefill is not None:
            span.set_attribute("kvgate.prefill.endpoint", result.prefill.endpoint.address)

    def served(self, endpoint: str | None, status: int) -> None:
        """The response's headers: who served it (a fallback named) and its status."""
        self._status = status
        self.span.set_attribute("http.response.status_code", status)
        if endpoint and self._picked and endpoint != self._picked:
            self.span.add_event("kvgate.fallback", {"kvgate.endpoint.served": endpoint,
                                                    "kvgate.endpoint.failed": self._picked})
        if endpoint:
            self.span.set_attribute("kvgate.endpoint.served", endpoint)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, f"upstream status {status}"))

    def refused(self, status: int, code: str) -> None:
        """A local reply (an error the picker answered): the error status and kvgate's code."""
        self._status = status
        self.span.set_attribute("http.response.status_code", status)
        self.span.set_attribute("error.type", code)
        self.span.set_status(Status(StatusCode.ERROR, code))

    def usage(self, usage: Usage) -> None:
        self.span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        self.span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)

    def start_prefill(self, endpoint: str) -> Span:
        """The client span of the picker's prefill call (ended by the caller)."""
        host, _, port = endpoint.rpartition(":")
        return self._tracer.start_span("kvgate.prefill", context=self._context, kind=SpanKind.CLIENT,
                                       attributes={"server.address": host, "server.port": int(port or 0),
                                                   "kvgate.endpoint": endpoint})

    def inject(self, headers: dict[str, str], span: Span) -> None:
        """``span``'s W3C context into outgoing HTTP ``headers`` (the prefill request's)."""
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))

    def end(self, *, cancelled: bool) -> None:
        if cancelled and not self._status:
            self.span.set_attribute("kvgate.cancelled", True)
        self.span.end()


def _score_of(address: str, endpoints: Sequence[EndpointView],
              values: Sequence[float] | Mapping[str, float]) -> float | None:
    if isinstance(values, Mapping):
        return values.get(address)
    for view, value in zip(endpoints, values, strict=False):
        if view.address == address:
            return value
    return None
