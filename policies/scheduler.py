"""``ProfileScheduler``: runs one :class:`SchedulingProfile` and keeps its state up to date.

``schedule`` (pure apart from reading the state): subset hint → filters → admission → weighted
scorers → picker. Admission: when every remaining candidate is saturated, a sheddable request
(priority < 0) gets ``RequestShedError`` (429, ``retry-after``); other requests are never shed and
go to the best-scored (least-loaded) endpoint.

Hot path (docs/architecture.md, principle 7): what depends only on the snapshot's views is computed once
per snapshot tuple (``policies.memo``: filter results, load scores, the cost model's per-endpoint
constants, the candidates' addresses); per request, one pass per scorer adds what changes per
request (prefix matches, this picker's in-flight work, sessions, LoRA), scores are summed by
position (``policies.scoring``) and ``SchedulingResult.scores`` is a view over the sums. Per-plugin
timing runs only with a ``timer``, on every request or on one in ``timing_every``.

Lifecycle (``policies.contracts``): ``on_picked`` counts the request in flight on the pick, records
its session and inserts its prompt blocks into the prefix index; ``on_served`` moves all that to
the endpoint that really served it; ``on_first_token`` drops the request's prefill tokens from the
in-flight work (it stays counted as a request: a replica busy decoding is not queued);
``on_first_token_unseen`` (the data plane will not show the response body: kvgate's one-pass data
path) drops them when the TTFT the profile's scorer estimated for the pick has passed (checked at the
next ``schedule``), or at once when no scorer estimates TTFT (then nothing reads them); ``on_usage``
learns from the ``cached_tokens`` the replica reports; ``on_endpoint_failed`` counts towards ejecting
an endpoint that keeps failing (``policies.outliers``; ejected ones are left out of ``schedule``
unless nothing else remains); ``on_finished`` removes exactly what
``on_picked`` added. The prompt hashes computed in
``schedule`` are kept (bounded LRU by request id, ``max_pending``) until ``on_picked`` so a request
is hashed once; the small rest (predicted matches, the ranked views whose ``num_gpu_blocks`` size
the index) until ``on_finished``.

Learning from ``cached_tokens``: if a replica reports far fewer cached tokens than the index
predicted, it evicts sooner than its ``num_gpu_blocks`` suggests (other traffic, other pickers),
so its index capacity shrinks (×``SHRINK``, floor ``MIN_SCALE``); each confirmed prediction grows
it back (+``GROW``). The blocks of the request itself are not dropped: the replica has just
computed them, so they are cached now.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvgate.policies.contracts import SchedulingResult
from kvgate.policies.errors import NoEligibleEndpointError, RequestShedError
from kvgate.policies.framework import PluginTimer, SchedulingContext, ScoredEndpoints
from kvgate.policies.hashing import PromptHasher
from kvgate.policies.inflight_models import InflightModels
from kvgate.policies.memo import TupleMemo
from kvgate.policies.outliers import OutlierSettings, OutlierTracker
from kvgate.policies.plugins.filters import SubsetHintFilter
from kvgate.policies.profile import SchedulingProfile
from kvgate.policies.scoring import Addresses, BoundScorer, ScoresView, total_scores
from kvgate.policies.state import InProcessState, SchedulerState
from kvgate.policies.types import Endpoint, EndpointView, InferenceRequest, Usage

SHRINK = 0.8
GROW = 0.02
MIN_SCALE = 0.1
MISS_RATIO = 0.5
"""A report counts as a miss when cached tokens < ``MISS_RATIO`` × predicted."""


@dataclass(slots=True)
class _Pending:
    """What ``schedule`` learned that the lifecycle hooks reuse."""

    hashes: tuple[int, ...]
    matches: Mapping[str, int]
    ranked: Sequence[EndpointView]


class ProfileScheduler:
    """Implements ``policies.contracts.Scheduler`` for one profile (one instance per pool)."""

    def __init__(
        self,
        profile: SchedulingProfile,
        *,
        state: SchedulerState | None = None,
        rng: random.Random | None = None,
        timer: PluginTimer | None = None,
        clock: Callable[[], float] = time.perf_counter,
        fallbacks: int | None = None,
        max_pending: int = 4096,
        timing_every: int = 1,
        outliers: OutlierSettings | None = None,
    ) -> None:
        self.profile = profile
        self.state: SchedulerState = state if state is not None else InProcessState()
        self.rng = rng if rng is not None else random.Random()
        self.timer = timer
        self._clock = clock
        self.fallbacks = profile.fallbacks if fallbacks is None else max(0, fallbacks)
        prefix = profile.prefix
        self._hasher = PromptHasher(prefix.block_chars, prefix.max_blocks, prefix.hash_scheme)
        self._tracks_prefix = profile.uses_prefix_index
        self._subset = SubsetHintFilter()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._max_pending = max_pending
        self._capacity_scale: dict[str, float] = {}
        self._prefilling: dict[str, str] = {}  # request id → address, counted with tokens until first token
        self._first_token_due: OrderedDict[str, float] = OrderedDict()  # request id → estimated time
        self._unseen: list[tuple[float, str]] = []  # heap of (due, request id): first tokens not shown
        self._own_models = InflightModels()
        self._own_models_view = self._own_models.by_endpoint()
        self._timing_every = max(1, timing_every)
        self._timing_countdown = 0
        self._scorers = tuple(BoundScorer.of(s) for s in profile.scorers)
        self._addresses: TupleMemo[Addresses] = TupleMemo()
        self.outliers = OutlierTracker(outliers or OutlierSettings())

    # --- scheduling ---------------------------------------------------------------------------

    def schedule(
        self, request: InferenceRequest, candidates: Sequence[EndpointView], now: float
    ) -> SchedulingResult:
        if not candidates:
            raise NoEligibleEndpointError(f"pool {request.pool!r} has no endpoints")
        if self._unseen and self._unseen[0][0] <= now:
            self._end_estimated_prefills(now)
        ctx = self.context(request, now)
        endpoints = self._subset.filter(ctx, candidates)
        if self.outliers.any_ejected(now):  # never empty: with every candidate ejected, all stay
            ejected = self.outliers.ejected
            endpoints = tuple(e for e in endpoints if not ejected(e.address, now)) or endpoints
        timer = self._timer_for_this_request()
        for f in self.profile.filters:
            if timer is None:
                endpoints = f.plugin.filter(ctx, endpoints)
            else:
                start = self._clock()
                endpoints = f.plugin.filter(ctx, endpoints)
                timer.observe("filter", f.plugin_type, f.name, self._clock() - start)
            if not endpoints:
                raise NoEligibleEndpointError(f"no eligible endpoint after filter {f.name!r}")
        if request.sheddable:
            self._admit(endpoints, now)
        addresses = self._addresses.get(endpoints, Addresses)
        totals = total_scores(ctx, endpoints, addresses, self._scorers, timer, self._clock)
        scored = ScoredEndpoints(endpoints, totals)
        picker = self.profile.picker
        if timer is None:
            ranked = picker.plugin.pick(ctx, scored, 1 + self.fallbacks)
        else:
            start = self._clock()
            ranked = picker.plugin.pick(ctx, scored, 1 + self.fallbacks)
            timer.observe("picker", picker.plugin_type, picker.name, self._clock() - start)
        if not ranked:
            raise NoEligibleEndpointError(f"picker {picker.name!r} picked nothing")
        if self._tracks_prefix:
            self._remember(ctx, ranked)
        estimates = ctx.ttft_estimates
        if estimates:
            estimate = estimates.get(ranked[0].endpoint.address)
            if estimate is not None:
                due = self._first_token_due
                due[request.request_id] = now + estimate
                if len(due) > self._max_pending:
                    due.popitem(last=False)
        scores = ScoresView(addresses, totals)
        return SchedulingResult(tuple(e.endpoint for e in ranked), self.profile.name, scores)

    def context(self, request: InferenceRequest, now: float) -> SchedulingContext:
        """What the plugins read while ``request`` is scheduled at ``now`` (``schedule`` builds one;
        tools that ask a scorer directly, e.g. ``bench/replay.py --explain``, use it too)."""
        return SchedulingContext(
            request, now, self.state, self.rng, self._hasher, self._session_id(request),
            self._own_models_view, self._own_models.requests,
        )

    def _timer_for_this_request(self) -> PluginTimer | None:
        """``timer`` on one request in ``timing_every`` (the first one included), else None."""
        if self._timing_every == 1 or self.timer is None:
            return self.timer
        countdown = self._timing_countdown
        self._timing_countdown = countdown - 1 if countdown > 0 else self._timing_every - 1
        return self.timer if countdown == 0 else None

    def _admit(self, endpoints: Sequence[EndpointView], now: float) -> None:
        admission = self.profile.admission
        saturated = admission.thresholds.saturated
        if all(saturated(e, now) for e in endpoints):
            raise RequestShedError(
                "every eligible endpoint is saturated; sheddable request rejected",
                retry_after=admission.retry_after_s,
            )

    def _session_id(self, request: InferenceRequest) -> str | None:
        return request.session_id or request.headers.get(self.profile.session_header) or None

    def _remember(self, ctx: SchedulingContext, ranked: Sequence[EndpointView]) -> None:
        hashes = ctx.prefix_hashes()
        if not hashes:
            return
        pending = self._pending
        pending[ctx.request.request_id] = _Pending(hashes, ctx.prefix_matches(), ranked)
        pending.move_to_end(ctx.request.request_id)
        while len(pending) > self._max_pending:
            pending.popitem(last=False)

    def _capacity_of(self, memo: _Pending | None, address: str) -> int:
        """Index capacity of ``address``: from its view when it was ranked, else the default."""
        for view in memo.ranked if memo is not None else ():
            if view.endpoint.address == address:
                return self._capacity(view)
        return self.profile.prefix.default_capacity_blocks

    def _capacity(self, view: EndpointView) -> int:
        """Index blocks the endpoint's KV cache holds (from ``num_gpu_blocks``), scaled by learning."""
        m = view.metrics
        tokens_per_block = max(1, self.profile.prefix.block_chars // 4)
        if m is not None and m.num_gpu_blocks:
            base = m.num_gpu_blocks * (m.block_size or 16) // tokens_per_block
        else:
            base = self.profile.prefix.default_capacity_blocks
        return max(1, int(base * self._capacity_scale.get(view.address, 1.0)))

    # --- lifecycle ----------------------------------------------------------------------------

    def on_picked(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._count(request, endpoint.address)

    def on_served(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._count(request, endpoint.address)

    def _count(self, request: InferenceRequest, address: str) -> None:
        memo = self._pending.get(request.request_id)
        tokens = request.prompt_tokens_estimate
        if self._tracks_prefix:
            block_tokens = max(1, self.profile.prefix.block_chars // 4)
            if memo is not None:
                tokens = max(0, tokens - memo.matches.get(address, 0) * block_tokens)
                hashes = memo.hashes
                memo.hashes = ()  # inserted now; a fallback (on_served) re-hashes: rare
            else:
                hashes = ()
            if not hashes and request.prompt:
                hashes = self._hasher.hashes(request.target_model, request.prompt, request.cache_salt)
            if hashes:
                self.state.prefix_insert(address, hashes, self._capacity_of(memo, address))
        self.state.inflight_add(request.request_id, address, tokens)
        self._prefilling[request.request_id] = address
        self._own_models.add(request.request_id, address, request.target_model)
        session = self._session_id(request)
        if session is not None:
            self.state.session_set(session, address)

    def on_first_token(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self._first_token_due.pop(request.request_id, None)
        self._prefill_done(request.request_id)

    def _prefill_done(self, request_id: str) -> None:
        address = self._prefilling.pop(request_id, None)
        if address is not None:  # still in flight: keep the request, its prefill is done
            self.state.inflight_add(request_id, address, 0)

    def on_endpoint_failed(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        self.outliers.failed(endpoint.address, now)

    def on_endpoint_outcome(self, address: str, *, ok: bool, now: float) -> None:
        if ok:
            self.outliers.succeeded(address)
        else:
            self.outliers.failed(address, now)

    def on_first_token_unseen(self, request: InferenceRequest, endpoint: Endpoint, now: float) -> None:
        due = self._first_token_due.pop(request.request_id, None)
        if request.request_id not in self._prefilling:
            return
        if due is None or due <= now:
            self._prefill_done(request.request_id)
        else:
            heapq.heappush(self._unseen, (due, request.request_id))

    def _end_estimated_prefills(self, now: float) -> None:
        unseen = self._unseen
        while unseen and unseen[0][0] <= now:
            self._prefill_done(heapq.heappop(unseen)[1])  # finished ones are gone already: no-op

    def on_usage(self, request: InferenceRequest, endpoint: Endpoint, usage: Usage, now: float) -> None:
        memo = self._pending.get(request.request_id)
        if memo is None or usage.cached_tokens is None:
            return
        address = endpoint.address
        predicted = memo.matches.get(address, 0) * max(1, self.profile.prefix.block_chars // 4)
        if predicted <= 0:
            return
        scale = self._capacity_scale.get(address, 1.0)
        if usage.cached_tokens < MISS_RATIO * predicted:
            self._capacity_scale[address] = max(MIN_SCALE, scale * SHRINK)
        elif scale < 1.0:
            self._capacity_scale[address] = min(1.0, scale + GROW)

    def on_finished(self, request: InferenceRequest, endpoint: Endpoint, *, ok: bool, now: float) -> None:
        if ok:
            self.outliers.succeeded(endpoint.address)
        self.state.inflight_remove(request.request_id)
        self._prefilling.pop(request.request_id, None)
        self._first_token_due.pop(request.request_id, None)
        self._own_models.remove(request.request_id)
        self._pending.pop(request.request_id, None)

    # --- pool membership ----------------------------------------------------------------------

    @property
    def inflight_models(self) -> Mapping[str, Mapping[str, int]]:
        """This scheduler's in-flight requests per endpoint and target model (read-only view)."""
        return self._own_models_view

    def forget_endpoint(self, address: str) -> None:
        """Call when an endpoint leaves the pool: drops its state (prefix, in-flight, sessions)."""
        self.state.forget_endpoint(address)
        self.outliers.forget(address)
        self._capacity_scale.pop(address, None)
        self._own_models.forget_endpoint(address)
