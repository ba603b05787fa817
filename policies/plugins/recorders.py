"""The built-in feedback plugins (``policies.feedback``): what the scheduler records of its picks.

- ``inflight-recorder``: this picker's requests and prefill tokens in flight per endpoint (the
  state's :data:`IN_FLIGHT`), and per endpoint and target model (the context's :data:`OWN_MODELS`).
  A request counts with its uncached prompt tokens until its first token, then as a request only
  (a replica busy decoding is not queued). When the data plane will not show the first token
  (kvgate's one-pass data path), the prefill ends at the TTFT a scorer estimated for the pick, if
  one did (:data:`TTFT_ESTIMATES`, checked when the next request is scheduled), else at once.
- ``prefix-index-recorder``: the pick's prompt blocks into the state's :data:`PREFIX_INDEX`, each
  endpoint's index capacity from its ``num_gpu_blocks``, and that capacity learnt from the
  ``cached_tokens`` replicas report: a replica that reports far fewer than predicted evicts sooner
  than its cache size suggests (other traffic, other pickers), so its capacity shrinks (×``SHRINK``,
  floor ``MIN_SCALE``); each confirmed prediction grows it back (+``GROW``). The request's own
  blocks are not dropped: the replica has just computed them.
- ``session-recorder``: a request's session pinned to the endpoint that took it (:data:`SESSIONS`).
- ``outlier-ejection``: endpoints that keep failing requests are left out of picking for a while
  (``policies.outliers``; an :class:`~policies.feedback.EndpointGate`).

The prompt hashes a scorer computed while scheduling are reused (a request is hashed once): each
recorder keeps what it needs from the context until the request finishes (bounded by
``max_pending``, oldest dropped first).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.policies.feedback import (
    IN_FLIGHT,
    OWN_MODELS,
    PREFIX_INDEX,
    SESSIONS,
    FeedbackEnv,
    FeedbackPlugin,
)
from kvgate.policies.framework import SchedulingContext
from kvgate.policies.inflight_models import InflightModels
from kvgate.policies.outliers import OutlierSettings, OutlierTracker
from kvgate.policies.plugins.params import Params, parse_params
from kvgate.policies.plugins.stored_responses import StoredResponseRecorder
from kvgate.policies.pool_views import SubsetViews
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest, Usage

SHRINK = 0.8
GROW = 0.02
MIN_SCALE = 0.1
MISS_RATIO = 0.5
"""A usage report counts as a miss when cached tokens < ``MISS_RATIO`` × predicted."""


def _remember(memo: OrderedDict[str, Any], key: str, value: object, bound: int) -> None:
    memo[key] = value
    memo.move_to_end(key)
    while len(memo) > bound:
        memo.popitem(last=False)


class InflightRecorder(FeedbackPlugin):
    produces = frozenset({IN_FLIGHT, OWN_MODELS})

    def __init__(self, env: FeedbackEnv) -> None:
        self._env = env
        self._state = env.state
        self._tokens_per_block = max(1, env.hasher.block_chars // 4)
        self._matches: OrderedDict[str, Mapping[str, int]] = OrderedDict()
        self._prefilling: dict[str, str] = {}  # request id → address, counted with tokens until first token
        self._first_token_due: OrderedDict[str, float] = OrderedDict()  # request id → estimated time
        self._unseen: list[tuple[float, str]] = []  # heap of (due, request id): first tokens not shown
        self.models = InflightModels()
        self._models_view = self.models.by_endpoint()

    @property
    def models_view(self) -> Mapping[str, Mapping[str, int]]:
        return self._models_view

    def prepare(self, ctx: SchedulingContext) -> None:
        if self._unseen and self._unseen[0][0] <= ctx.now:
            self._end_estimated_prefills(ctx.now)
        ctx.own_models = self._models_view
        ctx.own_requests = self.models.requests

    def on_scheduled(self, ctx: SchedulingContext, ranked: Sequence[EndpointView]) -> None:
        request_id = ctx.request.request_id
        matches = ctx.known_prefix_matches()
        if matches:
            _remember(self._matches, request_id, matches, self._env.max_pending)
        estimates = ctx.ttft_estimates
        if estimates:
            estimate = estimates.get(ranked[0].endpoint.address)
            if estimate is not None:
                _remember(self._first_token_due, request_id, ctx.now + estimate, self._env.max_pending)

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._count(request, endpoint.address)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._count(request, endpoint.address)

    def _count(self, request: InferenceRequest, address: str) -> None:
        tokens = 0 if request.prefilled_elsewhere else request.prompt_tokens_estimate
        matches = self._matches.get(request.request_id)
        if matches is not None and tokens:  # (the prompt at least as long as held: ctx.prompt_tokens)
            tokens = max(tokens, max(matches.values(), default=0) * self._tokens_per_block)
            tokens = max(0, tokens - matches.get(address, 0) * self._tokens_per_block)
        self._state.inflight_add(request.request_id, address, tokens)
        self._prefilling[request.request_id] = address
        self.models.add(request.request_id, address, request.target_model)

    def on_first_token(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._first_token_due.pop(request.request_id, None)
        self._prefill_done(request.request_id)

    def on_first_token_unseen(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        due = self._first_token_due.pop(request.request_id, None)
        if request.request_id not in self._prefilling:
            return
        if due is None or due <= now:
            self._prefill_done(request.request_id)
        else:
            heapq.heappush(self._unseen, (due, request.request_id))

    def _prefill_done(self, request_id: str) -> None:
        address = self._prefilling.pop(request_id, None)
        if address is not None:  # still in flight: keep the request, its prefill is done
            self._state.inflight_add(request_id, address, 0)

    def _end_estimated_prefills(self, now: float) -> None:
        unseen = self._unseen
        while unseen and unseen[0][0] <= now:
            self._prefill_done(heapq.heappop(unseen)[1])  # finished ones are gone already: no-op

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        request_id = request.request_id
        self._state.inflight_remove(request_id)
        self._prefilling.pop(request_id, None)
        self._first_token_due.pop(request_id, None)
        self._matches.pop(request_id, None)
        self.models.remove(request_id)

    def forget_endpoint(self, address: str) -> None:
        self.models.forget_endpoint(address)


@dataclass(slots=True)
class _Scheduled:
    """What the prefix recorder keeps of a scheduled request until it finishes."""

    hashes: tuple[int, ...]
    matches: Mapping[str, int]
    ranked: Sequence[EndpointView]


class PrefixIndexRecorder(FeedbackPlugin):
    produces = frozenset({PREFIX_INDEX})

    def __init__(self, env: FeedbackEnv) -> None:
        self._env = env
        self._tokens_per_block = max(1, env.hasher.block_chars // 4)
        self._scheduled: OrderedDict[str, _Scheduled] = OrderedDict()
        self._capacity_scale: dict[str, float] = {}

    def on_scheduled(self, ctx: SchedulingContext, ranked: Sequence[EndpointView]) -> None:
        hashes = ctx.prefix_hashes()
        if hashes:
            memo = _Scheduled(hashes, ctx.prefix_matches(), ranked)
            _remember(self._scheduled, ctx.request.request_id, memo, self._env.max_pending)

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._insert(request, endpoint.address)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._insert(request, endpoint.address)

    def _insert(self, request: InferenceRequest, address: str) -> None:
        memo = self._scheduled.get(request.request_id)
        hashes: tuple[int, ...] = ()
        if memo is not None:
            hashes = memo.hashes
            memo.hashes = ()  # inserted now; a fallback (on_served) hashes again: rare
        if not hashes and request.prompt:
            hashes = self._env.hasher.hashes(request.target_model, request.prompt, request.cache_salt)
        if hashes:
            self._env.state.prefix_insert(address, hashes, self._capacity_of(memo, address))

    def _capacity_of(self, memo: _Scheduled | None, address: str) -> int:
        """Index capacity of ``address``: from its view when it was ranked, else the default."""
        for view in memo.ranked if memo is not None else ():
            if view.endpoint.address == address:
                return self.capacity(view)
        return self._env.default_capacity_blocks

    def capacity(self, view: EndpointView) -> int:
        """Index blocks the endpoint's KV cache holds (from ``num_gpu_blocks``), scaled by learning."""
        m = view.metrics
        if m is not None and m.num_gpu_blocks:
            base = m.num_gpu_blocks * (m.block_size or 16) // self._tokens_per_block
        else:
            base = self._env.default_capacity_blocks
        return max(1, int(base * self._capacity_scale.get(view.address, 1.0)))

    def on_usage(self, request: InferenceRequest, endpoint: Endpoint, usage: Usage, now: float) -> None:
        memo = self._scheduled.get(request.request_id)
        if memo is None or usage.cached_tokens is None:
            return
        address = endpoint.address
        predicted = memo.matches.get(address, 0) * self._tokens_per_block
        if predicted <= 0:
            return
        scale = self._capacity_scale.get(address, 1.0)
        if usage.cached_tokens < MISS_RATIO * predicted:
            self._capacity_scale[address] = max(MIN_SCALE, scale * SHRINK)
        elif scale < 1.0:
            self._capacity_scale[address] = min(1.0, scale + GROW)

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        self._scheduled.pop(request.request_id, None)

    def forget_endpoint(self, address: str) -> None:
        self._capacity_scale.pop(address, None)


