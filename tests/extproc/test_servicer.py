"""The grpc.aio servicer over a real loopback channel, with the gRPC health service."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvgate.extproc.server import EXT_PROC_SERVICE, ExtProcServer
from tests.extproc.fakes import (
    FakeDirectory,
    RecordingMetrics,
    completion,
    make_pool,
    request_body,
    request_headers,
    response_body,
    response_headers,
    set_headers,
)


async def test_process_stream_and_health_over_loopback() -> None:
    llama = make_pool("10.0.0.1:8000", name="llama")
    other = make_pool("10.9.9.9:8000", name="other")
    server = ExtProcServer(
        FakeDirectory({"llama": llama, "other": other}, default="llama"), address="127.0.0.1:0"
    )
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", EXT_PROC_SERVICE):
                answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING

            stub = pb_grpc.ExternalProcessorStub(channel)
            call = stub.Process(metadata=(("x-kvgate-pool", "other"),))
            await call.write(request_headers())
            await call.write(request_body(completion()))
            await call.write(request_body(b"", eos=True))
            first = await call.read()
            assert set_headers(first)["x-gateway-destination-endpoint"] == "10.9.9.9:8000"
            body = await call.read()
            assert json.loads(body.request_body.response.body_mutation.streamed_response.body)["model"] == "m"
            await call.write(response_headers())
            assert (await call.read()).WhichOneof("response") == "response_headers"
            await call.write(response_body(b'{"usage":{"prompt_tokens":1,"completion_tokens":1}}', eos=True))
            assert (await call.read()).WhichOneof("response") == "response_body"
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
            assert [k for k, _ in other.scheduler.calls] == ["picked", "usage", "finished"]

            # A stream cancelled mid-response still ends the request once (on_finished, not ok).
            async def messages() -> AsyncIterator[pb.ProcessingRequest]:
                yield request_headers()
                yield request_body(completion(), eos=True)
                yield response_headers()
                await asyncio.sleep(30)

            cancelled = stub.Process(messages())
            seen = 0
            async for _ in cancelled:
                seen += 1
                if seen == 3:
                    break
            cancelled.cancel()
            for _ in range(200):
                if llama.scheduler.count("finished"):
                    break
                await asyncio.sleep(0.01)
            assert llama.scheduler.calls[-1] == ("finished", ("10.0.0.1:8000", False))
            assert llama.scheduler.count("finished") == 1
    finally:
        await server.stop(0)


async def test_request_metrics_are_recorded_after_the_replies_of_a_stream() -> None:
    """The servicer writes each reply, then records the metrics its lifecycle queued
    (extproc.after_reply): every count is there once the stream has ended."""
    pool = make_pool("10.0.0.1:8000", name="llama")
    recorder = RecordingMetrics()
    server = ExtProcServer(FakeDirectory({"llama": pool}, default="llama"), address="127.0.0.1:0",
                           metrics=recorder)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = pb_grpc.ExternalProcessorStub(channel).Process()
            await call.write(request_headers())
            await call.write(request_body(completion(), eos=True))
            await call.read()
            await call.read()
            await call.write(response_headers())
            await call.read()
            await call.write(response_body(b'{"usage":{"prompt_tokens":3,"completion_tokens":2}}', eos=True))
            await call.read()
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
        for _ in range(200):
            if any(name == "finished" for name, _ in recorder.events):
                break
            await asyncio.sleep(0.01)
        names = [name for name, _ in recorder.events]
        assert names[:2] == ["scheduled", "picked"]
        assert "tokens" in names
        assert names[-1] == "finished"
    finally:
        await server.stop(0)
