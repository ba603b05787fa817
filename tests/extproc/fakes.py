"""Small deterministic stand-ins for the composition root's ports, and ext_proc message builders."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import struct_pb2

from kvgate.extproc import codec
from kvgate.extproc.lifecycle import RequestLifecycle
from kvgate.extproc.lifecycle_config import LifecycleConfig
from kvgate.extproc.ports import HoldingPort, RequestLabels, RequestTrace
from kvgate.policies.contracts import Keep, SchedulingResult
from kvgate.policies.errors import NoEligibleEndpointError, PoolNotFoundError
from kvgate.policies.framework import SchedulingTrace
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest, Role, Usage

FULL_DUPLEX = 4
BUFFERED = 2
STREAMED = 1
NONE = 0


class StepClock:
    """Advances one millisecond per reading: deterministic and strictly increasing."""

    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        self.t += 0.001
        return self.t


@dataclass
class RecordingScheduler:
    """Ranks candidates in the order given; records every call. ``error`` is raised by schedule."""

    error: Exception | None = None
    calls: list[tuple[str, object]] = field(default_factory=list)
    seen: list[tuple[InferenceRequest, tuple[str, ...]]] = field(default_factory=list)
    first_tokens: list[str] = field(default_factory=list)
    unseen_first_tokens: list[str] = field(default_factory=list)
    failed_endpoints: list[str] = field(default_factory=list)
    outcomes: list[tuple[str, bool]] = field(default_factory=list)

    def schedule(
        self, request: InferenceRequest, candidates: Sequence[EndpointView], now: float,
        trace: SchedulingTrace | None = None, keep: Keep | None = None,
    ) -> SchedulingResult:
        subset = request.subset
        if subset is not None:  # (a hard constraint every scheduler applies first)
            candidates = [c for c in candidates if c.address in subset or c.endpoint.host in subset]
            if not candidates:
                raise NoEligibleEndpointError("no endpoint of the pool matches the subset hint")
        if keep is not None:  # (as a profile without filters applies it)
            candidates = keep(candidates) or candidates
        self.seen.append((request, tuple(c.address for c in candidates)))
        if self.error is not None:
            raise self.error
        return SchedulingResult(ranked=tuple(c.endpoint for c in candidates), profile="test")

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self.calls.append(("picked", endpoint.address))

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self.calls.append(("served", endpoint.address))

    def on_first_token(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self.first_tokens.append(endpoint.address)  # kept apart: ``calls`` sequences stay as they were

    def on_endpoint_failed(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self.failed_endpoints.append(endpoint.address)

    def on_endpoint_outcome(self, address: str, *, ok: bool, now: float) -> None:
        self.outcomes.append((address, ok))

    def on_first_token_unseen(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self.unseen_first_tokens.append(endpoint.address)

    def on_usage(self, request: InferenceRequest, endpoint: Endpoint, usage: Usage, now: float) -> None:
        self.calls.append(("usage", usage))

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        self.calls.append(("finished", (endpoint.address, ok)))

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.calls if k == kind)


@dataclass
class FakePool:
    name: str
    addresses: tuple[str, ...]
    scheduler: RecordingScheduler = field(default_factory=RecordingScheduler)
    served_models: frozenset[str] = frozenset()
    """Declared models (with the rewrites' names): any other is unknown (404)."""
    undeclared: bool | None = True
    """``model_known`` of a name when nothing is declared (True: every name is known)."""
    objectives: Mapping[str, int] = field(default_factory=dict)
    rewrites: Mapping[str, str] = field(default_factory=dict)
    extra_paths: frozenset[str] = frozenset()
    picker_runs_prefill: bool = True
    model_server_tls: ssl.SSLContext | None = None
    names_inline_media: bool = False
    honors_model_rewrite_header: bool = False
    roles: Mapping[str, Role] = field(default_factory=dict)
    holding: HoldingPort | None = None
    fallback: FakePool | None = None
    room: bool = True

    def has_room(self) -> bool:
        return self.room

    def model_known(self, model: str) -> bool | None:
        if model in self.served_models or model in self.rewrites or model in self.rewrites.values():
            return True
        return False if self.served_models else self.undeclared

    def endpoints(self) -> tuple[EndpointView, ...]:
        return tuple(EndpointView(Endpoint(a, self.name, role=self.roles.get(a, Role.BOTH)))
                     for a in self.addresses)

    def objective_priority(self, objective: str) -> int | None:
        return self.objectives.get(objective)

    def rewrite_model(self, model: str, headers: Mapping[str, str]) -> str:
        return self.rewrites.get(model, model)

    @property
    def rewrites_models(self) -> bool:
        return bool(self.rewrites)


@dataclass
class FakeDirectory:
    pools: dict[str, FakePool]
    default: str

    def resolve(self, name: str | None) -> FakePool:
        pool = self.pools.get(name or self.default)
        if pool is None:
            raise PoolNotFoundError(f"no pool {name!r}")
        return pool


@dataclass
class RecordingMetrics:
    events: list[tuple[str, object]] = field(default_factory=list)

    def request_picked(self, labels: RequestLabels, body_size: int) -> None:
        self.events.append(("picked", labels))

    def request_error(self, labels: RequestLabels, code: str) -> None:
        self.events.append(("error", code))

    def scheduled(self, pool: str, seconds: float) -> None:
        self.events.append(("scheduled", pool))

    def served_by_fallback(self, labels: RequestLabels) -> None:
        self.events.append(("fallback", labels.pool))

    def first_token(self, labels: RequestLabels, seconds: float) -> None:
        self.events.append(("ttft", seconds))

    def tokens(self, labels: RequestLabels, prompt_tokens: int, completion_tokens: int) -> None:
        self.events.append(("tokens", (prompt_tokens, completion_tokens)))

    def request_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self.events.append(("finished", ok))

    def prefill_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        self.events.append(("prefill", ok))

    def prefix_checked(
        self, labels: RequestLabels, predicted: int, best: int, actual: int, block: int
    ) -> None:
        self.events.append(("prefix", (predicted, best, actual)))

    def spilled(self, pool: str, to_pool: str) -> None:
        self.events.append(("spilled", (pool, to_pool)))

    def slo_checked(self, labels: RequestLabels, objective: str, met: bool) -> None:
        self.events.append(("slo", (objective, met)))


def make_pool(*addresses: str, name: str = "llama", **kwargs: object) -> FakePool:
    return FakePool(name, addresses or ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"), **kwargs)  # type: ignore[arg-type]


def make_machine(
    pool: FakePool, *, metrics: RecordingMetrics | None = None, config: LifecycleConfig | None = None,
    trace: RequestTrace | None = None,
) -> RequestLifecycle:
    directory = FakeDirectory({pool.name: pool}, default=pool.name)
    return RequestLifecycle(directory, StepClock(), metrics=metrics, config=config, trace=trace)


# message builders -------------------------------------------------------------------------------
def _header_map(headers: Iterable[tuple[str, str]]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers])


def _metadata(subset: Sequence[str] | str | None = None, served: str | None = None) -> base_pb2.Metadata:
    meta = base_pb2.Metadata()
    if subset is not None:
        hint = struct_pb2.Struct()
        if isinstance(subset, str):
            hint.fields["x-gateway-destination-endpoint-subset"].string_value = subset
        else:
            hint.fields["x-gateway-destination-endpoint-subset"].list_value.extend(list(subset))
        meta.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    if served is not None:
        lb = struct_pb2.Struct()
        lb.fields["x-gateway-destination-endpoint-served"].string_value = served
        meta.filter_metadata["envoy.lb"].CopyFrom(lb)
    return meta


def request_headers(
    path: str = "/v1/completions",
    *,
    method: str = "POST",
    extra: Sequence[tuple[str, str]] = (),
    eos: bool = False,
    mode: int = FULL_DUPLEX,
    subset: Sequence[str] | str | None = None,
    response_mode: int = FULL_DUPLEX,
) -> pb.ProcessingRequest:
    headers = [(":method", method), (":path", path), (":authority", "gw"), *extra]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=_header_map(headers), end_of_stream=eos),
        metadata_context=_metadata(subset),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=mode, response_body_mode=response_mode),
    )