class SessionRecorder(FeedbackPlugin):
    produces = frozenset({SESSIONS})

    def __init__(self, env: FeedbackEnv) -> None:
        self._env = env

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._pin(request, endpoint.address)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._pin(request, endpoint.address)

    def _pin(self, request: InferenceRequest, address: str) -> None:
        session = self._env.session_id(request)
        if session is not None:
            self._env.state.session_set(session, address)


class OutlierEjection(FeedbackPlugin):
    """Counts failures and successes per endpoint and keeps ejected ones out of picking."""

    def __init__(self, settings: OutlierSettings) -> None:
        self.tracker = OutlierTracker(settings)
        self._gated_by: frozenset[str] | None = None
        self._kept = SubsetViews(lambda view: True)

    def gate(self, endpoints: Sequence[EndpointView], now: float) -> Sequence[EndpointView]:
        tracker = self.tracker
        if not tracker.any_ejected(now):
            return endpoints
        ejected = tracker.ejected_at(now)
        if ejected is not self._gated_by:  # kept per snapshot while the ejected stay the same: a new
            # tuple per pick rebuilt every per-snapshot structure downstream (O(pool) per pick)
            self._gated_by = ejected
            self._kept = SubsetViews(lambda view: view.address not in ejected)
        return self._kept.of(endpoints) or endpoints  # never empty: with every one ejected, all stay

    def on_endpoint_failed(self, address: str, now: float) -> None:
        self.tracker.failed(address, now)

    def on_endpoint_ok(self, address: str, now: float) -> None:
        self.tracker.succeeded(address)

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        if ok:
            self.tracker.succeeded(endpoint.address)

    def forget_endpoint(self, address: str) -> None:
        self.tracker.forget(address)


