"""kvgate's own CPU per request on the ext_proc path, without gRPC or Envoy.

``python -m kvgate.bench.datapath.offline [--requests N] [--size BYTES] [--one-pass | --lean] [--profile]
[--cold-mb MB]``

Replays the full-duplex message sequence Envoy sends for one completion (request headers with
``protocol_config``, the body, an empty end-of-stream chunk, response headers with the
``upstream.address`` attribute, a JSON response body with usage, an empty end-of-stream chunk),
or with ``--one-pass`` the sequence of kvgate's own data path (request headers, the buffered body,
response headers; the stream's end), or with ``--lean`` that of ``kvgate up``'s default (request
headers, the buffered body, the stream's end, then the request's outcome as one entry of Envoy's
gRPC access log, decoded and applied) through exactly what the servicer runs per message: protobuf
parse of the wire bytes, ``codec.decode``, ``RequestLifecycle.handle``, ``codec.encode`` and
protobuf serialisation, with the default profile scheduling over fresh endpoints and the
gateway's Prometheus telemetry. The difference between this and a picker's CPU per request in
the live benchmark is what grpc.aio and asyncio cost. ``--cold-mb MB`` times the request path of
``--lean`` alone (request headers and the pick), with warm caches and with MB of memory touched
between requests, as the other processes do at concurrency 1, and step by step (decode, lifecycle,
encode of each message; the work after each reply; the stream's end).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import ssl
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from kvgate.bench.datapath.load import COMPLETION_BODY_PATH, completion_bodies
from kvgate.bench.datapath.upstream import COMPLETION
from kvgate.extproc import codec, names
from kvgate.extproc.after_reply import DeferredMetrics
from kvgate.extproc.events import RequestHeaders, StreamClosed
from kvgate.extproc.lifecycle import RequestLifecycle
from kvgate.extproc.lifecycle_config import LifecycleConfig, RequestIds
from kvgate.extproc.outcomes import OutcomeReports
from kvgate.extproc.ports import MonotonicClock, Pool
from kvgate.gateway.picker.telemetry import GatewayTelemetry
from kvgate.policies.contracts import Scheduler
from kvgate.policies.profile import load_profile
from kvgate.policies.scheduler import ProfileScheduler
from kvgate.policies.types import Endpoint, EndpointMetrics, EndpointView

POOL = "bench"
FULL_DUPLEX = 4
BUFFERED = 2
NONE = 0


@dataclass
class StaticPool:
    """A pool with fixed endpoints whose metrics are refreshed by the caller (as the scraper would)."""

    name: str
    scheduler_impl: ProfileScheduler
    views: tuple[EndpointView, ...]

    extra_paths: frozenset[str] = frozenset()
    picker_runs_prefill: bool = True
    model_server_tls: ssl.SSLContext | None = None
    names_inline_media: bool = False
    honors_model_rewrite_header: bool = False
    holding: None = None
    fallback: None = None

    def has_room(self) -> bool:
        return True

    def model_known(self, model: str) -> bool | None:
        return True  # the replay's one model, served by every endpoint (as a pool that knows it)

    @property
    def scheduler(self) -> Scheduler:
        return self.scheduler_impl

    def endpoints(self) -> tuple[EndpointView, ...]:
        return self.views

    def objective_priority(self, objective: str) -> int | None:
        return None

    def rewrite_model(self, model: str, headers: Mapping[str, str]) -> str:
        return model

    @property
    def rewrites_models(self) -> bool:
        return False


class OnePool:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    def resolve(self, name: str | None) -> Pool:
        return self._pool


def fresh_views(addresses: Sequence[str], rng: random.Random, now: float) -> tuple[EndpointView, ...]:
    return tuple(
        EndpointView(
            Endpoint(address, POOL),
            EndpointMetrics(
                waiting=0, running=rng.randint(0, 4), kv_cache_usage=0.05,
                num_gpu_blocks=31_250, block_size=16, updated_at=now,
            ),
        )
        for address in addresses
    )


def _header_map(pairs: Sequence[tuple[str, str]]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=key, raw_value=value.encode()) for key, value in pairs]
    )


def envoy_messages(
    body: bytes, upstream: str, request_id: int, one_pass: bool = False, lean: bool = False
) -> list[bytes]:
    """The wire bytes of the ProcessingRequests Envoy sends for one completion (full duplex, or
    kvgate's one pass: BUFFERED request body, response headers only; ``lean``: no response phase)."""
    request_headers = [
        (":authority", "127.0.0.1:10000"), (":path", COMPLETION_BODY_PATH), (":method", "POST"),
        (":scheme", "http"), ("content-type", "application/json"), ("content-length", str(len(body))),
        ("x-forwarded-proto", "http"), ("x-request-id", f"0b5c9d1e-{request_id:08d}-4e0f-9d3a-5f1c2b7a"),
    ]
    response_headers = [
        (":status", "200"), ("content-type", "application/json"), ("content-length", str(len(COMPLETION))),
        ("date", "Thu, 01 Jan 2026 00:00:00 GMT"), ("server", "Python/3.11 aiohttp/3"),
        ("x-envoy-upstream-service-time", "0"),
    ]
    attributes = struct_pb2.Struct()
    attributes.update({"upstream.address": upstream})
    first = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=_header_map(request_headers)))
    first.protocol_config.request_body_mode = BUFFERED if one_pass or lean else FULL_DUPLEX
    first.protocol_config.response_body_mode = NONE if one_pass or lean else FULL_DUPLEX
    response = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=_header_map(response_headers)))
    response.attributes["envoy.filters.http.ext_proc"].CopyFrom(attributes)
    body_message = pb.ProcessingRequest(response_body=pb.HttpBody(body=COMPLETION))
    body_message.attributes["envoy.filters.http.ext_proc"].CopyFrom(attributes)
    if one_pass or lean:
        buffered = pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
        if lean:
            return [message.SerializeToString() for message in (first, buffered)]
        return [message.SerializeToString() for message in (first, buffered, response)]
    messages = [
        first,
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body)),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=b"", end_of_stream=True)),
        response,
        body_message,
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"", end_of_stream=True)),
    ]
    return [message.SerializeToString() for message in messages]