def request_body(data: bytes, eos: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


def request_trailers() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def response_headers(
    status: int = 200, content_type: str = "application/json", *, eos: bool = False, served: str | None = None
) -> pb.ProcessingRequest:
    headers = [(":status", str(status)), ("content-type", content_type)]
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=_header_map(headers), end_of_stream=eos),
        metadata_context=_metadata(served=served),
    )


def response_body(data: bytes, eos: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


def body_chunks(data: bytes, size: int) -> list[pb.ProcessingRequest]:
    """``data`` split in ``size``-byte messages, then Envoy's usual empty end-of-stream message."""
    chunks = [request_body(data[i : i + size]) for i in range(0, len(data), size)]
    return [*chunks, request_body(b"", eos=True)]


def feed(machine: RequestLifecycle, messages: Iterable[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    out: list[pb.ProcessingResponse] = []
    for message in messages:
        out.extend(codec.encode_replies(machine.handle(codec.decode(message))))
    return out


def completion(model: str = "m", prompt: str = "hello world", **extra: object) -> bytes:
    return json.dumps({"model": model, "prompt": prompt, **extra}).encode()


def set_headers(response: pb.ProcessingResponse) -> dict[str, str]:
    kind = response.WhichOneof("response")
    part = getattr(response, kind)
    mutation = part.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def removed_headers(response: pb.ProcessingResponse) -> list[str]:
    kind = response.WhichOneof("response")
    return list(getattr(response, kind).response.header_mutation.remove_headers)


def streamed(responses: Iterable[pb.ProcessingResponse], kind: str = "request_body") -> bytes:
    return b"".join(
        getattr(r, kind).response.body_mutation.streamed_response.body
        for r in responses
        if r.WhichOneof("response") == kind
    )


def kinds(responses: Iterable[pb.ProcessingResponse]) -> list[str]:
    return [str(r.WhichOneof("response")) for r in responses]
