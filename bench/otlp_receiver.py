"""An OTLP/gRPC trace receiver: the collector's ``TraceService`` from the published OTLP protos
(``opentelemetry-proto``), keeping every span it is sent (Envoy's and the picker's). The tracing
tests read the spans; ``bench.datapath.up --otlp`` gives the traced gateway somewhere to export."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str
    span: trace_pb2.Span

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def name(self) -> str:
        return self.span.name

    def attribute(self, key: str) -> object:
        for kv in self.span.attributes:
            if kv.key == key:
                value = kv.value
                kind = value.WhichOneof("value")
                if kind == "array_value":
                    items = value.array_value.values
                    return [getattr(v, v.WhichOneof("value") or "string_value") for v in items]
                return getattr(value, kind) if kind else None
        return None

    @property
    def error(self) -> bool:
        return self.span.status.code == trace_pb2.Status.STATUS_CODE_ERROR


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver, keep: bool) -> None:
        self.receiver = receiver
        self.keep = keep

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = next((kv.value.string_value for kv in resource_spans.resource.attributes
                            if kv.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                self.receiver.received += len(scope_spans.spans)
                if self.keep:
                    self.receiver.spans.extend(ReceivedSpan(service, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self, keep: bool = True) -> None:
        """``keep``: False counts the spans (``received``) without keeping them (a benchmark)."""
        self.received = 0
        self.spans: list[ReceivedSpan] = []
        self._server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _TraceService(self, keep), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(0.2)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_for(self, found: Callable[[list[ReceivedSpan]], bool], what: str,
                       timeout_s: float = 10.0) -> None:
        """Until ``found(spans)`` (exporters batch: Envoy's flush every 5 s, the picker's 0.5 s)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not found(self.spans):
            if asyncio.get_running_loop().time() > deadline:
                names = sorted({(s.service, s.name) for s in self.spans})
                raise AssertionError(f"no {what} within {timeout_s} s; spans received: {names}")
            await asyncio.sleep(0.1)
