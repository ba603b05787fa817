"""What grpc.aio costs per ext_proc stream in the two styles a servicer can take, in one run.

``python -m kvgate.bench.grpc_servicer_style [--seconds 5] [--rounds 3] [--streams 8] [--env NAME=VALUE ...]``

- ``generator``: ``async def Process(request_iterator, context)`` that ``async for``-s over the
  request iterator and ``yield``-s its replies (grpc.aio writes each): what ``extproc.servicer``
  does;
- ``read_write``: a coroutine that calls ``await context.read()`` until ``grpc.aio.EOF`` and
  ``await context.write(reply)``.

With ``--env``, a third server runs the generator style with those environment variables (e.g.
``GRPC_EXPERIMENTS=-event_engine_listener``: grpc's own switches). Each answers the message
sequence of kvgate's default data path (request headers, then the buffered body, each answered by
one prebuilt reply; then the half-close) and does nothing else, so the difference is grpc.aio's
own. A server process per style (alternated round by round) and one
grpc.aio client in this process keeping ``--streams`` streams in flight; the figure is the server
process's CPU (all its threads, from /proc) per stream. On a 2-core machine the client and the
server each get about a core: compare the styles' ratio within a run, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from kvgate.bench.datapath.full_duplex import machine
from kvgate.bench.datapath.load import completion_bodies
from kvgate.bench.datapath.offline import envoy_messages
from kvgate.bench.datapath.procs import cpu_seconds, start_child
from kvgate.extproc import codec, names
from kvgate.extproc.actions import ContinueBody, ContinueHeaders, HeaderEdit, Phase

READY = "servicer-style ready"
STYLES = ("generator", "read_write")
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]


def replies() -> tuple[pb.ProcessingResponse, pb.ProcessingResponse]:
    """kvgate's replies to the request headers and to the body (the destination header set)."""
    pick = HeaderEdit(set=((names.DESTINATION_HEADER, "127.0.0.1:8000"),))
    return (codec.encode(ContinueHeaders(Phase.REQUEST, HeaderEdit())),
            codec.encode(ContinueBody(Phase.REQUEST, edit=pick, clear_route_cache=True)))


def requests() -> tuple[pb.ProcessingRequest, pb.ProcessingRequest]:
    """Envoy's two messages for a 1 KB request in kvgate's default: its headers, its buffered body."""
    wires = envoy_messages(completion_bodies(1024, 1)[0], "127.0.0.1:8000", 0, lean=True)
    headers, body = (pb.ProcessingRequest.FromString(wire) for wire in wires)
    return headers, body


class GeneratorStyle(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self._headers, self._body = replies()

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: Any
                      ) -> AsyncIterator[pb.ProcessingResponse]:
        async for message in request_iterator:
            yield self._headers if message.HasField("request_headers") else self._body


class ReadWriteStyle(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self._headers, self._body = replies()

    async def Process(self, request_iterator: object, context: Any) -> None:
        read, write = context.read, context.write
        while True:
            message = await read()
            if message is _EOF:
                return
            await write(self._headers if message.HasField("request_headers") else self._body)


async def serve(style: str) -> None:
    server = grpc.aio.server()
    servicer = GeneratorStyle() if style == "generator" else ReadWriteStyle()
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"{READY} {port}", flush=True)
    await server.wait_for_termination()


async def drive(port: int, streams: int, seconds: float) -> int:
    """Streams completed in ``seconds`` with ``streams`` in flight."""
    headers, body = requests()
    done = 0
    deadline = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)

        async def one_loop() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                call = stub.Process()
                await call.write(headers)
                await call.read()
                await call.write(body)
                await call.read()
                await call.done_writing()
                if await call.read() is not _EOF:
                    raise RuntimeError("the servicer sent more than two replies")
                done += 1

        await asyncio.gather(*(one_loop() for _ in range(streams)))
    return done


def variants(env: Sequence[str]) -> dict[str, tuple[str, dict[str, str]]]:
    """Variant name → (servicer style, extra environment of its server process)."""
    out: dict[str, tuple[str, dict[str, str]]] = {style: (style, {}) for style in STYLES}
    if env:
        out["generator + " + " ".join(env)] = ("generator", dict(pair.split("=", 1) for pair in env))
    return out


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    chosen = variants(args.env)
    per_stream: dict[str, list[float]] = {name: [] for name in chosen}
    for round_index in range(args.rounds):
        for style, (servicer, extra) in chosen.items():
            command = [sys.executable, "-m", "kvgate.bench.grpc_servicer_style", "--serve", servicer]
            child = await start_child(style, command, READY, env={**os.environ, **extra})
            try:
                port = int(child.ready_words[0])
                await drive(port, args.streams, 1.0)  # warm-up
                before = cpu_seconds(child.pid)
                count = await drive(port, args.streams, args.seconds)
                per_stream[style].append((cpu_seconds(child.pid) - before) / count * 1e6)
            finally:
                await child.stop()
            print(f"round {round_index + 1} {style}: {count / args.seconds:.0f} streams/s, "
                  f"server {per_stream[style][-1]:.0f} µs CPU per stream", file=sys.stderr, flush=True)
    return per_stream


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.grpc_servicer_style", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8, help="streams in flight")
    parser.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                        help="also run the generator style with these environment variables")
    parser.add_argument("--serve", choices=STYLES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    per_stream = asyncio.run(run(args))
    print(f"- command: python -m kvgate.bench.grpc_servicer_style {' '.join(sys.argv[1:])}".rstrip())
    for key, value in machine().items():
        print(f"- machine {key}: {value}")
    print(f"- python {sys.version.split()[0]}, grpcio {grpc.__version__}\n")
    print("| style | server µs CPU per stream (rounds) | median | × generator |")
    print("|---|---|---|---|")
    base = statistics.median(per_stream["generator"])
    for style, values in per_stream.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {style} | {rounds} | {median:.0f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