# --- blueprints: the YAML side ----------------------------------------------------------------


RecorderType = (type[InflightRecorder] | type[PrefixIndexRecorder] | type[SessionRecorder]
                | type[StoredResponseRecorder])


@dataclass(frozen=True, slots=True)
class Recorder:
    """A blueprint of a recorder that takes no parameters (``FeedbackBlueprint``)."""

    plugin: RecorderType
    produces: frozenset[str] = field(init=False)
    consumes: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "produces", self.plugin.produces)
        object.__setattr__(self, "consumes", self.plugin.consumes)

    def create(self, env: FeedbackEnv) -> FeedbackPlugin:
        return self.plugin(env)


class OutlierParams(Params):
    consecutive: int = 5
    base_ejection_s: float = 5.0
    max_ejection_s: float = 60.0


def default_blueprints() -> dict[str, Recorder | OutlierEjectionBlueprint]:
    """The built-in feedback plugins, by type, with their default parameters (what a profile that
    lists no feedback gets, whatever registry built its other plugins)."""
    return {
        "inflight-recorder": Recorder(InflightRecorder),
        "prefix-index-recorder": Recorder(PrefixIndexRecorder),
        "session-recorder": Recorder(SessionRecorder),
        "stored-response-recorder": Recorder(StoredResponseRecorder),
        "outlier-ejection": OutlierEjectionBlueprint(),
    }


@dataclass(frozen=True, slots=True)
class OutlierEjectionBlueprint:
    settings: OutlierSettings = field(default_factory=OutlierSettings)
    produces: frozenset[str] = frozenset()
    consumes: frozenset[str] = frozenset()

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any] | None) -> OutlierEjectionBlueprint:
        p = parse_params(OutlierParams, parameters, "outlier-ejection")
        return OutlierEjectionBlueprint(OutlierSettings(p.consecutive, p.base_ejection_s, p.max_ejection_s))

    def create(self, env: FeedbackEnv) -> FeedbackPlugin:
        return OutlierEjection(env.outliers or self.settings)