def access_log_entry(picked: str, outcome: str) -> bytes:
    """The wire bytes of the access-log entry Envoy reports for one skipped request."""
    entry = accesslog_pb2.HTTPAccessLogEntry()
    entry.request.request_headers[names.OUTCOME_HEADER] = outcome
    entry.request.request_headers[names.DESTINATION_HEADER] = picked
    host, _, port = picked.rpartition(":")
    entry.common_properties.upstream_remote_address.CopyFrom(
        address_pb2.Address(socket_address=address_pb2.SocketAddress(address=host, port_value=int(port)))
    )
    entry.common_properties.time_to_first_upstream_rx_byte.FromNanoseconds(2_000_000)
    entry.response.response_code.value = 200
    wire: bytes = entry.SerializeToString()
    return wire


def set_header(response: pb.ProcessingResponse, name: str) -> str:
    """The value a request-body reply sets for header ``name``."""
    for option in response.request_body.response.header_mutation.set_headers:
        if option.header.key == name:
            value: str = option.header.raw_value.decode()
            return value
    raise LookupError(name)


@dataclass
class Replay:
    """One pool of fresh endpoints, the wire messages of 64 requests and what the servicer holds per
    process (metrics and the scheduler's feedback done after the replies, one request-id source),
    shared by both measures."""

    pool: StaticPool
    directory: OnePool
    addresses: list[str]
    rng: random.Random
    clock: MonotonicClock
    wires: list[list[bytes]]
    config: LifecycleConfig
    telemetry: GatewayTelemetry
    metrics: DeferredMetrics
    request_ids: Callable[[], str]

    @staticmethod
    def of(
        size: int, endpoints: int, seed: int, *, one_pass: bool, lean: bool, timing_every: int
    ) -> Replay:
        rng = random.Random(seed)
        telemetry = GatewayTelemetry()
        scheduler = ProfileScheduler(load_profile("default"), timer=telemetry, timing_every=timing_every)
        addresses = [f"127.0.0.1:{20000 + i}" for i in range(endpoints)]
        clock = MonotonicClock()
        pool = StaticPool(POOL, scheduler, fresh_views(addresses, rng, clock.now()))
        bodies = completion_bodies(size, 32)
        wires = [
            envoy_messages(bodies[i % len(bodies)], addresses[i % endpoints], i, one_pass, lean)
            for i in range(64)
        ]
        config = LifecycleConfig(skip_unread_responses=lean, outcome_reports=lean)
        return Replay(pool, OnePool(pool), addresses, rng, clock, wires, config, telemetry,
                      DeferredMetrics(telemetry), RequestIds().next_id)

    def lifecycle(self, index: int) -> RequestLifecycle:
        """Request ``index``'s lifecycle (the endpoints' metrics refreshed every 100 requests)."""
        if index % 100 == 0:
            self.pool.views = fresh_views(self.addresses, self.rng, self.clock.now())
        return RequestLifecycle(self.directory, self.clock, pool_name=POOL, metrics=self.metrics,
                                config=self.config, request_ids=self.request_ids,
                                after_reply=self.metrics.queue)


def replay(
    requests: int, size: int, endpoints: int = 4, seed: int = 3, one_pass: bool = False,
    timing_every: int = 1, lean: bool = False,
) -> tuple[float, int]:
    """Seconds of CPU per request (process time) and the number of responses per request."""
    setup = Replay.of(size, endpoints, seed, one_pass=one_pass, lean=lean, timing_every=timing_every)
    reports = OutcomeReports(setup.directory, clock=setup.clock, metrics=setup.telemetry)
    responses = 0
    started = time.process_time()
    for index in range(requests):
        machine = setup.lifecycle(index)
        for wire in setup.wires[index % len(setup.wires)]:
            event = codec.decode(pb.ProcessingRequest.FromString(wire))
            for response in codec.encode_replies(machine.handle(event)):
                response.SerializeToString()
                responses += 1
            setup.metrics.flush()
        machine.handle(StreamClosed(cancelled=False))
        setup.metrics.flush()
        if lean and machine.decision is not None:
            picked = machine.decision.result.pick.address
            wire = access_log_entry(picked, set_header(response, names.OUTCOME_HEADER))
            reports.apply_entry(accesslog_pb2.HTTPAccessLogEntry.FromString(wire))
    return (time.process_time() - started) / requests, responses // requests


