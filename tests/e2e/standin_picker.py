"""STAND-IN picker for the harness tests, until extproc/ lands. Not kvgate's picker.

It always routes to one fixed upstream: sets ``x-gateway-destination-endpoint`` (and ``envoy.lb``
metadata, ``clear_route_cache``), follows Envoy's full-duplex and buffered message sequences
(see docs/envoy-extproc.md), and records what it received.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from kvgate.extproc.names import DESTINATION_HEADER, LB_NAMESPACE, POOL_METADATA_KEY
from kvgate.gateway.processes.envoy_process import free_port

CHUNK = 62_000


@dataclass
class StreamRecord:
    pool: str | None
    kinds: list[str] = field(default_factory=list)
    request_headers: dict[str, str] = field(default_factory=dict)
    request_body_mode: str = ""
    body: bytes = b""
    served: str | None = None


def _overwrite(name: str, value: str) -> Any:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _streamed(body: bytes, end: bool) -> Any:
    return pb.CommonResponse(
        body_mutation=pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=end))
    )


class StandInPicker(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, destination: str) -> None:
        self.destination = destination
        self.streams: list[StreamRecord] = []

    def _decision(self) -> tuple[Any, Any]:
        common = pb.CommonResponse(
            header_mutation=pb.HeaderMutation(set_headers=[_overwrite(DESTINATION_HEADER, self.destination)]),
            clear_route_cache=True,
        )
        metadata = struct_pb2.Struct()
        metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: self.destination}})
        return common, metadata

    async def Process(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        invocation = dict(context.invocation_metadata() or ())
        record = StreamRecord(pool=invocation.get(POOL_METADATA_KEY))
        self.streams.append(record)
        chunks: list[bytes] = []
        async for request in requests:
            kind = request.WhichOneof("request")
            record.kinds.append(kind)
            if kind == "request_headers":
                headers = request.request_headers.headers.headers
                record.request_headers = {h.key: h.raw_value.decode() for h in headers}
                record.request_body_mode = processing_mode_pb2.ProcessingMode.BodySendMode.Name(
                    request.protocol_config.request_body_mode
                )
                if request.request_headers.end_of_stream:
                    common, metadata = self._decision()
                    yield pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common),
                                                dynamic_metadata=metadata)
                elif record.request_body_mode == "BUFFERED":
                    yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "request_body":
                chunks.append(request.request_body.body)
                if not request.request_body.end_of_stream:
                    continue
                record.body = b"".join(chunks)
                common, metadata = self._decision()
                if record.request_body_mode == "BUFFERED":
                    yield pb.ProcessingResponse(request_body=pb.BodyResponse(response=common),
                                                dynamic_metadata=metadata)
                    continue
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common),
                                            dynamic_metadata=metadata)
                pieces = [record.body[i:i + CHUNK] for i in range(0, len(record.body), CHUNK)] or [b""]
                for index, piece in enumerate(pieces):
                    yield pb.ProcessingResponse(
                        request_body=pb.BodyResponse(response=_streamed(piece, index == len(pieces) - 1))
                    )
            elif kind == "response_headers":
                attributes = request.attributes.get("envoy.filters.http.ext_proc")
                if attributes is not None and "upstream.address" in attributes.fields:
                    record.served = attributes.fields["upstream.address"].string_value
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            elif kind == "response_body":
                body = request.response_body
                yield pb.ProcessingResponse(response_body=pb.BodyResponse(
                    response=_streamed(body.body, body.end_of_stream)))
            elif kind == "request_trailers":
                yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


@dataclass
class RunningPicker:
    server: grpc.aio.Server
    picker: StandInPicker
    port: int

    async def stop(self) -> None:
        await self.server.stop(grace=None)


async def start_standin_picker(destination: str) -> RunningPicker:
    picker = StandInPicker(destination)
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return RunningPicker(server, picker, port)
