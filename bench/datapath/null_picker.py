"""A null ext_proc processor: the grpc.aio + Envoy floor under any Python picker.

``python -m kvgate.bench.datapath.null_picker --destination IP:PORT [--destination ...] [--port P]
[--loop auto|uvloop|asyncio]`` (several destinations: each request the next, round robin)

With Envoy's one-pass processing mode (request headers SEND, request body BUFFERED, response phases
SKIP/NONE: the ``floor`` path of ``bench.datapath.onepass``) the same loop is the one-pass floor:
it answers the headers at once, parses the JSON body (``json.loads``) and answers it with the
destination header, ``envoy.lb`` metadata and ``clear_route_cache``: two messages each way.

It does the least a full-duplex endpoint picker must do (docs/envoy-extproc.md): hold the request
headers until the body's end, answer them with a fixed destination header + ``envoy.lb`` metadata,
re-send the body, answer response headers and echo each response chunk. No parsing, no
scheduling, no metrics: the same number of gRPC messages as kvgate for the same request, so its
CPU per request is what grpc.aio and asyncio cost. Prints ``null-picker ready PORT``.

It runs on the event loop kvgate's picker runs on by default (``--loop auto``: uvloop, as the issue's
floor did), so the two are compared on the same loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from kvgate.extproc.names import DESTINATION_HEADER, LB_NAMESPACE
from kvgate.gateway.processes import event_loop

READY_PREFIX = "null-picker ready"
BUFFERED = 2  # ProcessingMode.BodySendMode.BUFFERED
CHUNK = 62_000


def _streamed(body: bytes, end: bool) -> pb.BodyResponse:
    mutation = pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=end))
    return pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))


class NullPicker(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, destinations: Sequence[str]) -> None:
        """Each stream names the next of ``destinations`` in turn (one: every request goes there)."""
        self._answers = [self._decisions(destination) for destination in destinations]
        self._turn = 0
        self._response_headers = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
        self._continue_headers = pb.ProcessingResponse(request_headers=pb.HeadersResponse())

    @staticmethod
    def _decisions(destination: str) -> tuple[pb.ProcessingResponse, pb.ProcessingResponse]:
        """The headers' and the buffered body's answers naming ``destination`` (built once)."""
        header = base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=DESTINATION_HEADER, raw_value=destination.encode()),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        common = pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=[header]),
                                   clear_route_cache=True)
        metadata = struct_pb2.Struct()
        metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: destination}})
        return (pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common),
                                      dynamic_metadata=metadata),
                pb.ProcessingResponse(request_body=pb.BodyResponse(response=common),
                                      dynamic_metadata=metadata))

    async def Process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        chunks: list[bytes] = []
        buffered = False
        decision, body_decision = self._answers[self._turn % len(self._answers)]
        self._turn += 1
        async for message in requests:
            kind = message.WhichOneof("request")
            if kind == "request_headers":
                buffered = message.protocol_config.request_body_mode == BUFFERED
                if message.request_headers.end_of_stream:
                    yield decision
                elif buffered:
                    yield self._continue_headers
            elif kind == "request_body" and buffered:
                json.loads(message.request_body.body)  # the floor parses the body, as any picker must
                yield body_decision
            elif kind == "request_body":
                chunks.append(message.request_body.body)
                if not message.request_body.end_of_stream:
                    continue
                body = b"".join(chunks)
                yield decision
                pieces = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
                for index, piece in enumerate(pieces):
                    yield pb.ProcessingResponse(request_body=_streamed(piece, index == len(pieces) - 1))
            elif kind == "response_headers":
                yield self._response_headers
            elif kind == "response_body":
                part = message.response_body
                yield pb.ProcessingResponse(response_body=_streamed(part.body, part.end_of_stream))
            elif kind == "request_trailers":
                yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


async def serve(destinations: Sequence[str], host: str, port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(NullPicker(destinations), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"{READY_PREFIX} {bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.5)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.datapath.null_picker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--destination", required=True, action="append",
                        help="ip:port requests go to (repeatable: each request the next in turn)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    event_loop.add_loop_argument(parser)
    args = parser.parse_args(argv)
    event_loop.run(lambda: serve(args.destination, args.host, args.port), args.loop)


if __name__ == "__main__":
    main()