STAGES = (
    "headers: decode", "headers: lifecycle", "headers: encode", "after the headers' reply",
    "body: decode", "body: lifecycle", "body: encode", "after the body's reply", "the stream's end",
)
REQUEST_PATH = "request path"
"""Request headers and the pick, each decoded, handled, encoded and serialised: what Envoy waits for."""


def request_path_stages(
    requests: int, size: int, endpoints: int, cold_mb: int, seed: int = 3
) -> dict[str, float]:
    """Median seconds of each step of ``kvgate up``'s default request path (:data:`STAGES`; decode is
    the protobuf parse and ``codec.decode``, encode ``codec.encode`` and serialisation, "after the
    reply" the queue the servicer flushes once the reply is written) and of the whole
    :data:`REQUEST_PATH`, touching ``cold_mb`` MB between requests (0: warm caches), as Envoy, the
    upstream and the client do at concurrency 1."""
    setup = Replay.of(size, endpoints, seed, one_pass=False, lean=True, timing_every=8)
    junk = bytearray(cold_mb * 1024 * 1024)
    line = bytes(len(junk[::64]))
    times: dict[str, list[float]] = {stage: [] for stage in (*STAGES, REQUEST_PATH)}
    clock = time.perf_counter
    for index in range(requests):
        if cold_mb:
            junk[::64] = line  # one write per cache line: evicts the picker's code and data
        kept = index >= requests // 5
        machine = setup.lifecycle(index)
        path = 0.0
        for wire in setup.wires[index % len(setup.wires)]:
            t0 = clock()
            event = codec.decode(pb.ProcessingRequest.FromString(wire))
            t1 = clock()
            actions = machine.handle(event)
            t2 = clock()
            for response in codec.encode_replies(actions):
                response.SerializeToString()
            t3 = clock()
            setup.metrics.flush()
            t4 = clock()
            part = "headers" if isinstance(event, RequestHeaders) else "body"
            after = "after the headers' reply" if part == "headers" else "after the body's reply"
            if kept:
                times[f"{part}: decode"].append(t1 - t0)
                times[f"{part}: lifecycle"].append(t2 - t1)
                times[f"{part}: encode"].append(t3 - t2)
                times[after].append(t4 - t3)
            path += t3 - t0
        t5 = clock()
        machine.handle(StreamClosed(cancelled=False))
        setup.metrics.flush()
        if kept:
            times["the stream's end"].append(clock() - t5)
            times[REQUEST_PATH].append(path)
    return {stage: statistics.median(found) for stage, found in times.items() if found}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvgate.bench.datapath.offline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--size", type=int, default=1024, help="request body bytes")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the replay")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--one-pass", action="store_true", help="kvgate's one-pass message sequence")
    mode.add_argument("--lean", action="store_true",
                      help="kvgate up's default: one pass, response skipped, outcome reported")
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--cold-mb", type=int, default=0,
                        help="print the request path's median warm and with this many MB touched between "
                             "requests (alternated, 3 rounds), instead of the replay")
    parser.add_argument("--timing-every", type=int, default=8,
                        help="time plugins on 1 request in N (the picker's default: 8)")
    args = parser.parse_args(argv)
    if args.cold_mb:
        rounds: dict[int, list[dict[str, float]]] = {0: [], args.cold_mb: []}
        for _ in range(3):
            for mb in rounds:
                stages = request_path_stages(args.requests, args.size, args.endpoints, mb)
                rounds[mb].append(stages)
                state = "warm" if mb == 0 else f"{mb} MB touched between requests"
                median = stages[REQUEST_PATH] * 1e6
                print(f"request path ({args.size} B body), {state}: median {median:.0f} µs")
        print(f"\nmedian µs per step (median of the rounds) | warm | {args.cold_mb} MB touched")
        for stage in (*STAGES, REQUEST_PATH):
            cells = [statistics.median(r[stage] for r in rounds[mb]) * 1e6 for mb in rounds]
            print(f"{stage} | " + " | ".join(f"{cell:.0f}" for cell in cells))
        return
    replay(200, args.size, args.endpoints, one_pass=args.one_pass, lean=args.lean)  # warm-up
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        replay(args.requests, args.size, args.endpoints, one_pass=args.one_pass, lean=args.lean,
               timing_every=args.timing_every)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        return
    per_request, responses = replay(
        args.requests, args.size, args.endpoints, one_pass=args.one_pass, timing_every=args.timing_every,
        lean=args.lean,
    )
    print(f"{args.size} B body: {per_request * 1e6:.0f} µs CPU per request "
          f"({responses} ext_proc responses each, no gRPC), {1 / per_request:.0f} requests/s per core")


if __name__ == "__main__":
    main()
