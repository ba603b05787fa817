"""What the ext_proc service needs from the composition root (``gateway/``).

* :class:`PoolDirectory` resolves the pool a request belongs to (by the ``x-kvgate-pool`` gRPC
  metadata, or the default pool) to a :class:`Pool`: its served models, its live endpoints, its
  scheduler, objective priorities and the model-rewrite hook.
* :class:`Clock` gives monotonic seconds.
* :class:`TenantLimiter` enforces per-tenant request and token limits (checked before scheduling,
  charged with the tokens of the response's usage); ``None`` in ``LifecycleConfig`` = no limits.
* :class:`RequestMetrics` observes requests (gateway/ exports them under GIE's metric names);
  :class:`NoMetrics` is the do-nothing default.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvgate.policies.contracts import Scheduler, SchedulingResult
from kvgate.policies.flow_control import HoldOutcome
from kvgate.policies.framework import SchedulingTrace
from kvgate.policies.holding_queue import Waiting
from kvgate.policies.types import EndpointView, InferenceRequest, Usage


class Pool(Protocol):
    """One InferencePool as the picker sees it. Every method is cheap and does no IO."""

    @property
    def name(self) -> str: ...

    def model_known(self, model: str) -> bool | None:
        """Whether ``model`` is a name this pool serves: True when its configuration (models, the
        routes' model matches, rewrites) or its ready replicas (``/v1/models``, metrics) name it;
        False when the pool declares its models, or every ready replica has said what it serves,
        and none names it (the gateway answers 404); None when that cannot be told (no replica has
        reported yet, or the pool forwards names it does not know)."""
        ...

    @property
    def scheduler(self) -> Scheduler: ...

    def endpoints(self) -> tuple[EndpointView, ...]:
        """The pool's endpoints in the live (latest) snapshot."""
        ...

    def objective_priority(self, objective: str) -> int | None:
        """Priority of the named InferenceObjective of this pool; None when unknown (then 0)."""
        ...

    def rewrite_model(self, model: str, headers: Mapping[str, str]) -> str:
        """The model the replica should serve for a client's ``model`` (identity when none applies)."""
        ...

    @property
    def rewrites_models(self) -> bool:
        """Whether any model rewrite is configured (a response may then need its model renamed)."""
        ...

    @property
    def extra_paths(self) -> frozenset[str]:
        """Paths this pool serves beyond the inference API (``extproc.inference_paths``)."""
        ...

    @property
    def picker_runs_prefill(self) -> bool:
        """A disaggregated request's prefill is run by the picker before it releases the request
        (``extproc.prefill``); False: the data plane's decode-side sidecar runs it, told the prefill
        endpoint in ``x-prefiller-host-port`` (llm-d)."""
        ...

    @property
    def model_server_tls(self) -> ssl.SSLContext | None:
        """The client context for the pool's model servers where they serve HTTPS (the picker's
        own requests to them: a disaggregated request's prefill); None: plain HTTP."""
        ...

    @property
    def names_inline_media(self) -> bool:
        """Give a chat's inline media items the client did not name a digest as vLLM's ``uuid``
        (``openai_request.name_inline_media``; ``kvgate.io/media-uuids``)."""
        ...

    @property
    def honors_model_rewrite_header(self) -> bool:
        """Whether a request may name the model it is served in ``x-gateway-model-name-rewrite``
        (``kvgate.io/model-rewrite-header``; off: such a request is 400)."""
        ...

    @property
    def holding(self) -> HoldingPort | None:
        """The pool's holding area when it has flow control (None: requests are never held)."""
        ...

    @property
    def fallback(self) -> Pool | None:
        """The pool this one's requests spill to while it is full (``kvgate.io/spill-to``), if any."""
        ...

    def has_room(self) -> bool:
        """Whether one of its endpoints has room now (``policies.flow_control``: its flow control's
        thresholds, else the Inference Extension's)."""
        ...


class HoldingPort(Protocol):
    """A pool's holding area (``extproc.holding.HoldingArea``): flow control, issue 34."""

    @property
    def timeout_s(self) -> float:
        """How long a request waits at most."""
        ...

    @property
    def retry_after_s(self) -> float: ...

    def must_wait(self) -> bool:
        """Whether a request arriving now waits (no room, or others wait)."""
        ...

    def with_room(self, endpoints: Sequence[EndpointView], *,
                  reserved: bool = False) -> Sequence[EndpointView]:
        """Those of ``endpoints`` with room now (the pick is made among them); ``reserved``: the
        slots reserved for tenants without a backlog count too."""
        ...

    def may_take_reserved(self, tenant: str, band: int) -> bool:
        """Whether a request of ``tenant``, which has nothing waiting in ``band``, may go now into a
        reserved slot instead of waiting."""
        ...

    def passed(self, request: InferenceRequest) -> None:
        """``request`` goes to an endpoint without waiting (its work counts for fairness)."""
        ...

    def waiting_item(self, request: InferenceRequest, now: float) -> Waiting:
        """``request`` as the queue holds it (band, tenant, cost, deadline)."""
        ...

    def hold(self, item: Waiting) -> bool:
        """Queue ``item``; False when it is shed at once (the queue is full)."""
        ...

    async def outcome(self, request_id: str) -> HoldOutcome:
        """How the held request's wait ends."""
        ...

    def grant_used(self, request_id: str) -> None:
        """The dispatched request was picked (told after the scheduler heard of the pick)."""
        ...

    def leave(self, request_id: str) -> None:
        """The request's stream ended while it was held or dispatched and not yet picked."""
        ...

    def kick(self, *freed: str) -> None:
        """A request of the pool ended (told after the scheduler heard; ``freed``: the endpoints
        it held a place on): look for room now."""
        ...


@dataclass(frozen=True, slots=True)
class TenantKey:
    """The tenant a request is counted against, within its pool."""

    pool: str
    tenant: str


class TenantLimiter(Protocol):
    """Per-tenant limits (requests and tokens per window). Every method is cheap and does no IO."""

    def check(self, pool: str, headers: Mapping[str, str]) -> TenantKey | None:
        """The tenant the request counts against (None: the pool has no limits or names no tenant).

        Raises ``policies.errors.RateLimitedError`` (429 with ``retry-after`` and the
        ``x-ratelimit-*`` headers) when the tenant is over a limit. Counts nothing by itself.
        """
        ...

    def record_request(self, key: TenantKey) -> None:
        """The request was admitted and routed: count it."""
        ...

    def counts_tokens(self, pool: str) -> bool:
        """Whether ``pool`` has a token limit (then its responses' usage must be read)."""
        ...

    def charge_tokens(self, key: TenantKey, tokens: int) -> None:
        """Count the tokens the response's usage reported (prompt + completion)."""
        ...


class PoolDirectory(Protocol):
    def resolve(self, name: str | None) -> Pool:
        """The pool called ``name``, or the default pool when ``name`` is None.

        Raises ``policies.errors.PoolNotFoundError`` (503) when there is no such pool.
        """
        ...


class RequestTrace(SchedulingTrace, Protocol):
    """One traced request (``extproc.tracing``): what its scheduling reports, and its trace id for
    the picker's log lines about it."""

    @property
    def trace_id(self) -> str: ...

    def picked(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """The request as parsed, and its pick."""
        ...

    def served(self, endpoint: str | None, status: int) -> None:
        """The response's headers: the endpoint that served it (a fallback?) and its status."""
        ...

    def refused(self, status: int, code: str) -> None:
        """The picker answered with an error (kvgate's error ``code``)."""
        ...

    def usage(self, usage: Usage) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()


OTHER_MODELS = "__other__"
"""The model label of requests for names the pool does not know (``Pool.model_known`` not True):
clients choose model names, and each name a label would grow the metrics page without bound."""


@dataclass(frozen=True, slots=True)
class RequestLabels:
    """Labels of GIE's per-request metrics (``model`` and ``target_model`` are known names, else
    :data:`OTHER_MODELS`)."""

    pool: str
    model: str
    target_model: str


class RequestMetrics(Protocol):
    def request_picked(self, labels: RequestLabels, body_size: int) -> None:
        """A request was routed (GIE: request_total, request_sizes; running_requests +1)."""
        ...

    def request_error(self, labels: RequestLabels, code: str) -> None:
        """A request got an error reply from the picker (GIE: request_error_total{error_code})."""
        ...

    def scheduled(self, pool: str, seconds: float) -> None:
        """Time one ``Scheduler.schedule`` call took (GIE: scheduler_e2e_duration_seconds)."""
        ...

    def served_by_fallback(self, labels: RequestLabels) -> None:
        """The data plane served a request from a fallback endpoint: its pick failed and was retried
        (kvgate: ``kvgate_fallback_served_total``)."""
        ...

    def first_token(self, labels: RequestLabels, seconds: float) -> None:
        """Time from request headers to the first response body chunk (GIE: request_ttft_seconds)."""
        ...

    def tokens(self, labels: RequestLabels, prompt_tokens: int, completion_tokens: int) -> None:
        """Token usage the replica reported (GIE: input_tokens, output_tokens)."""
        ...

    def request_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        """Once per picked request (GIE: request_duration_seconds; running_requests -1)."""
        ...

    def prefix_checked(
        self, labels: RequestLabels, predicted: int, best: int, actual: int, block: int
    ) -> None:
        """A response's ``cached_tokens`` (``actual``) against the prompt tokens the prefix index
        expected cached on the pick (``predicted``) and on the best endpoint (``best``), the index
        counting in blocks of ``block`` tokens."""
        ...

    def prefill_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        """A disaggregated request's prefill, run by the picker, answered (ok) or failed, and the
        request went on to its decode endpoint (kvgate: ``kvgate_prefill_total{outcome}``,
        ``kvgate_prefill_duration_seconds``)."""
        ...

    def spilled(self, pool: str, to_pool: str) -> None:
        """``pool`` was full and a request went to ``to_pool``, its spill target
        (kvgate: ``kvgate_spilled_requests_total``)."""
        ...

    def slo_checked(self, labels: RequestLabels, objective: str, met: bool) -> None:
        """A request's own latency objective (``objective``: ``ttft`` or ``tpot``, from its
        ``x-slo-*-ms`` header) was met or missed (kvgate: ``kvgate_request_slo_total``)."""
        ...


class NoMetrics:
    def request_picked(self, labels: RequestLabels, body_size: int) -> None:
        pass

    def request_error(self, labels: RequestLabels, code: str) -> None:
        pass

    def scheduled(self, pool: str, seconds: float) -> None:
        pass

    def served_by_fallback(self, labels: RequestLabels) -> None:
        pass

    def first_token(self, labels: RequestLabels, seconds: float) -> None:
        pass

    def tokens(self, labels: RequestLabels, prompt_tokens: int, completion_tokens: int) -> None:
        pass

    def request_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        pass

    def prefill_finished(self, labels: RequestLabels, seconds: float, *, ok: bool) -> None:
        pass

    def spilled(self, pool: str, to_pool: str) -> None:
        pass

    def slo_checked(self, labels: RequestLabels, objective: str, met: bool) -> None:
        pass

    def prefix_checked(
        self, labels: RequestLabels, predicted: int, best: int, actual: int, block: int
    ) -> None:
        pass
